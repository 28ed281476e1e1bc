"""Idempotency with PostgreSQL the authority and Redis its cache (issue 40 item 5, seed 002 §6.2).

The shared rules run against PostgreSQL (alone and cached) in tests/edge/test_idempotency.py;
here what only this pair does: a Redis FLUSHALL in the middle of keyed traffic through two
gateways loses no key (each ran once), a dead Redis costs nothing but speed, a replay is
Redis' alone until a flush and PostgreSQL's once, one key claimed by many gateways at
once goes to one, expiry and the bound, a restarted PostgreSQL, a DSN's password never in a
message, and the store the settings choose.
"""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path
from typing import Any

import coredis
import psycopg
import pytest
import trio
import trio.testing

import edge.admission.idempotency_postgres as postgres_module
from cluster.launcher import free_port
from edge.admission.idempotency import Idempotency, IdempotencyUnavailable, Outcome, Result, open_idempotency
from edge.admission.idempotency_cache import CachedStore
from edge.admission.idempotency_postgres import PostgresStore
from edge.admission.idempotency_stores import Record, RedisStore, SqliteStore
from edge.main import check_edge_settings
from edge.shared_state import redis_client
from shared.settings import IdempotencySettings, SettingsError
from tests.edge.conftest import make_settings
from tests.edge.test_idempotency import FP, TTL, Job, ReadSpy, answer, postgres_store, serving
from tests.fakes.redis_server import RedisServer
from tests.postgres import PostgresCluster


def rows(dsn: str, sql: str = "SELECT key FROM idempotency ORDER BY key") -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as connection:
        return connection.execute(sql).fetchall()


async def cached_keys(redis: coredis.Redis[bytes]) -> int:
    return len(await redis.keys(RedisStore.PREFIX + "*"))


class Gated:
    """One job per key, each held until its gate opens: a run in flight across the flush."""

    def __init__(self, keys: list[str]) -> None:
        self.jobs = {key: Job(answer(key), gated=True) for key in keys}

    def open(self) -> None:
        for job in self.jobs.values():
            job.gate.set()

    async def wait_started(self) -> None:
        for job in self.jobs.values():
            await job.started.wait()


async def test_a_flushall_mid_load_through_two_gateways_loses_no_key(
    postgres_dsn: str, redis_server: RedisServer
) -> None:
    done_before = [f"done-{n}" for n in range(12)]  # stored (and cached) before the flush
    running = [f"running-{n}" for n in range(6)]  # PENDING in PostgreSQL at the flush, waited for on B
    after = [f"after-{n}" for n in range(6)]  # first seen after the flush
    jobs = {key: Job(answer(key)) for key in done_before + after}
    in_flight = Gated(running)
    jobs.update(in_flight.jobs)
    outcomes: dict[str, list[Outcome]] = {key: [] for key in jobs}

    async def send(gateway: Idempotency, key: str) -> None:
        outcomes[key].append(await gateway.execute(key, FP, jobs[key]))

    async with (
        redis_client(redis_server.url) as redis,
        postgres_store(postgres_dsn, redis_server) as store_a,
        postgres_store(postgres_dsn, redis_server) as store_b,
    ):
        assert redis is not None
        spy_b = ReadSpy(store_b)
        async with serving(store_a) as gateway_a, serving(spy_b) as gateway_b:  # type: ignore[arg-type]
            for key in done_before:
                await send(gateway_a, key)
                await send(gateway_b, key)  # a replay, from the cache
            cached_before_flush = await cached_keys(redis)
            async with trio.open_nursery() as nursery:
                for key in running:
                    nursery.start_soon(send, gateway_a, key)
                await in_flight.wait_started()
                for key in running:
                    nursery.start_soon(send, gateway_b, key)
                await spy_b.polled.wait()  # B waits for A's runs through the store
                await trio.testing.wait_all_tasks_blocked()
                await redis.flushall()
                for key in after:
                    nursery.start_soon(send, gateway_b, key)
                in_flight.open()
            for key in jobs:  # every key again, through both gateways, after the flush
                await send(gateway_b, key)
                await send(gateway_a, key)
        cached_at_the_end = await cached_keys(redis)
    assert cached_before_flush == len(done_before), "the premise: the answers were in Redis"
    assert {key: job.calls for key, job in jobs.items()} == dict.fromkeys(jobs, 1), "every key ran once"
    for key, seen in outcomes.items():
        assert {outcome.response for outcome in seen} == {jobs[key].response}, key
        assert [outcome.result for outcome in seen].count(Result.STORED) == 1, key
    assert cached_at_the_end == len(jobs), "written through, or read through after the flush"


