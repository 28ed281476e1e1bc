"""The audit trail in one process, on SQLite: execution ids, the rows a request leaves, the writer's rules.

The gateway runs behind httpx's ASGI transport with the fake `Upstream` of test_api; the
rows are read back from the real SQLite file. PostgreSQL: test_audit_postgres.py.
"""

from __future__ import annotations

import hashlib
import json
import re
import sqlite3
import subprocess
import sys
import textwrap
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
import trio.testing
from prometheus_client import generate_latest

import edge.audit.store as store_module
import edge.audit.trail as trail_module
from edge.admission.idempotency import open_idempotency
from edge.admission.rate_limit import ClientKeys, header_key
from edge.app import create_app
from edge.audit.ids import ExecutionIds
from edge.audit.rows import COLUMNS
from edge.audit.store import SqliteAuditStore
from edge.audit.trail import AuditTrail, key_hash
from edge.gateway import Gateway, build_gateway
from shared.contract import HEADER_EXECUTION_ID, Code
from shared.settings import RateLimitSettings, SettingsError, load_settings
from tests.edge.conftest import PHOTO, TOKEN, WORKERS, bring_online, make_settings
from tests.edge.test_api import FakeUpstream

MEASURE = "/api/v1/hair/measure"
EXECUTION_ID = re.compile(r"exec_\d{13}_\d{3}_[0-9a-f]{12}_\d{5}")
REPO = Path(__file__).resolve().parents[2]


def rows_of(gateway: Gateway) -> dict[str, dict[str, Any]]:
    """Every row of the gateway's SQLite file, by execution id."""
    assert gateway.audit.reader is not None
    store = gateway.audit.reader
    found = store.query(f"SELECT {', '.join(COLUMNS)} FROM audit_log ORDER BY id", ())
    return {values[0]: dict(zip(COLUMNS, values, strict=True)) for values in found}


async def build(tmp_path: Path, upstream: FakeUpstream, **edge: Any) -> tuple[Gateway, httpx.AsyncClient]:
    settings = make_settings(tmp_path, pool={"workers": WORKERS[:2], "primary_workers": []}, **edge)
    idempotency = await open_idempotency(settings.edge.idempotency, None) if settings.edge.idempotency.enabled else None
    gateway = build_gateway(settings, upstream=upstream, idempotency=idempotency)  # type: ignore[arg-type]
    bring_online(gateway, 0, 1)
    transport = httpx.ASGITransport(app=create_app(gateway), client=("203.0.113.7", 5555))
    return gateway, httpx.AsyncClient(transport=transport, base_url="http://gateway.test")


# --- execution ids -----------------------------------------------------------------------------


def test_execution_ids_are_spec_shaped_unique_and_sortable() -> None:
    now = [1723456789012_000_000]
    ids = ExecutionIds(1, clock_ns=lambda: now[0], node="00c0ffee0001")
    first, second = ids.next(), ids.next()
    assert (first, second) == ("exec_1723456789012_001_00c0ffee0001_00000", "exec_1723456789012_001_00c0ffee0001_00001")
    now[0] += 1_000_000
    assert ids.next() == "exec_1723456789013_001_00c0ffee0001_00000", "the sequence starts again each millisecond"
    now[0] -= 5_000_000  # the clock stepped back: never an id twice
    assert ids.next() == "exec_1723456789013_001_00c0ffee0001_00001"
    many = [ids.next() for _ in range(100_001)]
    assert len(set(many)) == len(many) and many == sorted(many), "past 99,999 in one ms it borrows the next ms"
    assert ExecutionIds(2, clock_ns=lambda: now[0]).next().split("_")[2] == "002"
    assert len(first) <= 64, "the execution_id column is VARCHAR(64)"
    for wrong in ({"gateway_id": 1000}, {"gateway_id": 1, "node": "C0FFEE"}):
        with pytest.raises(ValueError):
            ExecutionIds(**wrong)  # type: ignore[arg-type]


def test_two_gateways_with_the_same_settings_issue_different_ids_in_the_same_millisecond() -> None:
    # issue 39 item 4: both at the default gateway_id 0, one clock: the old ids were equal
    def clock() -> int:
        return 1723456789012_000_000

    first, second = ExecutionIds(0, clock_ns=clock), ExecutionIds(0, clock_ns=clock)
    ids = [first.next() for _ in range(1000)], [second.next() for _ in range(1000)]
    assert not set(ids[0]) & set(ids[1])
    assert first.node != second.node and all(EXECUTION_ID.fullmatch(i) for i in ids[0] + ids[1])


