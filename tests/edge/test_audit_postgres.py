"""The audit trail against a real PostgreSQL 15 (a throw-away cluster: tests/postgres.py).

The same rows as in SQLite; two gateways writing one table; the server stopped and
restarted under load (nothing lost, caught up without a restart); a database that does
not exist at start (logged, retried, caught up once it does).
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import trio

import edge.audit.store as store_module
import edge.audit.trail as trail_module
from edge.admission.rate_limit import ClientKeys
from edge.app import create_app
from edge.audit import queries
from edge.audit.ids import ExecutionIds
from edge.audit.store import PostgresAuditReaders, PostgresAuditStore, open_store
from edge.audit.trail import AuditTrail
from edge.gateway import build_gateway
from shared.contract import HEADER_EXECUTION_ID
from shared.settings import AuditSecrets, RateLimitSettings
from tests.edge.conftest import PHOTO, WORKERS, bring_online, make_settings
from tests.edge.test_api import FakeUpstream
from tests.edge.test_audit import MEASURE, arrive
from tests.postgres import PostgresCluster

REPO = Path(__file__).resolve().parents[2]


def trail_on(dsn: str, gateway_id: int = 0, **options: Any) -> AuditTrail:
    keys = ClientKeys(RateLimitSettings())
    store = PostgresAuditStore(dsn)
    return AuditTrail(ExecutionIds(gateway_id), store, keys, reader=PostgresAuditStore(dsn), **options)


def table(dsn: str) -> dict[str, dict[str, Any]]:
    with psycopg.connect(dsn) as connection:
        cursor = connection.execute("SELECT * FROM audit_log ORDER BY id")
        names = [column.name for column in cursor.description or ()]
        return {row[1]: dict(zip(names, row, strict=True)) for row in cursor.fetchall()}


async def test_a_gateway_writes_its_rows_into_postgresql(tmp_path: Path, postgres_dsn: str) -> None:
    pool = {"workers": WORKERS[:2], "primary_workers": []}
    settings = make_settings(tmp_path, pool=pool, audit={"gpu_second_usd": 1.5})
    settings = settings.model_copy(update={"audit": AuditSecrets(postgres_dsn=postgres_dsn)})
    upstream = FakeUpstream()
    gateway = build_gateway(settings, upstream=upstream)  # type: ignore[arg-type]
    bring_online(gateway, 0, 1)
    transport = httpx.ASGITransport(app=create_app(gateway), client=("203.0.113.7", 5555))
    async with httpx.AsyncClient(transport=transport, base_url="http://gateway.test") as client:
        answers = [await client.post(MEASURE, json=PHOTO, headers={"Idempotency-Key": "pg"}) for _ in range(2)]
        refused = await client.post("/api/v1/nowhere", json={})
    assert await gateway.audit.flush()
    rows = table(postgres_dsn)
    first = rows[answers[0].headers[HEADER_EXECUTION_ID]]
    seen = (first["status"], first["code"], str(first["client_ip"]), first["replayed"])
    assert seen == ("completed", 0, "203.0.113.7", False)
    assert first["worker"] in (0, 1) and first["gpu_ms"] is not None and first["created_at"].tzinfo is not None
    assert float(first["cost_usd"]) == round(first["gpu_ms"] * 1.5 / 1000, 6)
    assert rows[refused.headers[HEADER_EXECUTION_ID]]["status"] == "failed"
    assert len(rows) == 3
    found = queries.rows(gateway.audit.reader, "execution_id", answers[1].headers[HEADER_EXECUTION_ID])  # type: ignore[arg-type]
    assert found[0]["client_ip"] == "203.0.113.7" and isinstance(found[0]["cost_usd"], float)


async def test_two_gateways_share_one_table_without_colliding(tmp_path: Path, postgres_dsn: str) -> None:
    first, second = trail_on(postgres_dsn, gateway_id=1), trail_on(postgres_dsn, gateway_id=2)
    ids = arrive(first, 300) + arrive(second, 300)
    async with trio.open_nursery() as nursery:  # both create the schema at once: no race
        nursery.start_soon(first.flush)
        nursery.start_soon(second.flush)
    rows = table(postgres_dsn)
    assert len(rows) == 600 and set(rows) == set(ids)
    assert {execution_id.split("_")[2] for execution_id in rows} == {"001", "002"}
    secrets = tmp_path / "secrets.toml"
    secrets.write_text(f'[audit]\npostgres_dsn = "{postgres_dsn}"\n')
    config = tmp_path / "settings.toml"
    config.write_text("")
    command = [sys.executable, "-m", "cluster.cli", "audit", "--config", str(config), "--secrets", str(secrets)]
    command.append("--json")
    with psycopg.connect(postgres_dsn) as connection:  # finish some of each gateway's executions
        connection.execute(
            "UPDATE audit_log SET status = 'failed', code = 1007, worker = split_part(execution_id, '_', 3)::int"
        )
    done = subprocess.run([*command, "failures", "--since", "1h"], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert done.returncode == 0, done.stderr
    by_worker = {row["worker"]: row["failed"] for row in json.loads(done.stdout)["worker"]}
    assert by_worker == {1: 300, 2: 300}, "hairgate audit failures sees both gateways"


async def test_postgresql_stopped_and_restarted_under_load_loses_nothing(postgres: PostgresCluster) -> None:
    dsn = postgres.create_database("audit_restart")
    trail = trail_on(dsn)
    sent: list[str] = []
    async with trio.open_nursery() as nursery:
        await nursery.start(trail.run)

        async def load() -> None:
            while True:  # ~1,000 executions a second, each received then finished later
                sent.extend(arrive(trail, 10))
                await trio.sleep(0.01)

        nursery.start_soon(load)
        with trio.fail_after(10):
            while trail.writes["written"] < 500:
                await trio.sleep(0.05)
        await trio.to_thread.run_sync(postgres.stop)
        with trio.fail_after(20):
            while trail.writes["failed"] == 0:  # the store is refusing; requests go on
                await trio.sleep(0.05)
        await trio.sleep(2)
        held = trail.pending
        await trio.to_thread.run_sync(postgres.start)
        with trio.fail_after(30):
            while trail.pending > 200:  # caught up by itself, no restart
                await trio.sleep(0.05)
        nursery.cancel_scope.cancel()  # and the rest is flushed at shutdown
    rows = table(dsn)
    assert held > 1000, f"only {held} executions were held while the server was down"
    assert set(sent) == set(rows) and trail.writes["dropped"] == 0, "every execution has its row"


async def test_a_database_missing_at_start_is_retried_until_it_exists(postgres: PostgresCluster) -> None:
    dsn = postgres.dsn("audit_later")  # not created yet: every connection is refused
    trail = trail_on(dsn)
    ids = arrive(trail, 20)
    async with trio.open_nursery() as nursery:
        await nursery.start(trail.run)
        with trio.fail_after(10):
            while trail.writes["failed"] == 0:
                await trio.sleep(0.05)
        assert trail.pending == 20
        await trio.to_thread.run_sync(postgres.create_database, "audit_later")
        with trio.fail_after(10):
            while trail.pending:
                await trio.sleep(0.05)
        nursery.cancel_scope.cancel()
    assert set(table(dsn)) == set(ids)


def locked(dsn: str) -> psycopg.Connection[Any]:
    """Another session holding `audit_log` exclusively (its transaction stays open until rollback)."""
    locker = psycopg.connect(dsn)
    locker.execute("LOCK TABLE audit_log IN ACCESS EXCLUSIVE MODE")
    return locker


def release_later(locker: psycopg.Connection[Any]) -> tuple[threading.Event, threading.Timer]:
    """A test that would hang ends: the lock goes after 30 s, and `released` says so."""
    released = threading.Event()

    def release() -> None:
        released.set()
        locker.rollback()

    safety = threading.Timer(30, release)
    safety.start()
    return released, safety


def waiting_on_a_lock(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as connection:
        row = connection.execute("SELECT count(*) FROM pg_locks WHERE NOT granted").fetchone()
        return int(row[0]) if row else 0


async def test_a_write_held_up_by_a_lock_ends_in_an_error_within_the_lock_timeout(postgres: PostgresCluster) -> None:
    dsn = postgres.create_database("audit_lock_timeout")
    store = PostgresAuditStore(dsn)
    store.write([])  # the schema
    assert store.query("SELECT current_setting('lock_timeout'), current_setting('statement_timeout')", []) == [
        ("2s", "5s")
    ]
    trail = trail_on(dsn)
    arrive(trail, 1)
    locker = locked(dsn)
    released, safety = release_later(locker)  # before the fix: it hung until then
    try:
        assert not await trail.flush(), "refused by the lock timeout, not waiting for the lock"
        assert not released.is_set() and trail.writes["failed"] == 1 and trail.pending == 1
    finally:
        safety.cancel()
        locker.close()
    assert await trail.flush() and len(table(dsn)) == 1  # the lock gone: written, nothing lost


async def test_shutdown_is_bounded_while_postgresql_blocks_the_write(
    postgres: PostgresCluster, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # /tmp/rev/pghang.py of the review: a SIGTERM with a row pending while another session
    # holds the table never returned. Now the flush is abandoned at its deadline.
    monkeypatch.setattr(trail_module, "SHUTDOWN_FLUSH_SECONDS", 0.5)
    for timeout in ("POSTGRES_LOCK_TIMEOUT_MS", "POSTGRES_STATEMENT_TIMEOUT_MS"):
        monkeypatch.setattr(store_module, timeout, 60_000)  # the server does not help here
    dsn = postgres.create_database("audit_shutdown")
    PostgresAuditStore(dsn).write([])  # the schema
    trail = trail_on(dsn)
    locker = locked(dsn)
    released, safety = release_later(locker)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(trail.run)
            arrive(trail, 1)
            with trio.fail_after(10):
                while not await trio.to_thread.run_sync(waiting_on_a_lock, dsn):  # the writer is in the upsert
                    await trio.sleep(0.05)
            nursery.cancel_scope.cancel()  # what a SIGTERM does
        assert not released.is_set(), "run() returned only when the lock went"
    finally:
        safety.cancel()
        locker.rollback()
        locker.close()
    assert trail.writes["dropped"] == 1 and trail.pending == 0, "the row not written in time is counted"
    lost = [record for record in caplog.records if "未能写入" in record.getMessage()]
    assert len(lost) == 1, "logged once"


def test_the_audit_command_may_scan_longer_than_the_gateways_sessions(postgres: PostgresCluster) -> None:
    dsn = postgres.create_database("audit_command_timeout")
    expected = {"command": "1min", "writer": "5s", "readers": "5s"}  # /admin/audit's reads stay short too
    for kind in expected:
        store = open_store("unused", dsn, command=kind == "command", readers=kind == "readers")
        try:
            assert store.query("SELECT current_setting('statement_timeout')", []) == [(expected[kind],)], kind
        finally:
            store.close()


def sleeping(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as connection:
        sql = "SELECT count(*) FROM pg_stat_activity WHERE state = 'active' AND query LIKE 'SELECT pg_sleep%'"
        row = connection.execute(sql).fetchone()
        return int(row[0]) if row else 0


async def test_the_gateways_readers_run_side_by_side_on_a_pool(postgres: PostgresCluster) -> None:
    dsn = postgres.create_database("audit_readers")
    readers = PostgresAuditReaders(dsn)
    try:
        async with trio.open_nursery() as nursery:
            for _ in range(2):  # two /admin/audit reads at once
                nursery.start_soon(partial(trio.to_thread.run_sync, readers.query, "SELECT pg_sleep(3)", []))
            with trio.fail_after(3):
                while await trio.to_thread.run_sync(sleeping, dsn) < 2:  # one connection: never more than 1
                    await trio.sleep(0.05)
        assert readers.query("SELECT count(*) FROM audit_log", []) == [(0,)], "the schema is there for a reader too"
    finally:
        readers.close()
