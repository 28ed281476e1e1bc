"""The model version through the gateway (seed 002 §6.2): passed on, stored, replayed, shown.

Real fake hosts (`tests.fakes.fake_worker`, its `model_version` knob: an upgrade) on loopback
ports behind a gateway in this process — its real `Upstream` reads their `X-Model-Version`
and its real `Prober` their `/health` — so every step is the one a deployment runs: the
answer's header, the request log, the audit row in SQLite and in PostgreSQL, an idempotent
replay after an upgrade, `/gateway-health`, the metric and the mixed-versions warning.
"""

from __future__ import annotations

import json
import logging
import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import trio
from prometheus_client import generate_latest

import edge.audit.store as store_module
from edge.admission.idempotency import Idempotency, open_idempotency
from edge.app import create_app
from edge.audit.store import PostgresAuditStore, SqliteAuditStore
from edge.gateway import Gateway, build_gateway, probe_options
from edge.pool.failures import judge as judge_answer
from edge.pool.pool import UNKNOWN_VERSION
from edge.pool.prober import Prober
from edge.pool.prober import judge as judge_probe
from edge.pool.upstream import HealthAnswer, RawAnswer
from edge.pool.versions import REMINDER_SECONDS, MixedVersions
from shared.contract import HEADER_MODEL_VERSION, Code, envelope
from shared.model_version import analysis_version
from shared.settings import AuditSecrets
from tests.edge.conftest import PHOTO, TOKEN, make_settings
from tests.fakes.fake_worker import FakeWorker
from tests.fakes.fake_worker import create_app as fake_host_app
from tests.fakes.serve import serve_on_loopback

MEASURE = "/api/v1/hair/measure"
OLD, NEW = "0.1.0+aaaaaaaaaaaa", "0.2.0+bbbbbbbbbbbb"

# -- which mixes are said, and when (pure) ------------------------------------------------------


def test_a_mix_is_warned_of_when_it_starts_changes_and_lasts_and_its_end_is_noted() -> None:
    watch = MixedVersions()
    one, mixed, other_mix = ((OLD, 2),), ((OLD, 1), (NEW, 1)), ((NEW, 1), (UNKNOWN_VERSION, 1))
    seen = [
        watch.observe(one, 0.0),  # one version: nothing to say
        watch.observe(mixed, 10.0),  # an upgrade began
        watch.observe(mixed, 20.0),  # the same mix: said already
        watch.observe(mixed, 10.0 + REMINDER_SECONDS),  # still mixed: said again
        watch.observe(other_mix, 10.0 + REMINDER_SECONDS + 1),  # another mix
        watch.observe(((NEW, 2),), 10.0 + REMINDER_SECONDS + 2),  # done
        watch.observe(((NEW, 2),), 10.0 + REMINDER_SECONDS + 3),
        watch.observe((), 10.0 + REMINDER_SECONDS + 4),  # nobody online: no version to name
    ]
    levels = [None if notice is None else notice.level for notice in seen]
    assert levels == [None, logging.WARNING, None, logging.WARNING, logging.WARNING, logging.INFO, None, None]
    assert f"{OLD} ×1, {NEW} ×1" in seen[1].message  # type: ignore[union-attr]
    assert NEW in seen[5].message  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("body", "version"),
    [
        (b'{"status":"ok","model_version":"0.1.0+aaaaaaaaaaaa"}', OLD),
        (b'{"status":"loading","model_version":"0.1.0+aaaaaaaaaaaa"}', OLD),  # known while loading too
        (b'{"status":"ok"}', None),  # a host of before: names none
        (b'{"status":"ok","model_version":"0.1 beta"}', None),  # not a value to label or store
        (b'{"status":"ok","model_version":7}', None),
        (b'{"status":"ok","model_version":"' + b"9" * 65 + b'"}', None),
    ],
)
def test_a_probe_keeps_the_version_a_host_reports_when_it_is_one(body: bytes, version: str | None) -> None:
    status = 503 if b"loading" in body else 200
    assert judge_probe(HealthAnswer(status, body), sent_at=0.0).model_version == version


@pytest.mark.parametrize(("header", "kept"), [(OLD, OLD), (None, None), ("a\tb", None)])
async def test_an_answer_keeps_its_hosts_version_when_it_is_one(header: str | None, kept: str | None) -> None:
    raw = json.dumps(envelope(Code.OK, "r1", {})).encode()
    headers = [] if header is None else [(HEADER_MODEL_VERSION.lower().encode(), header.encode())]
    assert (await judge_answer("r1", RawAnswer(200, headers, raw))).model_version == kept


# -- a gateway in front of real fake hosts ------------------------------------------------------


