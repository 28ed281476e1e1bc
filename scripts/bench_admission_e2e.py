#!/usr/bin/env python3
"""What issue 8's features cost on the real gateway process, over loopback HTTP.

    scripts/bench_admission_e2e.py [--serial-requests 2000] [--rejections 300]
                                   [--stats-requests 100000] [--clients 8] [--workers 4]

It starts its own fake workers (`tests.fakes.fake_worker`, no service time, no images) and
real gateways (`hairgate edge`), and stops them on exit.

(i)   single client, no key: a gateway with every issue-8 feature on (rate limit with a
      limit nobody reaches, idempotency, metrics listener) vs one with them all off, both
      in front of the same fake, interleaved in blocks so machine noise hits both alike;
      straight to the fake too, so "added" = through a gateway - straight;
(ii)  the same features-on gateway, every request with a fresh Idempotency-Key (SQLite)
      vs without;
(iii) edge rejections under a 2 MB `max_body_bytes`, server-side (the request log's
      `duration_ms`): a 4 MB body (1003), a bad field (`drop_mm: 1000`, 1001) in a 1.9 MB
      body and in a small one (the codes seen are printed); and client-side, the time from
      sending the 4 MB body's head to its answer;
(iv)  `/admin/stats` latency after --stats-requests real requests over four paths, and the
      gateway's RSS (VmRSS) after warm-up and after those requests.

Client, gateways and fakes share this machine's cores: compare runs on the same machine.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: tests.fakes

from bench_gateway import BLOCK, BODY, PATH, summary_ms, timed_post

from cluster.launcher import LOOPBACK, Process, free_port
from shared.contract import HEADER_IDEMPOTENCY_KEY, HEADER_REQUEST_ID, HEADER_TOKEN
from tests.fakes.launch import FakeCluster, FakeWorkerProcess

FEATURES_OFF = {"rate_limit": {"enabled": False}, "idempotency": {"enabled": False}, "metrics_bind": ""}
STATS_PATHS = ["/api/v1/hair/measure", "/api/v1/hair/mask", "/api/v1/hair/hairline", "/api/v1/hair/grow"]
MARK = "/api/v1/hair/mark"
BODY_LIMIT_BYTES = 2 * 1024 * 1024
OVERSIZE_BYTES = 4 * 1024 * 1024  # seed 002 §5.4's upload
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def features_on() -> dict[str, Any]:
    """Every issue-8 feature on; the rate limit with a limit nobody reaches (its cost, not its effect)."""
    return {
        "rate_limit": {"enabled": True, "requests_per_minute": 1e9, "burst": 1_000_000},
        "idempotency": {"enabled": True},
        "metrics_bind": f"{LOOPBACK}:{free_port()}",
    }


class Bench(FakeCluster):
    """The processes of one run: one fake at a time, gateways probing every 2 s."""

    async def fake(self) -> FakeWorkerProcess:
        (fake,) = await self.fakes(1)
        return fake

    def start_edge(self, name: str, fakes: Iterable[FakeWorkerProcess], edge: dict[str, Any]) -> Process:
        gateway, _ = self.gateway(name, fakes, {"health_check": {"interval_seconds": 2}, **edge})
        return gateway


@dataclass(frozen=True)
class Series:
    """One way of sending the same request; `keyed`: a fresh Idempotency-Key each time."""

    url: str
    headers: dict[str, str]
    keyed: bool = False


async def interleaved(client: httpx.AsyncClient, series: dict[str, Series], requests: int) -> dict[str, dict]:
    """`requests` sequential POSTs per series, in blocks taking turns; ms summaries."""
    samples: dict[str, list[float]] = {name: [] for name in series}
    serial = 0

    async def one(way: Series) -> float:
        nonlocal serial
        serial += 1
        key = {HEADER_IDEMPOTENCY_KEY: f"bench-{serial}"} if way.keyed else {}
        return await timed_post(client, way.url + PATH, {**way.headers, **key})

    for way in series.values():  # warm every path: connections, caches
        for _ in range(50):
            await one(way)
    while len(samples[next(iter(series))]) < requests:
        for name, way in series.items():
            for _ in range(min(BLOCK, requests - len(samples[name]))):
                samples[name].append(await one(way))
    return {name: summary_ms(values) for name, values in samples.items()}


def log_entries(gateway_dir: Path) -> list[dict[str, Any]]:
    log = gateway_dir / "request_log.jsonl"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


async def wait_logged(gateway_dir: Path, count: int) -> list[dict[str, Any]]:
    for _ in range(200):
        if len(entries := log_entries(gateway_dir)) >= count:
            return entries
        await trio.sleep(0.05)
    raise RuntimeError(f"the request log never showed {count} requests")


async def time_to_answer(url: str, body_bytes: int) -> float:
    """Seconds from sending the head and the first 64 KiB of an over-limit body to the status line."""
    host, port = url.removeprefix("http://").split(":")
    head = (
        f"POST {PATH} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {body_bytes}\r\nConnection: close\r\n\r\n"
    ).encode()
    stream = await trio.open_tcp_stream(host, int(port))
    async with stream:
        await stream.send_all(head + b" " * (64 * 1024))
        started = time.perf_counter()
        received = b""
        while b"\r\n" not in received:
            chunk = await stream.receive_some()
            if not chunk:
                raise RuntimeError("closed before answering")
            received += chunk
        elapsed = time.perf_counter() - started
    if not received.startswith(b"HTTP/1.1 200"):
        raise RuntimeError(f"unexpected answer: {received[:80]!r}")
    return elapsed


async def rejections(bench: Bench, fake: FakeWorkerProcess, count: int) -> dict[str, Any]:
    """Each case `count` times, in turns; server-side times from the log, by request-id prefix."""
    gateway = bench.start_edge("reject", [fake], {**features_on(), "max_body_bytes": BODY_LIMIT_BYTES})
    big_image = base64.b64encode(PNG_SIGNATURE + os.urandom(int(1.9 * 1024 * 1024 * 3 / 4) - 300)).decode()
    cases = {  # name: (path, body); every body a JSON object
        "oversize 4 MB": (PATH, b'{"image_base64": "' + b"A" * OVERSIZE_BYTES + b'"}'),
        "bad field, 1.9 MB": (MARK, json.dumps({"image_base64": big_image, "drop_mm": 1000}).encode()),
        "bad field, small": (MARK, json.dumps({"image_base64": "iVBORw0KGgo=", "drop_mm": 1000}).encode()),
    }
    codes: dict[str, set[int]] = {name: set() for name in cases}
    async with httpx.AsyncClient(timeout=30) as client:
        for serial in range(count):
            for index, (name, (path, body)) in enumerate(cases.items()):
                headers = {"Content-Type": "application/json", HEADER_REQUEST_ID: f"case{index}-{serial}"}
                answer = await client.post(gateway.url + path, content=body, headers=headers)
                codes[name].add(answer.json()["code"])
    entries = await wait_logged(bench.directory / "reject", count * len(cases))
    results = {}
    for index, name in enumerate(cases):
        durations = [e["duration_ms"] for e in entries if e["request_id"].startswith(f"case{index}-")]
        results[name] = {**_ms(durations), "codes": sorted(codes[name])}
    answered = [await time_to_answer(gateway.url, OVERSIZE_BYTES) for _ in range(count)]
    results["oversize 4 MB, answer"] = {**summary_ms(answered), "codes": sorted(codes["oversize 4 MB"])}
    return results


def _ms(durations_ms: list[float]) -> dict[str, float]:
    return summary_ms([value / 1000 for value in durations_ms])


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


async def long_run(bench: Bench, fakes: list[FakeWorkerProcess], requests: int, clients: int) -> dict[str, Any]:
    gateway = bench.start_edge("long", fakes, features_on())
    remaining = requests

    async def client_loop() -> None:
        nonlocal remaining
        async with httpx.AsyncClient(timeout=30) as client:
            while remaining > 0:
                remaining -= 1
                path = STATS_PATHS[remaining % len(STATS_PATHS)]
                response = await client.post(gateway.url + path, json=BODY)
                if response.json()["code"] != 0:
                    raise RuntimeError(f"{path}: {response.text[:200]}")

    async def run(count: int) -> float:
        nonlocal remaining
        remaining = count
        started = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for _ in range(clients):
                nursery.start_soon(client_loop)
        return count / (time.perf_counter() - started)

    await run(2000)  # warm-up: connections, first allocations
    rss_before = rss_kib(gateway.pid)
    rate = await run(requests)
    rss_after = rss_kib(gateway.pid)
    stats_samples = []
    async with httpx.AsyncClient(timeout=30) as client:
        for _ in range(100):
            started = time.perf_counter()
            response = await client.get(gateway.url + "/admin/stats", headers={HEADER_TOKEN: bench.token})
            stats_samples.append(time.perf_counter() - started)
            response.raise_for_status()
        counted = response.json()["since_start"]["requests"]
    return {
        "rate": rate,
        "rss_before_kib": rss_before,
        "rss_after_kib": rss_after,
        "stats": summary_ms(stats_samples),
        "counted": counted,
        "stats_bytes": len(response.content),
    }


async def run_benchmarks(args: argparse.Namespace, directory: Path) -> None:
    bench = Bench(directory)
    try:
        solo = await bench.fake()
        off = bench.start_edge("off", [solo], FEATURES_OFF)
        on = bench.start_edge("on", [solo], features_on())
        async with httpx.AsyncClient(timeout=10) as client:
            series = {
                "straight": Series(solo.url, {HEADER_TOKEN: solo.token}),
                "features off": Series(off.url, {}),
                "features on": Series(on.url, {}),
                "on + key": Series(on.url, {}, keyed=True),
            }
            latency = await interleaved(client, series, args.serial_requests)
        rejected = await rejections(bench, solo, args.rejections)
        pool = [await bench.fake() for _ in range(args.workers)]
        long = await long_run(bench, pool, args.stats_requests, args.clients)
    finally:
        bench.stop()
    print_report(args, latency, rejected, long)


def print_report(args: argparse.Namespace, latency: dict, rejected: dict, long: dict) -> None:
    straight = latency["straight"]
    print(f"(i)+(ii) {args.serial_requests} sequential requests per series, one client (ms; added = minus straight)")
    print(f"    {'':14} {'p50':>8} {'p99':>8} {'mean':>8} {'added p50':>10}")
    for name, row in latency.items():
        added = row["p50"] - straight["p50"]
        print(f"    {name:14} " + " ".join(f"{row[k]:8.3f}" for k in ("p50", "p99", "mean")) + f" {added:10.3f}")
    print(
        f"    features on - off, p50: {latency['features on']['p50'] - latency['features off']['p50']:+.3f} ms; "
        f"key - no key, p50: {latency['on + key']['p50'] - latency['features on']['p50']:+.3f} ms"
    )
    print(f"(iii) edge rejections under a 2 MB limit, {args.rejections} each: server-side duration_ms from the")
    print("    request log (for the oversize body it includes reading and dropping the rest after answering),")
    print("    and 'answer': client-side, head + 64 KiB sent -> status line received")
    for name, row in rejected.items():
        print(f"    {name:22} p50 {row['p50']:.3f} ms  p99 {row['p99']:.3f} ms  codes seen {row['codes']}")
    print(
        f"(iv) {args.stats_requests} requests, {args.clients} clients, {args.workers} fakes: {long['rate']:.0f} req/s; "
        f"/admin/stats counted {long['counted']} ({long['stats_bytes']} bytes)"
    )
    stats = long["stats"]
    print(f"    GET /admin/stats x100 after them: p50 {stats['p50']:.2f} ms, p99 {stats['p99']:.2f} ms")
    print(
        f"    gateway VmRSS: {long['rss_before_kib'] / 1024:.1f} MiB after warm-up, "
        f"{long['rss_after_kib'] / 1024:.1f} MiB after the run"
    )
    print("    (loopback; client, gateways and fakes share the machine's cores)")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--serial-requests", type=int, default=2000)
    parser.add_argument("--rejections", type=int, default=300)
    parser.add_argument("--stats-requests", type=int, default=100_000)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--workers", type=int, default=4)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-admission-e2e-") as directory:
        trio.run(run_benchmarks, args, Path(directory))
    return 0


if __name__ == "__main__":
    sys.exit(main())