class CountingPostgres(PostgresStore):
    """A PostgreSQL store that counts the reads asked of it."""

    def __init__(self, dsn: str, pool_size: int = postgres_module.POOL_SIZE) -> None:
        super().__init__(dsn, pool_size)
        self.asked: Counter[str] = Counter()

    async def claim(self, key: str, fingerprint: str, owner: str, lease_seconds: float) -> Record | None:
        self.asked["claim"] += 1
        return await super().claim(key, fingerprint, owner, lease_seconds)

    async def read(self, key: str) -> Record | None:
        self.asked["read"] += 1
        return await super().read(key)


async def test_a_replay_is_redis_alone_and_after_a_flush_postgresql_once(
    postgres_dsn: str, redis_server: RedisServer
) -> None:
    authority = await CountingPostgres.open(postgres_dsn)
    async with redis_client(redis_server.url) as redis:
        assert redis is not None
        store = CachedStore(authority, RedisStore(redis, TTL), 1000)  # type: ignore[arg-type]
        idempotency = Idempotency(store, TTL, 1000)
        job = Job()
        first = await idempotency.execute("order-1", FP, job)
        asked_to_run = sum(authority.asked.values())
        cached = [await idempotency.execute("order-1", FP, Job()) for _ in range(3)]
        asked_while_cached = sum(authority.asked.values()) - asked_to_run
        await redis.flushall()
        after_flush = [await idempotency.execute("order-1", FP, Job()) for _ in range(3)]
        asked_after_flush = sum(authority.asked.values()) - asked_to_run
        ttl_ms = await redis.pttl(RedisStore.PREFIX + "order-1")
        await idempotency.aclose()
    assert first.result is Result.STORED and job.calls == 1
    assert [o.result for o in cached + after_flush] == [Result.REPLAYED] * 6
    assert {o.response for o in cached + after_flush} == {job.response}
    assert (asked_to_run, asked_while_cached, asked_after_flush) == (1, 0, 1), "then read through into Redis"
    assert TTL * 1000 - 60_000 < ttl_ms <= TTL * 1000, "a copy lives what the record has left, no longer"