@dataclass
class Deployment:
    """Fake hosts on loopback ports, the gateway in front of them, its prober, a client."""

    hosts: list[FakeWorker]
    gateway: Gateway
    prober: Prober
    client: httpx.AsyncClient

    def upgrade(self, index: int, version: str) -> None:
        self.hosts[index].knobs.update({"model_version": version})

    def host_of(self, answer: httpx.Response) -> int:
        """Which host ran the request of `answer` (its jobs name the request id)."""
        request_id = answer.headers["X-Request-ID"]
        (index,) = [
            i for i, host in enumerate(self.hosts) if any(j["request_id"] == request_id for j in host.stats.jobs)
        ]
        return index

    async def rows(self) -> list[tuple[Any, ...]]:
        """The audit rows, oldest first: (execution id, model version, replayed)."""
        await self.gateway.request_log.flush()  # the request's end reaches the audit trail from its log
        assert await self.gateway.audit.flush()
        store = self.gateway.audit.store
        assert store is not None
        return store.query("SELECT execution_id, model_version, replayed FROM audit_log ORDER BY id", ())


@asynccontextmanager
async def deployment(
    tmp_path: Path, versions: list[str], *, postgres_dsn: str = "", keyed: bool = False
) -> AsyncIterator[Deployment]:
    hosts = [FakeWorker(TOKEN) for _ in versions]
    for host, version in zip(hosts, versions, strict=True):
        host.knobs.update({"model_version": version})
    async with trio.open_nursery() as nursery:
        urls = [await nursery.start(partial(serve_on_loopback, fake_host_app(host))) for host in hosts]
        idempotency = {"enabled": True, "path": str(tmp_path / "keys.sqlite3")} if keyed else {"enabled": False}
        settings = make_settings(tmp_path, pool={"workers": urls, "primary_workers": []}, idempotency=idempotency)
        if postgres_dsn:
            settings = settings.model_copy(update={"audit": AuditSecrets(postgres_dsn=postgres_dsn)})
        keys: Idempotency | None = await open_idempotency(settings.edge.idempotency, None) if keyed else None
        if keys is not None:
            await nursery.start(keys.run)
        gateway = build_gateway(settings, idempotency=keys)
        prober = Prober(gateway.dispatcher, gateway.upstream.probe, **probe_options(settings))
        await prober.probe_all()  # all online, their versions known
        transport = httpx.ASGITransport(app=create_app(gateway), client=("203.0.113.7", 5555))
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway.test") as client:
            yield Deployment(hosts, gateway, prober, client)
        await gateway.upstream.aclose()
        if keys is not None:
            await keys.aclose()
        nursery.cancel_scope.cancel()


@pytest.fixture(params=["sqlite", "postgresql"])
def audit_dsn(request: pytest.FixtureRequest) -> str:
    """ "": the audit trail in SQLite; else the PostgreSQL database it writes to."""
    return "" if request.param == "sqlite" else request.getfixturevalue("postgres_dsn")


async def test_the_client_the_log_and_the_audit_row_get_the_version_of_the_host_that_answered(
    tmp_path: Path, audit_dsn: str
) -> None:
    async with deployment(tmp_path, [OLD, NEW], postgres_dsn=audit_dsn) as pool:
        answers = [await pool.client.post(MEASURE, json=PHOTO) for _ in range(4)]
        expected = [[OLD, NEW][pool.host_of(answer)] for answer in answers]
        rows = await pool.rows()
        log = [json.loads(line) for line in pool.gateway.request_log.path.read_text().splitlines()]
    assert {pool.host_of(answer) for answer in answers} == {0, 1}, "both hosts answered"
    assert [answer.headers[HEADER_MODEL_VERSION] for answer in answers] == expected
    assert [line["model_version"] for line in log] == expected
    by_execution = {execution: version for execution, version, _ in rows}
    assert [by_execution[answer.headers["X-Execution-ID"]] for answer in answers] == expected


async def test_a_replay_carries_the_version_of_its_original_answer_after_the_host_was_upgraded(
    tmp_path: Path,
) -> None:
    async with deployment(tmp_path, [OLD], keyed=True) as pool:
        first = await pool.client.post(MEASURE, json=PHOTO, headers={"Idempotency-Key": "k-1"})
        pool.upgrade(0, NEW)
        await pool.prober.probe_all()
        replay = await pool.client.post(MEASURE, json=PHOTO, headers={"Idempotency-Key": "k-1"})
        fresh = await pool.client.post(MEASURE, json=PHOTO, headers={"Idempotency-Key": "k-2"})
        rows = await pool.rows()
    assert replay.headers["Idempotency-Replayed"] == "true" and replay.content == first.content
    assert [answer.headers[HEADER_MODEL_VERSION] for answer in (first, replay, fresh)] == [OLD, OLD, NEW]
    assert len(pool.hosts[0].stats.jobs) == 2, "the replay ran nothing"
    assert [(version, bool(replayed)) for _, version, replayed in rows] == [(OLD, False), (OLD, True), (NEW, False)]