# --- the rows a request leaves ---------------------------------------------------------------------


async def test_a_forwarded_request_leaves_one_complete_row(tmp_path: Path) -> None:
    upstream = FakeUpstream()
    audit = {"path": str(tmp_path / "a.sqlite3"), "gpu_second_usd": 2.0}
    gateway, client = await build(tmp_path, upstream, audit=audit)
    response = await client.post(MEASURE, json=PHOTO, headers={"X-Request-ID": "r-1"})
    execution_id = response.headers[HEADER_EXECUTION_ID]
    assert EXECUTION_ID.fullmatch(execution_id)
    ((_, forwarded),) = upstream.forwards
    assert forwarded.execution_id == execution_id, "the host is told the same id"
    assert gateway.audit.pending == 1 and not (tmp_path / "a.sqlite3").exists(), "the request's path did no I/O"
    assert await gateway.audit.flush()
    row = rows_of(gateway)[execution_id]
    assert {k: row[k] for k in ("request_id", "endpoint", "client_ip", "status", "code", "worker", "retry_count")} == {
        "request_id": "r-1", "endpoint": MEASURE, "client_ip": "203.0.113.7", "status": "completed",
        "code": 0, "worker": row["worker"], "retry_count": 0,
    }  # fmt: skip
    assert row["worker"] in (0, 1) and row["replayed"] == 0 and row["idempotency_key"] is None
    filled = ("queue_ms", "gpu_ms", "duration_ms", "cost_usd", "created_at", "updated_at")
    assert all(row[k] is not None for k in filled)
    assert row["cost_usd"] == pytest.approx(row["gpu_ms"] * 2.0 / 1000)
    assert row["duration_ms"] >= row["gpu_ms"]
    scraped = generate_latest(gateway.metrics.registry).decode()  # what /metrics serves
    assert 'hairgate_audit_writes_total{result="written"} 1.0' in scraped and "hairgate_audit_pending 0.0" in scraped


async def test_refusals_and_retries_have_ids_and_rows(tmp_path: Path) -> None:
    upstream = FakeUpstream()
    upstream.behaviour[WORKERS[0]] = "http500"
    gateway, client = await build(tmp_path, upstream)
    unknown = await client.post("/api/v1/nothing-here", json={})
    bad_body = await client.post(MEASURE, content=b"not json", headers={"Content-Type": "application/json"})
    retried = [await client.post(MEASURE, json=PHOTO) for _ in range(2)]
    answers = [unknown, bad_body, *retried]
    ids = [answer.headers[HEADER_EXECUTION_ID] for answer in answers]
    assert len(set(ids)) == 4 and all(EXECUTION_ID.fullmatch(i) for i in ids)
    assert "x-execution-id" not in (await client.get("/monitor")).headers, "only /api/ answers"
    await gateway.audit.flush()
    rows = rows_of(gateway)
    assert [rows[i]["status"] for i in ids] == ["failed", "failed", "completed", "completed"]
    assert [rows[i]["code"] for i in ids[:2]] == [Code.INVALID_PARAMETER] * 2
    assert [rows[i]["worker"] for i in ids[:2]] == [None, None] and rows[ids[0]]["gpu_ms"] == 0
    assert [rows[i]["worker"] for i in ids[2:]] == [1, 1], "the host that answered, not the one that failed"
    assert sorted(rows[i]["retry_count"] for i in ids[2:]) == [0, 1], "one forward beyond the first, once"


async def test_a_host_whose_answer_was_not_used_is_not_the_rows_worker(tmp_path: Path) -> None:
    upstream = FakeUpstream()
    upstream.behaviour.update({WORKERS[0]: "bad_image", WORKERS[1]: "http500"})
    gateway, client = await build(tmp_path, upstream)
    answer = await client.post(MEASURE, json=PHOTO)
    assert answer.json()["code"] == Code.SYSTEM_ERROR and len(upstream.forwards) == 2
    await gateway.audit.flush()
    (row,) = rows_of(gateway).values()
    assert (row["status"], row["worker"], row["gpu_ms"], row["retry_count"]) == ("failed", None, 0, 1)


