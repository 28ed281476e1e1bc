#!/usr/bin/env python3
"""The audit trail's numbers (audit.md): its cost on the request's path, and what the stores sustain.

    scripts/bench_audit.py [--hooks 100000] [--seconds 60] [--rate 1000]
                           [--outage-seconds 30] [--outage-rate 20] [--only hooks,sqlite,postgres,outage,gateway]

(a) hooks: one request's hook calls (received, queued, forwarding around a no-op forward,
    finished) in-process, CPU µs per request: recording with its journal (as the gateway
    runs: two `write()`s per request), recording without a journal, and off (no store);
(b) sustained: a fake request source of `--rate` executions/s (each received, then
    finished 20 ms later) for `--seconds` into SQLite and into PostgreSQL, the writer task
    running as in the gateway (its journal included): rows/s written and `pending` sampled
    every second (flat = the writer keeps up), and the journal's largest size;
(c) outage: `--outage-rate` executions/s into PostgreSQL, the server stopped for
    `--outage-seconds` and started again: each execution's hook time (p50/p99) before,
    during and after, and the rows lost (must be 0);
(d) gateway outage: the same through a real gateway process (`hairgate edge` in front of
    two fake workers, the DSN as its secret), `--outage-rate` requests/s from a client:
    failed requests, the client's latency p50/p99 before, during and after, rows lost.

PostgreSQL is a throw-away cluster (tests/postgres.py: /usr/lib/postgresql/15/bin, as the
`postgres` user when run as root), on a Unix socket with fsync off in the cluster settings:
numbers are for the gateway's side, not a production server's disk.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root

from edge.admission.rate_limit import ClientKeys
from edge.audit.ids import ExecutionIds
from edge.audit.store import AuditStore, PostgresAuditStore, SqliteAuditStore
from edge.audit.trail import AuditTrail
from edge.observe.request_log import RequestRecord
from shared.percentiles import percentile
from shared.settings import RateLimitSettings
from tests.postgres import PostgresCluster, postgres_available

PATH = "/api/v1/hair/measure"
SCOPE = {
    "headers": [(b"host", b"gw"), (b"content-type", b"application/json"), (b"idempotency-key", b"k-123"),
                (b"x-forwarded-for", b"198.51.100.7"), (b"user-agent", b"bench")],
    "client": ("127.0.0.1", 5000),
}  # fmt: skip
RECORD = RequestRecord(
    ts="", request_id="r", method="POST", path=PATH, client_ip="127.0.0.1", worker=0, attempts=1,
    queue_ms=0.2, duration_ms=12.0, http_status=200, code=0, bytes_in=100, bytes_out=200,
)  # fmt: skip
FINISH_AFTER_SECONDS = 0.02
WRITER_BATCH = 500  # executions pending between two writes at 1,000/s


def trail_on(store: AuditStore | None, journal_dir: Path | None = None) -> AuditTrail:
    trail = AuditTrail(
        ExecutionIds(0), store, ClientKeys(RateLimitSettings()), max_pending=1_000_000, journal_dir=journal_dir
    )
    if journal_dir is not None:
        trail.open_journal()
    return trail


async def _no_forward() -> None:
    return None


async def one_request(trail: AuditTrail) -> None:
    execution_id = trail.received("r", PATH, SCOPE)
    trail.queued(execution_id)
    await trail.forwarding(execution_id, 0, _no_forward())
    trail.finished(execution_id, RECORD)


async def hooks(count: int, directory: Path) -> dict[str, float]:
    """µs per request of the hooks: recording (a store that is never flushed) with and without
    its journal, and not recording."""
    results = {}
    store = SqliteAuditStore(directory / "hooks.sqlite3")
    for name, trail in (
        ("journal", trail_on(store, directory / "hooks.journals")),
        ("recording", trail_on(store)),
        ("off", trail_on(None)),
    ):
        best = float("inf")
        for _ in range(3):  # the best of three: the machine is shared
            elapsed = 0.0
            for _ in range(count // WRITER_BATCH):
                started = time.process_time()  # CPU time: other load on a shared machine is not counted
                for _ in range(WRITER_BATCH):
                    await one_request(trail)
                elapsed += time.process_time() - started
                trail._pending.clear()  # what the writer takes every 0.5 s (not timed: off the path)
                trail._rewrite_journal_if_due()  # and the journal it then keeps to what is under way
            best = min(best, elapsed / (count // WRITER_BATCH * WRITER_BATCH))
        results[name] = best * 1e6
    return results


async def source(trail: AuditTrail, rate: float, seconds: float, hook_seconds: list[tuple[float, float]]) -> list[str]:
    """`rate` executions a second, in ticks of 10 ms; each finishes 20 ms after it arrived."""
    sent: list[str] = []
    tick = 0.01
    per_tick = rate * tick
    owed = 0.0
    in_flight: list[tuple[float, str]] = []
    start = trio.current_time()
    next_tick = start
    while trio.current_time() - start < seconds:
        owed += per_tick
        now = trio.current_time()
        while owed >= 1:
            owed -= 1
            began = time.perf_counter()
            execution_id = trail.received("r", PATH, SCOPE)
            trail.queued(execution_id)
            hook_seconds.append((now - start, time.perf_counter() - began))
            in_flight.append((now, execution_id))
            sent.append(execution_id)
        while in_flight and now - in_flight[0][0] >= FINISH_AFTER_SECONDS:
            _, execution_id = in_flight.pop(0)
            trail.finished(execution_id, RECORD)
        next_tick += tick
        await trio.sleep_until(next_tick)
    for _, execution_id in in_flight:
        trail.finished(execution_id, RECORD)
    return sent


async def sustained(store: AuditStore, rate: float, seconds: float, journal_dir: Path) -> dict[str, float]:
    trail = AuditTrail(ExecutionIds(0), store, ClientKeys(RateLimitSettings()), journal_dir=journal_dir)
    pending: list[int] = []
    journal_bytes: list[int] = []
    async with trio.open_nursery() as nursery:
        await nursery.start(trail.run)

        async def sample() -> None:
            while True:
                await trio.sleep(1)
                pending.append(trail.pending)
                journal_bytes.append(trail.journal.size_bytes if trail.journal else 0)

        nursery.start_soon(sample)
        started = time.perf_counter()
        sent = await source(trail, rate, seconds, [])
        elapsed = time.perf_counter() - started
        written_during = trail.writes["written"]
        nursery.cancel_scope.cancel()
    second_half = pending[len(pending) // 2 :] or [0]
    return {
        "executions/s": len(sent) / elapsed,
        "row writes/s": written_during / elapsed,
        "pending max": max(pending or [0]),
        "pending mean (2nd half)": statistics.fmean(second_half),
        "failed": trail.writes["failed"],
        "dropped": trail.writes["dropped"],
        "journal KiB max": max(journal_bytes or [0]) / 1024,
    }


async def outage(cluster: PostgresCluster, rate: float, seconds: float) -> dict[str, object]:
    dsn = cluster.create_database("bench_outage")
    trail = trail_on(PostgresAuditStore(dsn))
    hook_seconds: list[tuple[float, float]] = []
    marks: dict[str, float] = {}
    async with trio.open_nursery() as nursery:
        await nursery.start(trail.run)

        async def stop_then_start() -> None:
            await trio.sleep(5)
            marks["stopped"] = time.perf_counter()
            await trio.to_thread.run_sync(cluster.stop)
            await trio.sleep(seconds)
            await trio.to_thread.run_sync(cluster.start)
            marks["started"] = time.perf_counter()

        nursery.start_soon(stop_then_start)
        began = time.perf_counter()
        sent = await source(trail, rate, seconds + 15, hook_seconds)
        with trio.fail_after(60):
            while trail.pending:
                await trio.sleep(0.1)
        nursery.cancel_scope.cancel()
    rows = set(row[0] for row in PostgresAuditStore(dsn).query("SELECT execution_id FROM audit_log", ()))
    stopped, started = marks["stopped"] - began, marks["started"] - began
    phases = {
        "before": [s for t, s in hook_seconds if t < stopped],
        "during": [s for t, s in hook_seconds if stopped <= t < started],
        "after": [s for t, s in hook_seconds if t >= started],
    }
    return {
        "executions": len(sent),
        "rows lost": len(set(sent) - rows),
        "failed batch writes (rows)": trail.writes["failed"],
        **{
            f"hook µs {name} p50/p99": (percentile(v, 0.5) * 1e6, percentile(v, 0.99) * 1e6)
            for name, v in phases.items()
        },
    }


async def gateway_outage(cluster: PostgresCluster, rate: float, seconds: float, directory: Path) -> dict[str, object]:
    import secrets

    import httpx

    from cluster.files import write_secrets
    from cluster.launcher import free_port, start_gateway
    from tests.fakes.fake_worker import PNG_BASE64
    from tests.fakes.launch import FakeWorkerProcess, write_gateway_settings

    dsn = cluster.create_database("bench_gateway_outage")
    token = secrets.token_hex(16)
    fakes = [FakeWorkerProcess.start(token, 5) for _ in range(2)]
    gateway = None
    try:
        port = free_port()
        config = write_gateway_settings(directory, port, [fake.url for fake in fakes])
        secrets_file = write_secrets(directory / "secrets.toml", token)
        with secrets_file.open("a") as handle:
            handle.write(f'\n[audit]\npostgres_dsn = "{dsn}"\n')
        gateway = start_gateway(config, secrets_file, port, directory / "gateway.log")
        samples: list[tuple[float, float, bool, str]] = []  # (sent at, seconds, ok, execution id)
        marks: dict[str, float] = {}
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:

            async def one(sent_at: float) -> None:
                began = time.perf_counter()
                try:
                    answer = await client.post(PATH, json={"image_base64": PNG_BASE64, "gender": "unknown"})
                    ok = answer.json()["code"] == 0
                    execution_id = answer.headers.get("X-Execution-ID", "")
                except httpx.HTTPError:
                    ok, execution_id = False, ""
                samples.append((sent_at, time.perf_counter() - began, ok, execution_id))

            async def stop_then_start() -> None:
                await trio.sleep(5)
                marks["stopped"] = time.perf_counter() - started
                await trio.to_thread.run_sync(cluster.stop)
                await trio.sleep(seconds)
                await trio.to_thread.run_sync(cluster.start)
                marks["started"] = time.perf_counter() - started

            started = time.perf_counter()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(stop_then_start)
                while time.perf_counter() - started < seconds + 15:
                    nursery.start_soon(one, time.perf_counter() - started)
                    await trio.sleep(1 / rate)
        ids = {execution_id for _, _, _, execution_id in samples}
        deadline = time.monotonic() + 60
        while True:  # the gateway catches up by itself
            written = {row[0] for row in PostgresAuditStore(dsn).query("SELECT execution_id FROM audit_log", ())}
            if ids <= written or time.monotonic() > deadline:
                break
            await trio.sleep(0.5)
    finally:
        if gateway is not None:
            gateway.stop()
        for fake in fakes:
            fake.process.stop()
    phases = {
        "before": [s for t, s, _, _ in samples if t < marks["stopped"]],
        "during": [s for t, s, _, _ in samples if marks["stopped"] <= t < marks["started"]],
        "after": [s for t, s, _, _ in samples if t >= marks["started"]],
    }
    return {
        "requests": len(samples),
        "failed": sum(not ok for _, _, ok, _ in samples),
        "rows lost": len(ids - written),
        **{
            f"client ms {name} p50/p99": (percentile(v, 0.5) * 1e3, percentile(v, 0.99) * 1e3)
            for name, v in phases.items()
        },
    }


async def main_async(args: argparse.Namespace) -> int:
    only = set(args.only.split(","))
    directory = Path(tempfile.mkdtemp(prefix="bench-audit-"))
    cluster: PostgresCluster | None = None
    try:
        if "hooks" in only:
            result = await hooks(args.hooks, directory)
            print(
                f"(a) hooks per request: recording with its journal {result['journal']:.2f} µs,"
                f" without {result['recording']:.2f} µs, off {result['off']:.2f} µs",
                flush=True,
            )
        if "sqlite" in only:
            store = SqliteAuditStore(directory / "sustained.sqlite3")
            result = await sustained(store, args.rate, args.seconds, directory / "sustained.journals")
            print(f"(b) SQLite, {args.seconds:g} s: {_line(result)}", flush=True)
        if only & {"postgres", "outage", "gateway"}:
            if not postgres_available():
                print("PostgreSQL 15 not installed: (b) PostgreSQL and (c) skipped", file=sys.stderr)
                return 1
            cluster = PostgresCluster(Path(tempfile.mkdtemp(prefix="bench-pg-")))
            cluster.start()
        if "postgres" in only and cluster is not None:
            store = PostgresAuditStore(cluster.create_database("bench_sustained"))
            result = await sustained(store, args.rate, args.seconds, directory / "sustained-pg.journals")
            print(f"(b) PostgreSQL, {args.seconds:g} s: {_line(result)}", flush=True)
        if "outage" in only and cluster is not None:
            result = await outage(cluster, args.outage_rate, args.outage_seconds)
            print(
                f"(c) PostgreSQL stopped {args.outage_seconds:g} s at {args.outage_rate:g}/s: {_line(result)}",
                flush=True,
            )
        if "gateway" in only and cluster is not None:
            result = await gateway_outage(cluster, args.outage_rate, args.outage_seconds, directory / "gateway")
            what = f"PostgreSQL stopped {args.outage_seconds:g} s at {args.outage_rate:g} req/s"
            print(f"(d) gateway, {what}: {_line(result)}", flush=True)
    finally:
        if cluster is not None:
            cluster.stop()
            shutil.rmtree(cluster.directory, ignore_errors=True)
        shutil.rmtree(directory, ignore_errors=True)
    return 0


def _line(result: dict[str, object]) -> str:
    def show(value: object) -> str:
        if isinstance(value, tuple):
            return "/".join(f"{v:.1f}" for v in value)
        return f"{value:.1f}" if isinstance(value, float) else str(value)

    return ", ".join(f"{name} {show(value)}" for name, value in result.items())


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hooks", type=int, default=100_000)
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--rate", type=float, default=1000)
    parser.add_argument("--outage-seconds", type=float, default=30)
    parser.add_argument("--outage-rate", type=float, default=20)
    parser.add_argument("--only", default="hooks,sqlite,postgres,outage,gateway")
    return trio.run(main_async, parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
