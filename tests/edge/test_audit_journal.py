"""A crash loses no audit row and leaves none unfinished (issue 39 item 5): the trail's journal.

The crash is real: a process running a trail over a SQLite file kills itself with SIGKILL
(no `finally`, no flush), having answered some requests and holding others. The next
trail on the same file and journal folder writes every row and closes the unfinished
ones as failed ("gateway restarted"). A live gateway's journal is never taken; the
journal stays small; a shutdown that could not write leaves its rows for the next start.
The same through real gateway processes: tests/edge/e2e/test_e2e_audit_crash.py (slow).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import trio

import edge.audit.trail as trail_module
from edge.admission.rate_limit import ClientKeys
from edge.audit.ids import ExecutionIds
from edge.audit.journal import SUFFIX, journal_directory
from edge.audit.rows import RESTARTED
from edge.audit.store import SqliteAuditStore
from edge.audit.trail import AuditTrail
from shared.contract import Code
from shared.settings import RateLimitSettings
from tests.edge.test_audit import REPO, arrive
from tests.edge.test_audit_conflicts import finish, table


def journaled(store: SqliteAuditStore, journals: Path) -> AuditTrail:
    return AuditTrail(ExecutionIds(0), store, ClientKeys(RateLimitSettings()), reader=store, journal_dir=journals)


# 20 executions written in their first state, 30 more in memory only; 35 of the 50 answered.
KILLED = textwrap.dedent(
    """
    import json, os, signal, sys, trio
    sys.path.insert(0, {repo!r})
    from pathlib import Path
    from edge.audit.store import SqliteAuditStore
    from shared.contract import Code
    from tests.edge.test_audit import arrive
    from tests.edge.test_audit_journal import journaled
    from tests.edge.test_audit_conflicts import finish

    async def main():
        trail = journaled(SqliteAuditStore({path!r}), Path({journals!r}))
        async with trio.open_nursery() as nursery:
            await nursery.start(trail.run)
            early = arrive(trail, 20)
            assert await trail.flush()  # in the store as 'received'
            late = arrive(trail, 30)
            finish(trail, early[:10] + late[:25], Code.OK)
            print(json.dumps({{"answered": early[:10] + late[:25], "held": early[10:] + late[25:]}}), flush=True)
            os.kill(os.getpid(), signal.SIGKILL)  # before the writer's next batch
    trio.run(main)
    """
)


async def test_a_killed_gateways_rows_are_written_and_its_unfinished_ones_closed_at_the_next_start(
    tmp_path: Path,
) -> None:
    path, journals = tmp_path / "audit.sqlite3", tmp_path / "audit.journals"
    script = KILLED.format(repo=str(REPO), path=str(path), journals=str(journals))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == -signal.SIGKILL, done.stderr
    ids = json.loads(done.stdout)
    before = table(SqliteAuditStore(path))
    assert len(before) == 20 and {row["status"] for row in before.values()} == {"received"}, "what the crash left"

    restarted = journaled(SqliteAuditStore(path), journals)
    async with trio.open_nursery() as nursery:
        await nursery.start(restarted.run)  # adopts the dead journal before it is started
        assert restarted.pending == 50
        assert await restarted.flush()
        nursery.cancel_scope.cancel()
    rows = table(SqliteAuditStore(path))
    assert set(rows) == set(ids["answered"]) | set(ids["held"]), "no row lost"
    answered = {(rows[i]["status"], rows[i]["code"], rows[i]["reason"]) for i in ids["answered"]}
    assert answered == {("completed", Code.OK, None)}
    held = {(rows[i]["status"], rows[i]["code"], rows[i]["reason"]) for i in ids["held"]}
    assert held == {("failed", None, RESTARTED)}, "closed, not left in 'received' for good"
    assert {row["node"] for row in rows.values()} != {restarted.node}, "still the dead gateway's rows"
    assert list(journals.iterdir()) == [], "the dead journal adopted, and the new one gone at a clean stop"


async def test_a_live_gateways_journal_is_never_adopted(tmp_path: Path) -> None:
    journals = tmp_path / "audit.journals"
    running = journaled(SqliteAuditStore(tmp_path / "a.sqlite3"), journals)
    assert running.open_journal() == []
    under_way = arrive(running, 5)
    starting = journaled(SqliteAuditStore(tmp_path / "a.sqlite3"), journals)
    assert starting.open_journal() == [], "the lock says the first gateway is alive"
    assert {path.name for path in journals.iterdir()} == {f"{running.node}{SUFFIX}", f"{starting.node}{SUFFIX}"}
    assert running.pending == len(under_way) == 5 and starting.pending == 0, "nothing closed under the first"
    for trail in (running, starting):
        assert trail.journal is not None
        trail.journal.close(keep=False)


async def test_the_journal_keeps_only_what_the_store_may_lack(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(trail_module, "JOURNAL_REWRITE_BYTES", 1)  # rewritten after every flush
    trail = journaled(SqliteAuditStore(tmp_path / "a.sqlite3"), tmp_path / "j")
    trail.open_journal()
    assert trail.journal is not None
    done, under_way = arrive(trail, 40), arrive(trail, 3)
    finish(trail, done, Code.OK)
    grown = trail.journal.size_bytes
    assert await trail.flush()
    lines = trail.journal.path.read_bytes().splitlines()
    assert [json.loads(line)[0] for line in lines] == under_way, "only the executions still under way"
    assert trail.journal.size_bytes == sum(len(line) + 1 for line in lines) < grown / 10


async def test_rows_a_shutdown_could_not_write_are_left_in_the_journal_for_the_next_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(trail_module, "SHUTDOWN_FLUSH_SECONDS", 0.5)
    journals = tmp_path / "j"
    refusing = journaled(SqliteAuditStore(tmp_path), journals)  # a directory: every write is refused
    async with trio.open_nursery() as nursery:
        await nursery.start(refusing.run)
        ids = arrive(refusing, 3)
        finish(refusing, ids, Code.OK)
        nursery.cancel_scope.cancel()  # a SIGTERM with the store down
    assert refusing.writes["dropped"] == 0 and len(list(journals.iterdir())) == 1, "kept, not dropped"
    store = SqliteAuditStore(tmp_path / "back.sqlite3")
    restarted = journaled(store, journals)
    async with trio.open_nursery() as nursery:
        await nursery.start(restarted.run)
        assert await restarted.flush()
        nursery.cancel_scope.cancel()
    assert {i: row["status"] for i, row in table(store).items()} == dict.fromkeys(ids, "completed")


def test_each_store_has_its_own_journal_folder_named_without_a_secret() -> None:
    sqlite = journal_directory("var/audit.sqlite3")
    assert sqlite == Path("var/audit.sqlite3.journals") != journal_directory("var/other.sqlite3")
    first = journal_directory("var/audit.sqlite3", "postgresql://hairgate:hunter2@10.0.0.7:5432/hairgate")
    same = journal_directory("var/audit.sqlite3", "host=10.0.0.7 port=5432 dbname=hairgate user=hairgate password=x")
    other = journal_directory("var/audit.sqlite3", "postgresql://hairgate:hunter2@10.0.0.7:5432/staging")
    assert first == same != other and first.parent == Path("var") and "hunter2" not in str(first)


def test_a_journal_left_by_a_gateway_of_before_the_error_type_column_is_adopted(tmp_path: Path) -> None:
    from edge.audit.journal import Journal, encode
    from edge.audit.rows import Execution

    journals = tmp_path / "audit.journals"
    journals.mkdir()
    finished = Execution("exec_1", "r1", "/api/v1/hair/measure", None, "127.0.0.1", None, 1.0, 2.0, "completed", 0)
    older = json.loads(encode(finished))[:-1]  # its snapshot without error_type, the last field
    (journals / f"dead{SUFFIX}").write_text(json.dumps(older) + "\n")
    journal = Journal.create(journals, "live")
    try:
        (adopted,) = journal.adopt_dead(lambda execution: None)
    finally:
        journal.close(keep=False)
    assert (adopted.execution_id, adopted.status, adopted.code, adopted.error_type) == ("exec_1", "completed", 0, None)