async def test_a_replay_is_an_execution_of_its_own_with_hashed_key_and_user(tmp_path: Path) -> None:
    upstream = FakeUpstream()
    gateway, client = await build(
        tmp_path, upstream,
        idempotency={"enabled": True, "path": str(tmp_path / "idem.sqlite3")},
        rate_limit={"enabled": True, "key_header": "X-Api-Key", "trusted_proxies": ["203.0.113.7"]},
    )  # fmt: skip
    headers = {"Idempotency-Key": "k-1", "X-Api-Key": "secret-api-key", "X-Forwarded-For": "198.51.100.9"}
    first, again = [await client.post(MEASURE, json=PHOTO, headers=headers) for _ in range(2)]
    assert again.headers["Idempotency-Replayed"] == "true"
    assert first.headers[HEADER_EXECUTION_ID] != again.headers[HEADER_EXECUTION_ID]
    await gateway.audit.flush()
    rows = rows_of(gateway)
    original, replay = rows[first.headers[HEADER_EXECUTION_ID]], rows[again.headers[HEADER_EXECUTION_ID]]
    assert (original["replayed"], replay["replayed"]) == (0, 1) and len(upstream.forwards) == 1
    assert (replay["worker"], replay["gpu_ms"], replay["cost_usd"], replay["status"]) == (None, 0, 0, "completed")
    scoped = f"{header_key('secret-api-key')}:k-1"
    assert original["idempotency_key"] == replay["idempotency_key"] == hashlib.sha256(scoped.encode()).hexdigest()
    assert original["user_id"] == hashlib.sha256(b"secret-api-key").hexdigest()[:16]
    assert original["client_ip"] == "198.51.100.9", "as the rate limit sees it (the proxy is trusted)"
    text = (tmp_path / "audit.sqlite3").read_bytes()
    assert b"secret-api-key" not in text and b"k-1" not in text, "never a key in the clear"


async def test_a_long_request_is_written_in_its_intermediate_state(tmp_path: Path) -> None:
    upstream = FakeUpstream()
    upstream.delay = dict.fromkeys(WORKERS, 30.0)
    gateway, client = await build(tmp_path, upstream)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(partial(client.post, MEASURE, json=PHOTO))
        with trio.fail_after(5):
            while not upstream.forwards:
                await trio.sleep(0.01)
        await gateway.audit.flush()
        (row,) = rows_of(gateway).values()
        assert (row["status"], row["code"], row["duration_ms"]) == ("executing", None, None)
        nursery.cancel_scope.cancel()


# --- the writer's rules ------------------------------------------------------------------------------


def trail_on(store: SqliteAuditStore | None, **options: Any) -> AuditTrail:
    keys = ClientKeys(RateLimitSettings())
    return AuditTrail(ExecutionIds(0), store, keys, reader=store, **options)


def arrive(trail: AuditTrail, count: int) -> list[str]:
    scope = {"headers": [], "client": ("127.0.0.1", 1)}
    return [trail.received(f"r{n}", MEASURE, scope) for n in range(count)]


async def test_max_pending_drops_the_oldest_and_counts_them(tmp_path: Path) -> None:
    trail = trail_on(SqliteAuditStore(tmp_path / "a.sqlite3"), max_pending=3)
    ids = arrive(trail, 5)
    assert trail.pending == 3 and trail.writes["dropped"] == 2
    await trail.flush()
    assert [row["execution_id"] for row in reversed(queries_rows(trail))] == ids[2:]
    scraped = generate_latest(_registry(trail)).decode()
    assert 'hairgate_audit_writes_total{result="dropped"} 2.0' in scraped and "hairgate_audit_pending 0.0" in scraped


async def test_failed_counts_refused_attempts_and_rows_left_at_shutdown_count_as_dropped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(trail_module, "SHUTDOWN_FLUSH_SECONDS", 0.5)
    trail = trail_on(SqliteAuditStore(tmp_path))  # a directory: every open is refused
    arrive(trail, 3)
    assert not await trail.flush() and not await trail.flush()
    assert trail.writes == {"written": 0, "failed": 6, "dropped": 0, "conflict": 0}, "each refused attempt counts"
    async with trio.open_nursery() as nursery:
        await nursery.start(trail.run)
        nursery.cancel_scope.cancel()  # a shutdown with the store still refusing
    assert trail.writes["dropped"] == 3 and trail.pending == 0, "given up at shutdown: counted, not forgotten"
    scraped = generate_latest(_registry(trail)).decode()
    assert "# HELP hairgate_audit_writes_total Audit row write attempts by result" in scraped


def queries_rows(trail: AuditTrail) -> list[dict[str, Any]]:
    assert trail.store is not None
    found = trail.store.query(f"SELECT {', '.join(COLUMNS)} FROM audit_log ORDER BY id DESC", ())
    return [dict(zip(COLUMNS, values, strict=True)) for values in found]


def _registry(trail: AuditTrail) -> Any:
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry()
    registry.register(trail)
    return registry


