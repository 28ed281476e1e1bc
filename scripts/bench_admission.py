#!/usr/bin/env python3
"""What issue 8's building blocks cost a request, measured in-process (no HTTP).

    scripts/bench_admission.py [--checks 200000] [--keyed 2000] [--records 100000]

(a) rate limit: `MemoryRateLimiter.check_now` + `ClientKeys.keys` per request (µs), over a
    realistic spread of clients; and one check through a real Redis (ms, when a binary is found);
(b) idempotency: a keyed request with a no-op `run` over SQLite (claim + complete: two
    thread hops), i.e. what a key adds to a request; a replay; the same over Redis, over
    PostgreSQL (a throw-away cluster, when its binaries are found) and over PostgreSQL with
    Redis as its cache, and there a replay after a FLUSHALL (read through PostgreSQL);
(c) /admin/stats: `record()` (µs) and `snapshot()` after N records spread over an hour (ms);
    `GatewayMetrics.observe_request` (µs).

Single process on this machine: compare runs on the same machine.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: tests.fakes

from edge.admission.idempotency import Idempotency, RunResult, StoredResponse, fingerprint
from edge.admission.idempotency_cache import CachedStore
from edge.admission.idempotency_postgres import PostgresStore
from edge.admission.idempotency_stores import RedisStore, SqliteStore
from edge.admission.rate_limit import ClientKeys, MemoryRateLimiter, RedisRateLimiter
from edge.observe.metrics import GatewayMetrics
from edge.observe.request_log import RequestRecord
from edge.observe.stats import RequestStats
from edge.shared_state import redis_client
from shared.contract import Code, envelope
from shared.settings import RateLimitSettings
from tests.fakes.redis_server import RedisServer, find_redis_binary
from tests.postgres import PostgresCluster, postgres_available

# an envelope of a typical size: only a client-facing answer is ever stored or replayed
RESPONSE = StoredResponse(
    200,
    (("content-type", "application/json"),),
    json.dumps(envelope(Code.OK, "bench", {"note": "x" * 400})).encode(),
    0,
)
PATHS = ["/api/v1/hair/measure", "/api/v1/hair/grow", "/api/v1/hair/mark", "/api/v1/hair/hairline"]
FP = fingerprint("POST", PATHS[0], b"x" * 1000)


async def _noop() -> RunResult:
    return RunResult(RESPONSE, storable=True)


def bench_rate_limit(checks: int) -> None:
    limiter = MemoryRateLimiter(requests_per_minute=30, burst=10)
    keys = ClientKeys(RateLimitSettings())
    peers = [f"203.0.{i // 256}.{i % 256}" for i in range(5000)]
    chance = random.Random(1)
    order = [chance.choice(peers) for _ in range(checks)]
    started = time.perf_counter()
    for peer in order:
        for client_key in keys.keys(peer, None, None):
            limiter.check_now(client_key)
    per_check = (time.perf_counter() - started) / checks * 1e6
    print(f"(a) rate limit, memory: {per_check:.2f} µs per request (client key + check), {len(limiter)} buckets")


async def _per_call_ms(count: int, call: Callable[[int], Awaitable[object]]) -> float:
    samples = []
    for number in range(count):
        started = time.perf_counter()
        await call(number)
        samples.append((time.perf_counter() - started) * 1000)
    return statistics.median(samples)


async def bench_idempotency(count: int, idempotency: Idempotency, label: str) -> None:
    baseline = await _per_call_ms(count, lambda _: _noop())
    keyed = await _per_call_ms(count, lambda n: idempotency.execute(f"{label}-{n}", FP, _noop))
    replay = await _per_call_ms(count, lambda n: idempotency.execute(f"{label}-{n}", FP, _noop))
    print(f"(b) idempotency, {label}: keyed request +{keyed - baseline:.3f} ms (median), replay {replay:.3f} ms")


async def bench_redis(count: int) -> None:
    binary = find_redis_binary()
    if binary is None:
        print("(a/b) Redis: no redis-server binary found, skipped")
        return
    server = RedisServer(binary)
    try:
        async with redis_client(server.url) as redis:
            assert redis is not None
            limiter = RedisRateLimiter(redis, requests_per_minute=6000, burst=10**6)
            check = await _per_call_ms(count, lambda n: limiter.check(f"ip:{n % 100}"))
            print(f"(a) rate limit, Redis: {check:.3f} ms per check (median, Lua script)")
            await bench_idempotency(count, Idempotency(RedisStore(redis, 3600), 3600, 10**6), "redis")
    finally:
        server.kill()


async def bench_postgres(count: int) -> None:
    if not postgres_available():
        print("(b) PostgreSQL: no PostgreSQL 15 binaries found, skipped")
        return
    directory = Path(tempfile.mkdtemp(prefix="hairgate-bench-pg-"))
    cluster = PostgresCluster(directory)
    cluster.start()
    try:
        alone = await PostgresStore.open(cluster.create_database("bench_alone"))
        await bench_idempotency(count, Idempotency(alone, 3600, 10**6), "postgresql")
        await alone.aclose()
        binary = find_redis_binary()
        if binary is not None:
            await _bench_cached(count, cluster.create_database("bench_cached"), RedisServer(binary))
    finally:
        cluster.stop()
        shutil.rmtree(directory, ignore_errors=True)


async def _bench_cached(count: int, dsn: str, server: RedisServer) -> None:
    authority = await PostgresStore.open(dsn)
    try:
        async with redis_client(server.url) as redis:
            assert redis is not None
            idempotency = Idempotency(CachedStore(authority, RedisStore(redis, 3600), 10**6), 3600, 10**6)
            await bench_idempotency(count, idempotency, "postgresql+redis")
            await redis.flushall()
            flushed = await _per_call_ms(count, lambda n: idempotency.execute(f"postgresql+redis-{n}", FP, _noop))
            print(f"(b) idempotency, postgresql+redis: replay after a FLUSHALL {flushed:.3f} ms (read through)")
    finally:
        await authority.aclose()
        server.kill()


def _record(chance: random.Random) -> RequestRecord:
    return RequestRecord(
        ts="", request_id="r", method="POST", path=chance.choice(PATHS), client_ip="127.0.0.1",
        worker=chance.randrange(8), attempts=1, queue_ms=chance.expovariate(1.0),
        duration_ms=chance.lognormvariate(5, 0.5),
        http_status=200, code=chance.choice([0, 0, 0, 1005, 1007]), bytes_in=1, bytes_out=1,
        idempotent_replay=chance.random() < 0.05, rate_limited=chance.random() < 0.02,
    )  # fmt: skip


def bench_stats(records: int) -> None:
    chance = random.Random(2)
    entries = [_record(chance) for _ in range(records)]
    start = time.time()
    stats = RequestStats(started_at=start)
    began = time.perf_counter()
    for number, entry in enumerate(entries):
        stats.record(entry, start + number * 3600 / records)
    per_record = (time.perf_counter() - began) / records * 1e6
    timings = []
    for _ in range(5):
        began = time.perf_counter()
        stats.snapshot(start + 3600)
        timings.append((time.perf_counter() - began) * 1000)
    print(
        f"(c) stats: record {per_record:.2f} µs; snapshot after {records} records {statistics.median(timings):.2f} ms"
    )
    metrics = GatewayMetrics(version="bench")
    began = time.perf_counter()
    for entry in entries:
        metrics.observe_request(entry)
    print(f"(c) metrics: observe_request {(time.perf_counter() - began) / records * 1e6:.2f} µs")


async def main(arguments: argparse.Namespace) -> None:
    bench_rate_limit(arguments.checks)
    with tempfile.TemporaryDirectory() as directory:
        store = await SqliteStore.open(Path(directory) / "bench.sqlite3")
        await bench_idempotency(arguments.keyed, Idempotency(store, 3600, 10**6), "sqlite")
        await store.aclose()
    await bench_redis(arguments.keyed)
    await bench_postgres(arguments.keyed)
    bench_stats(arguments.records)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--checks", type=int, default=200_000)
    parser.add_argument("--keyed", type=int, default=2000)
    parser.add_argument("--records", type=int, default=100_000)
    trio.run(main, parser.parse_args())