async def test_gateway_health_the_metric_and_a_warning_while_the_pool_runs_mixed_versions(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="edge.pool")
    async with deployment(tmp_path, [OLD, OLD]) as pool:
        health = [(await pool.client.get("/gateway-health")).json()["model_versions"]]
        quiet = [r for r in caplog.records if "模型版本" in r.getMessage()]
        pool.upgrade(1, NEW)  # a rolling upgrade: one host done
        await pool.prober.probe_all()
        await pool.prober.probe_all()  # the same mix again: said once
        health.append((await pool.client.get("/gateway-health")).json()["model_versions"])
        scraped = generate_latest(pool.gateway.metrics.registry).decode()
        mixed = [r for r in caplog.records if "模型版本" in r.getMessage()]
        pool.upgrade(0, "")  # a host that names no version (one of before) is a version of its own
        await pool.prober.probe_all()
        health.append((await pool.client.get("/gateway-health")).json()["model_versions"])
        pool.upgrade(0, NEW)
        await pool.prober.probe_all()
        health.append((await pool.client.get("/gateway-health")).json()["model_versions"])
        said = [(r.levelname, r.getMessage()) for r in caplog.records if "模型版本" in r.getMessage()]
    assert health == [{OLD: 2}, {OLD: 1, NEW: 1}, {NEW: 1, UNKNOWN_VERSION: 1}, {NEW: 2}]
    assert quiet == []
    assert [(r.levelname, OLD in r.getMessage() and NEW in r.getMessage()) for r in mixed] == [("WARNING", True)]
    assert [level for level, _ in said] == ["WARNING", "WARNING", "INFO"]
    assert f'hairgate_worker_model_info{{model_version="{OLD}",worker="0"}} 1.0' in scraped
    assert f'hairgate_worker_model_info{{model_version="{NEW}",worker="1"}} 1.0' in scraped


async def test_an_offline_host_leaves_the_pools_versions(tmp_path: Path) -> None:
    async with deployment(tmp_path, [OLD, NEW]) as pool:
        pool.gateway.dispatcher.eject(1, "taken out for its upgrade")
        health = (await pool.client.get("/gateway-health")).json()["model_versions"]
        scraped = generate_latest(pool.gateway.metrics.registry).decode()
    assert health == {OLD: 1}
    assert NEW not in scraped


async def test_the_gateways_own_endpoints_name_its_version_and_an_answer_no_model_gave_names_none(
    client: httpx.AsyncClient,
) -> None:
    features = await client.post("/api/v1/face/features", json=PHOTO)  # endpoint 4, not configured here
    nobody = await client.post(MEASURE, json=PHOTO)  # no GPU host online: the gateway's own 1007
    assert features.headers[HEADER_MODEL_VERSION] == analysis_version().value
    assert nobody.json()["code"] == Code.SYSTEM_ERROR and HEADER_MODEL_VERSION not in nobody.headers


# -- the audit table's migration (schema v4) in both stores ------------------------------------


def _v3_schema(connection: Any, dialect: str) -> None:
    """What a gateway of schema v3 left: its tables and one row of its own."""
    for step in store_module.MIGRATIONS[dialect][:3]:
        for statement in step:
            connection.execute(statement)
    connection.execute("CREATE TABLE audit_schema (version INTEGER NOT NULL)")
    connection.execute("INSERT INTO audit_schema VALUES (3)")
    connection.execute(
        "INSERT INTO audit_log (execution_id, request_id, endpoint, client_ip, status, error_type)"
        f" VALUES ('exec_old', 'old', '{MEASURE}', '127.0.0.1', 'completed', 'timeout')"
    )


def _v3_store(tmp_path: Path, audit_dsn: str) -> SqliteAuditStore | PostgresAuditStore:
    """A store opened on what a gateway of schema v3 left, in SQLite or PostgreSQL (`audit_dsn`)."""
    if audit_dsn:
        with psycopg.connect(audit_dsn, autocommit=True) as connection:
            _v3_schema(connection, "postgresql")
        return PostgresAuditStore(audit_dsn)
    path = tmp_path / "v3.sqlite3"
    with sqlite3.connect(path) as connection:
        _v3_schema(connection, "sqlite")
    return SqliteAuditStore(path)


async def test_a_v3_store_gains_the_column_and_keeps_its_rows(tmp_path: Path, audit_dsn: str) -> None:
    store = _v3_store(tmp_path, audit_dsn)
    try:
        assert store.query("SELECT execution_id, error_type, model_version FROM audit_log", ()) == [
            ("exec_old", "timeout", None)
        ]
        assert store.query("SELECT version FROM audit_schema", ()) == [(store_module.SCHEMA_VERSION,)]
    finally:
        store.close()