async def test_the_schema_is_created_once_and_kept_with_its_rows_at_the_next_start(tmp_path: Path) -> None:
    first = trail_on(SqliteAuditStore(tmp_path / "a.sqlite3"))
    arrive(first, 3)
    await first.flush()
    assert first.store is not None
    first.store.close()
    again = trail_on(SqliteAuditStore(tmp_path / "a.sqlite3"))  # a restart: opened and "migrated" again
    arrive(again, 2)
    await again.flush()
    assert len(queries_rows(again)) == 5
    current = [(store_module.SCHEMA_VERSION,)]
    assert again.store is not None and again.store.query("SELECT version FROM audit_schema", ()) == current
    indexes = {row[0] for row in again.store.query("SELECT name FROM sqlite_master WHERE type = 'index'", ())}
    assert {"audit_log_idempotency_key", "audit_log_user_id", "audit_log_created_at"} <= indexes


async def test_a_v1_file_is_migrated_in_place_and_its_rows_stay_as_they_were(tmp_path: Path) -> None:
    path = tmp_path / "v1.sqlite3"
    with sqlite3.connect(path) as v1:  # what a gateway of before left
        for statement in store_module.MIGRATIONS["sqlite"][0]:
            v1.execute(statement)
        v1.execute("CREATE TABLE audit_schema (version INTEGER NOT NULL)")
        v1.execute("INSERT INTO audit_schema VALUES (1)")
        v1.execute(
            "INSERT INTO audit_log (execution_id, request_id, endpoint, client_ip, status)"
            " VALUES ('exec_1723456789012_000_00000', 'old', ?, '127.0.0.1', 'executing')",
            (MEASURE,),
        )
    trail = trail_on(SqliteAuditStore(path))
    arrive(trail, 1)
    assert await trail.flush()
    rows = {row["execution_id"]: row for row in queries_rows(trail)}
    old = rows.pop("exec_1723456789012_000_00000")
    assert (old["status"], old["node"], old["reason"], old["error_type"]) == ("executing", None, None, None), "kept"
    assert [row["node"] for row in rows.values()] == [trail.node]
    current = [(store_module.SCHEMA_VERSION,)]
    assert trail.store is not None and trail.store.query("SELECT version FROM audit_schema", ()) == current


async def test_shutdown_flushes_what_is_pending(tmp_path: Path) -> None:
    trail = trail_on(SqliteAuditStore(tmp_path / "a.sqlite3"))
    async with trio.open_nursery() as nursery:
        await nursery.start(trail.run)
        ids = arrive(trail, 50)
        nursery.cancel_scope.cancel()  # before the first batch was due
    assert {row["execution_id"] for row in queries_rows(trail)} == set(ids)


async def test_retention_deletes_old_rows_in_the_background(tmp_path: Path) -> None:
    store = SqliteAuditStore(tmp_path / "a.sqlite3")
    trail = trail_on(store, retention_days=30)
    arrive(trail, 3)
    await trail.flush()
    old = (datetime.now(UTC) - timedelta(days=31)).isoformat(timespec="milliseconds")
    store.query("UPDATE audit_log SET created_at = ? WHERE request_id != 'r2'", (old,))
    async with trio.open_nursery() as nursery:
        await nursery.start(trail.run)
        with trio.fail_after(5):
            while len(queries_rows(trail)) != 1:
                await trio.sleep(0.02)
        nursery.cancel_scope.cancel()
    assert [row["request_id"] for row in queries_rows(trail)] == ["r2"]


async def test_a_disabled_trail_names_executions_and_records_nothing(tmp_path: Path) -> None:
    audit = {"enabled": False, "path": str(tmp_path / "x.sqlite3")}
    gateway, client = await build(tmp_path, FakeUpstream(), audit=audit)
    response = await client.post(MEASURE, json=PHOTO)
    assert EXECUTION_ID.fullmatch(response.headers[HEADER_EXECUTION_ID])
    assert gateway.audit.pending == 0 and gateway.audit.store is None
    async with trio.open_nursery() as nursery:
        await nursery.start(gateway.audit.run)
    assert not (tmp_path / "x.sqlite3").exists()


