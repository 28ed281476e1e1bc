"""Gateways sharing one audit store (issue 39 item 4): no shared execution id, no merged row.

Two trails stand for two gateways with the same settings (the default `gateway_id`, one
clock); each has its own store connection, as two processes would. On SQLite, and on
PostgreSQL when tests/postgres.py can run its throw-away cluster.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from prometheus_client import CollectorRegistry, generate_latest

from edge.admission.rate_limit import ClientKeys
from edge.audit.ids import ExecutionIds
from edge.audit.rows import COLUMNS
from edge.audit.store import AuditStore, PostgresAuditStore, SqliteAuditStore
from edge.audit.trail import AuditTrail
from edge.observe.request_log import RequestRecord
from shared.contract import Code
from shared.settings import RateLimitSettings
from tests.edge.test_audit import MEASURE, arrive

SAME_MILLISECOND_NS = 1723456789012_000_000


@pytest.fixture(params=["sqlite", "postgresql"])
def open_store(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[], AuditStore]:
    """A new connection to one shared store, per gateway."""
    if request.param == "sqlite":
        return lambda: SqliteAuditStore(tmp_path / "shared.sqlite3")
    dsn: str = request.getfixturevalue("postgres_dsn")
    return lambda: PostgresAuditStore(dsn)


def gateway(store: AuditStore, ids: ExecutionIds) -> AuditTrail:
    return AuditTrail(ids, store, ClientKeys(RateLimitSettings()), reader=store)


def finish(trail: AuditTrail, ids: list[str], code: int) -> None:
    record = RequestRecord(
        ts="", request_id="r", method="POST", path=MEASURE, client_ip="127.0.0.1", worker=None, attempts=1,
        queue_ms=1.0, duration_ms=5.0, http_status=200, code=code, bytes_in=10, bytes_out=20,
    )  # fmt: skip
    for execution_id in ids:
        trail.finished(execution_id, record)


def table(store: AuditStore) -> dict[str, dict[str, Any]]:
    found = store.query(f"SELECT {', '.join(COLUMNS)} FROM audit_log", ())
    return {values[0]: dict(zip(COLUMNS, values, strict=True)) for values in found}


async def test_two_gateways_with_the_same_settings_on_one_store_share_no_id_and_merge_no_row(
    open_store: Callable[[], AuditStore],
) -> None:
    def clock() -> int:  # both in the same millisecond: the ids of before were equal, one for one
        return SAME_MILLISECOND_NS

    first, second = (gateway(open_store(), ExecutionIds(0, clock_ns=clock)) for _ in range(2))
    ids = arrive(first, 300), arrive(second, 300)
    finish(first, ids[0], Code.OK)
    finish(second, ids[1], Code.SYSTEM_ERROR)  # merged into the first's rows, these would fail them
    async with trio.open_nursery() as nursery:
        nursery.start_soon(first.flush)
        nursery.start_soon(second.flush)
    assert not set(ids[0]) & set(ids[1]), "no id issued by both"
    rows = table(first.reader)  # type: ignore[arg-type]
    assert len(rows) == 600
    assert {rows[i]["status"] for i in ids[0]} == {"completed"} and {rows[i]["node"] for i in ids[0]} == {first.node}
    assert {rows[i]["status"] for i in ids[1]} == {"failed"} and {rows[i]["node"] for i in ids[1]} == {second.node}
    assert first.writes["conflict"] == second.writes["conflict"] == 0


class Forced(ExecutionIds):
    """A gateway whose next ids are given (another gateway's, say), then its own: what a
    collision of two gateways' ids would look like from either side."""

    def __init__(self, given: list[str]) -> None:
        super().__init__(0)
        self._given: Iterator[str] = iter(given)

    def next(self) -> str:
        return next(self._given, None) or super().next()


async def test_an_execution_id_another_gateway_holds_is_refused_logged_and_counted(
    open_store: Callable[[], AuditStore], caplog: pytest.LogCaptureFixture
) -> None:
    owner = gateway(open_store(), ExecutionIds(0))
    taken = arrive(owner, 3)
    assert await owner.flush()
    intruder = gateway(open_store(), Forced(taken))
    mine = arrive(intruder, 4)  # the owner's 3 ids, then one of its own
    finish(intruder, mine[:3], Code.SYSTEM_ERROR)
    with caplog.at_level(logging.ERROR, logger="edge.audit"):
        assert await intruder.flush()
    assert intruder.writes["written"] == 1 and intruder.writes["conflict"] == 3
    (logged,) = [record for record in caplog.records if taken[0] in record.getMessage()]
    assert logged.levelno == logging.ERROR
    registry = CollectorRegistry()
    registry.register(intruder)
    assert 'hairgate_audit_writes_total{result="conflict"} 3.0' in generate_latest(registry).decode()

    finish(intruder, mine[3:], Code.OK)
    assert intruder.pending == 1, "a refused execution is never written again, only its own is"
    assert await intruder.flush() and intruder.writes["conflict"] == 3
    rows = table(owner.reader)  # type: ignore[arg-type]
    assert [rows[i]["status"] for i in taken] == ["received"] * 3, "the owner's rows untouched"
    assert rows[mine[3]]["status"] == "completed" and rows[mine[3]]["node"] == intruder.node
    finish(owner, taken, Code.OK)
    assert await owner.flush() and owner.writes["conflict"] == 0
    assert [table(owner.reader)[i]["status"] for i in taken] == ["completed"] * 3, "and still the owner's"  # type: ignore[arg-type]