async def test_a_dead_redis_costs_no_keyed_request(
    postgres_dsn: str, redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    async with postgres_store(postgres_dsn, redis_server) as store:
        idempotency = Idempotency(store, TTL, 1000)
        stored = Job()
        await idempotency.execute("before", FP, stored)
        redis_server.kill()
        fresh = Job(answer("fresh"))
        with caplog.at_level(logging.INFO, logger="edge.idempotency"):
            replayed = await idempotency.execute("before", FP, Job())
            ran = await idempotency.execute("fresh", FP, fresh)
            again = [await idempotency.execute("fresh", FP, Job()) for _ in range(5)]
    assert replayed == Outcome(Result.REPLAYED, stored.response), "from PostgreSQL"
    assert ran == Outcome(Result.STORED, fresh.response)
    assert again == [Outcome(Result.REPLAYED, fresh.response)] * 5
    assert fresh.calls == 1
    lines = [(r.levelname, r.getMessage().split(" | ")[0]) for r in caplog.records]
    assert lines == [("WARNING", "幂等缓存 Redis 不可用，改由 PostgreSQL 直接应答")], "once, and no 1007's ERROR"


async def test_one_key_claimed_by_many_gateways_at_once_goes_to_one(postgres_dsn: str) -> None:
    stores = [await PostgresStore.open(postgres_dsn) for _ in range(4)]
    keys = [f"race-{n}" for n in range(30)]
    winners: Counter[str] = Counter()

    async def claim(store: PostgresStore, owner: str, key: str) -> None:
        if await store.claim(key, FP, owner, 30) is None:
            winners[key] += 1

    async with trio.open_nursery() as nursery:
        for key in keys:
            for index, store in enumerate(stores):
                nursery.start_soon(claim, store, f"{index}" * 32, key)
    for store in stores:
        await store.aclose()
    assert winners == Counter(dict.fromkeys(keys, 1))


async def test_an_expired_record_is_taken_over_and_purge_keeps_max_entries(postgres_dsn: str) -> None:
    keys = [f"order-{n}" for n in range(5)]
    async with postgres_store(postgres_dsn) as store:
        idempotency = Idempotency(store, TTL, 3)
        for key in keys:
            await idempotency.execute(key, FP, Job())
        expire = "UPDATE idempotency SET expires_at = clock_timestamp() - interval '1 s' WHERE key = '{}' RETURNING 1"
        await trio.to_thread.run_sync(rows, postgres_dsn, expire.format("order-4"))
        again = Job(answer("again"))
        taken_over = await idempotency.execute("order-4", FP, again)  # expired, not yet purged
        await trio.to_thread.run_sync(rows, postgres_dsn, expire.format("order-0"))
        await store.purge(3)
        kept = await trio.to_thread.run_sync(rows, postgres_dsn)
    assert taken_over == Outcome(Result.STORED, again.response) and again.calls == 1
    assert kept == [("order-2",), ("order-3",), ("order-4",)], "the expired one, then the oldest beyond 3"


async def test_a_restarted_postgresql_costs_no_keyed_request(postgres: PostgresCluster) -> None:
    dsn = postgres.create_database("idempotency_restart")
    async with postgres_store(dsn) as store:
        idempotency = Idempotency(store, TTL, 1000)
        before = Job()
        await idempotency.execute("before", FP, before)
        await trio.to_thread.run_sync(postgres.stop)  # fast shutdown: the pool's connection is cut
        await trio.to_thread.run_sync(postgres.start)
        after = Job(answer("after"))
        ran = await idempotency.execute("after", FP, after)
        replayed = await idempotency.execute("before", FP, Job())
    assert ran == Outcome(Result.STORED, after.response)
    assert replayed == Outcome(Result.REPLAYED, before.response)


async def test_an_unreachable_postgresql_refuses_keyed_requests_and_never_names_the_password(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(postgres_module, "CONNECTION_WAIT_SECONDS", 0.3)
    store = await PostgresStore.open(f"postgresql://hairgate:s3cret-word@127.0.0.1:{free_port()}/hairgate")
    idempotency = Idempotency(store, TTL, 1000)
    job = Job()
    with caplog.at_level(logging.DEBUG), pytest.raises(IdempotencyUnavailable) as refused:
        await idempotency.execute("order-1", FP, job)
    await idempotency.aclose()
    assert job.calls == 0, "never run unprotected"
    assert str(refused.value).startswith("PostgreSQL: ")
    assert "s3cret-word" not in str(refused.value) + caplog.text


FAKE_DSN = "host=/nonexistent dbname=hairgate"  # parsed, never reached in these tests


@pytest.mark.parametrize(
    ("store", "dsn", "with_redis", "expected"),
    [
        ("auto", "", False, SqliteStore),
        ("auto", "", True, RedisStore),
        ("auto", FAKE_DSN, False, PostgresStore),
        ("auto", FAKE_DSN, True, CachedStore),
        ("postgresql", FAKE_DSN, True, CachedStore),
        ("redis", FAKE_DSN, True, RedisStore),
        ("sqlite", FAKE_DSN, True, SqliteStore),
    ],
)
async def test_the_settings_choose_the_store(
    tmp_path: Path, redis_server: RedisServer, store: str, dsn: str, with_redis: bool, expected: type
) -> None:
    settings = IdempotencySettings(store=store, path=str(tmp_path / "i.sqlite3"))  # type: ignore[arg-type]
    async with redis_client(redis_server.url if with_redis else "") as redis:
        idempotency = await open_idempotency(settings, redis, postgres_dsn=dsn)
        chosen = type(idempotency.store)
        await idempotency.aclose()
    assert chosen is expected


@pytest.mark.parametrize(
    ("store", "missing"), [("postgresql", "[audit] postgres_dsn"), ("redis", "edge.shared_state.redis_url")]
)
def test_a_store_named_but_not_configured_is_a_settings_error(tmp_path: Path, store: str, missing: str) -> None:
    settings = make_settings(tmp_path, idempotency={"store": store})
    with pytest.raises(SettingsError, match=missing.replace("[", r"\[").replace("]", r"\]")):
        check_edge_settings(settings)