# A real full disk for one process: the file-size limit (RLIMIT_FSIZE) makes every write past
# it fail with EFBIG, as a full filesystem would with ENOSPC. Raised again, the same trail
# (no restart) writes everything it held, in order.
DISK_FULL = textwrap.dedent(
    """
    import resource, signal, sqlite3, sys, trio
    sys.path.insert(0, {repo!r})
    from tests.edge.test_audit import arrive, trail_on, queries_rows
    from edge.audit.store import SqliteAuditStore

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of death
    async def main():
        trail = trail_on(SqliteAuditStore({path!r}))
        arrive(trail, 10)
        assert await trail.flush()                        # the schema and 10 rows fit
        size = {path!r}
        import os
        limit = os.path.getsize(size) + os.path.getsize(size + "-wal") + 4096
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
        ids = arrive(trail, 3000)
        full = not await trail.flush()
        held = trail.pending
        resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
        assert await trail.flush()
        written = [row["execution_id"] for row in queries_rows(trail)]
        print(full, held, trail.writes["failed"] > 0, set(ids) <= set(written), len(written))
    trio.run(main)
    """
)


def test_a_full_disk_holds_rows_in_memory_and_writes_them_when_space_is_back(tmp_path: Path) -> None:
    script = DISK_FULL.format(repo=str(REPO), path=str(tmp_path / "audit.sqlite3"))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "3000", "True", "True", "3010"], done.stdout + done.stderr


# --- settings, metrics, the admin route ---------------------------------------------------------------


def test_the_dsn_is_a_secret_and_a_malformed_one_is_named_not_quoted(tmp_path: Path) -> None:
    config = tmp_path / "settings.toml"
    config.write_text('[audit]\npostgres_dsn = "host=x"\n')
    with pytest.raises(SettingsError, match=r"audit\.postgres_dsn is a secret"):
        load_settings(config)
    config.write_text("")
    bad = "postgresql://user:hunter2@[::1"
    with pytest.raises(SettingsError) as refused:
        load_settings(config, environ={"HAIRGATE_AUDIT_POSTGRES_DSN": bad})
    assert "audit.postgres_dsn" in str(refused.value) and "hunter2" not in str(refused.value)
    secrets = tmp_path / "secrets.toml"
    secrets.write_text('[audit]\npostgres_dsn = "host=/run/pg dbname=hairgate"\n')
    assert load_settings(config, secrets).audit.postgres_dsn == "host=/run/pg dbname=hairgate"


async def test_admin_audit_needs_the_token_and_finds_rows_by_id_and_key(tmp_path: Path) -> None:
    idempotency = {"enabled": True, "path": str(tmp_path / "i.sqlite3")}
    gateway, client = await build(tmp_path, FakeUpstream(), idempotency=idempotency)
    answer = await client.post(MEASURE, json=PHOTO, headers={"Idempotency-Key": "admin-key", "X-Request-ID": "adm"})
    await gateway.audit.flush()
    execution_id = answer.headers[HEADER_EXECUTION_ID]
    assert (await client.get(f"/admin/audit?execution_id={execution_id}")).status_code == 401
    token = {"X-Internal-Token": TOKEN}
    for query in (f"execution_id={execution_id}", "request_id=adm", "idempotency_key=admin-key"):
        found = (await client.get(f"/admin/audit?{query}", headers=token)).json()["rows"]
        assert [row["execution_id"] for row in found] == [execution_id], query
    assert found[0]["idempotency_key"] == key_hash("admin-key")
    assert (await client.get("/admin/audit", headers=token)).status_code == 400


async def test_the_cli_answers_on_the_gateway_file(tmp_path: Path) -> None:
    upstream = FakeUpstream()
    upstream.behaviour[WORKERS[0]] = "http500"
    gateway, client = await build(tmp_path, upstream, audit={"path": str(tmp_path / "cli.sqlite3")})
    answers = [await client.post(MEASURE, json=PHOTO) for _ in range(3)]
    await gateway.audit.flush()
    config = tmp_path / "settings.toml"
    config.write_text(f'[edge.audit]\npath = "{tmp_path / "cli.sqlite3"}"\n')

    def cli(*arguments: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "cluster.cli", "audit", "--config", str(config), *arguments]
        return subprocess.run(command, capture_output=True, text=True, timeout=60, cwd=REPO)

    retried = json.loads(cli("--json", "retries", "--since", "1h").stdout)
    client = {"client_ip": "203.0.113.7", "user_id": None, "executions": 3, "retries": 1, "replays": 0}
    assert retried["clients"] == [client]
    failed = json.loads(cli("--json", "failures", "--since", "1h").stdout)
    assert failed["endpoint"] == [{"endpoint": MEASURE, "executions": 3, "failed": 0, "share": 0.0}]
    shown = cli("show", answers[0].headers[HEADER_EXECUTION_ID])
    assert shown.returncode == 0 and answers[0].headers[HEADER_EXECUTION_ID] in shown.stdout
    assert "retries" in cli("retries", "--since", "1h").stdout  # the table
    assert cli("retries", "--since", "an hour").returncode == 2
