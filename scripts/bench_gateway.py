#!/usr/bin/env python3
"""Closed-loop load on loopback: what the gateway adds, and how close it keeps a pool to full use.

    scripts/bench_gateway.py [--serial-requests 2000] [--load-requests 800] [--clients 16]
                             [--workers 4] [--service-ms 50]

It starts its own processes — fake workers (`tests.fakes.fake_worker`) and the real
gateway (`hairgate edge`) — and stops them on exit. Every client keeps its connections
alive (one persistent `httpx.AsyncClient` each).

(a) added latency: N requests one at a time to a fake with no service time, straight and
    through the gateway, interleaved in blocks so machine noise hits both alike;
(b) throughput: W fakes x S ms, C concurrent clients: achieved req/s as a fraction of the
    ideal W/S and of what the same fakes deliver called straight (one client pinned per
    fake: a perfect dispatcher), plus the overlaps the fakes counted (must be 0);
(c) /monitor latency while the pool is saturated by (b).

Client, gateway and fakes share this machine's cores: the client's own cost is in every
number, and other load on the machine makes them noisy. Compare runs on the same machine.
"""

from __future__ import annotations

import argparse
import math
import secrets
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import httpx
import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: tests.fakes

from cluster.files import write_secrets  # noqa: E402
from cluster.launcher import Process, free_port, start_gateway as start_edge  # noqa: E402
from tests.fakes.fake_worker import PNG_BASE64  # noqa: E402
from tests.fakes.launch import FakeWorkerProcess, write_gateway_settings  # noqa: E402

PATH = "/api/v1/hair/measure"
BODY = {"image_base64": PNG_BASE64, "gender": "unknown"}  # the gateway checks the magic bytes
BLOCK = 250  # requests per interleaved block in (a)


def percentile(samples: Sequence[float], fraction: float) -> float:
    ordered = sorted(samples)
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


def summary_ms(samples: Sequence[float]) -> dict[str, float]:
    return {
        "p50": percentile(samples, 0.50) * 1000,
        "p99": percentile(samples, 0.99) * 1000,
        "mean": statistics.fmean(samples) * 1000,
    }


async def timed_post(client: httpx.AsyncClient, url: str, headers: dict[str, str]) -> float:
    started = time.perf_counter()
    response = await client.post(url, json=BODY, headers=headers)
    elapsed = time.perf_counter() - started
    if response.status_code != 200 or response.json()["code"] != 0:
        raise RuntimeError(f"{url} answered {response.status_code}: {response.text[:200]}")
    return elapsed


async def added_latency(gateway: Process, fake: FakeWorkerProcess, requests: int) -> dict[str, dict[str, float]]:
    direct_headers = {"X-Internal-Token": fake.token}
    direct: list[float] = []
    through: list[float] = []
    async with httpx.AsyncClient(timeout=10) as client:
        for _ in range(50):  # warm both paths: connections, caches
            await timed_post(client, fake.url + PATH, direct_headers)
            await timed_post(client, gateway.url + PATH, {})
        while len(direct) < requests:
            block = min(BLOCK, requests - len(direct))
            for _ in range(block):
                direct.append(await timed_post(client, fake.url + PATH, direct_headers))
            for _ in range(block):
                through.append(await timed_post(client, gateway.url + PATH, {}))
    d, g = summary_ms(direct), summary_ms(through)
    return {"direct": d, "gateway": g, "added": {k: g[k] - d[k] for k in d}}


async def closed_loop(urls: list[str], headers: dict[str, str], requests: int) -> float:
    """`len(urls)` clients, client i always on urls[i], sharing `requests`; returns req/s."""
    remaining = requests

    async def client_loop(url: str) -> None:
        nonlocal remaining
        async with httpx.AsyncClient(timeout=30) as client:
            while remaining > 0:
                remaining -= 1
                await timed_post(client, url + PATH, headers)

    started = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for url in urls:
            nursery.start_soon(client_loop, url)
    return requests / (time.perf_counter() - started)


async def poll_monitor(url: str, samples: list[float], stop: trio.Event) -> None:
    async with httpx.AsyncClient(timeout=10) as client:
        while not stop.is_set():
            started = time.perf_counter()
            response = await client.get(url + "/monitor")
            samples.append(time.perf_counter() - started)
            if response.status_code != 200:
                raise RuntimeError(f"/monitor answered {response.status_code} under load")
            await trio.sleep(0.02)  # pacing: a monitor polls, it does not flood


async def pool_throughput(
    gateway: Process, fakes: list[FakeWorkerProcess], clients: int, requests: int, service_ms: float
) -> dict[str, float]:
    token_headers = {"X-Internal-Token": fakes[0].token}
    per_job = []
    async with httpx.AsyncClient(timeout=10) as client:
        for fake in fakes:
            for _ in range(10):
                per_job.append(await timed_post(client, fake.url + PATH, token_headers))
    straight = await closed_loop([f.url for f in fakes], token_headers, requests)
    for fake in fakes:
        await fake.reset()

    monitor_samples: list[float] = []
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(poll_monitor, gateway.url, monitor_samples, stop)
        through = await closed_loop([gateway.url] * clients, {}, requests)
        stop.set()
    overlaps = sum([(await fake.stats())["overlaps"] for fake in fakes])
    ideal = len(fakes) / (service_ms / 1000)
    return {
        "fake_job_ms": statistics.fmean(per_job) * 1000,
        "ideal_rps": ideal,
        "measured_capacity_rps": len(fakes) / statistics.fmean(per_job),
        "straight_rps": straight,
        "gateway_rps": through,
        "of_ideal": through / ideal,
        "of_straight": through / straight,
        "of_measured_capacity": through / (len(fakes) / statistics.fmean(per_job)),
        "overlaps": overlaps,
        "monitor": summary_ms(monitor_samples),
        "monitor_samples": len(monitor_samples),
    }


def start_gateway(directory: Path, token: str, fakes: list[FakeWorkerProcess]) -> Process:
    port = free_port()
    edge = {
        "health_check": {"interval_seconds": 2},
        "dispatch": {"queue_wait_seconds": 30, "max_queue_wait_seconds": 30},
    }
    config = write_gateway_settings(directory, port, [f.url for f in fakes], edge=edge)
    return start_edge(config, write_secrets(directory / "secrets.toml", token), port, directory / "gateway.log")


async def run_benchmarks(args: argparse.Namespace, directory: Path) -> int:
    token = secrets.token_hex(16)
    started: list[FakeWorkerProcess | Process] = []
    try:
        solo = FakeWorkerProcess.start(token)
        started.append(solo)
        await solo.configure(image="none")
        gateway = start_gateway(directory / "a", token, [solo])
        started.append(gateway)
        latency = await added_latency(gateway, solo, args.serial_requests)
        gateway.kill()

        pool = [FakeWorkerProcess.start(token, args.service_ms) for _ in range(args.workers)]
        started.extend(pool)
        for fake in pool:
            await fake.configure(image="none")
        gateway = start_gateway(directory / "b", token, pool)
        started.append(gateway)
        load = await pool_throughput(gateway, pool, args.clients, args.load_requests, args.service_ms)
    finally:
        for process in started:
            process.kill()
    print_report(args, latency, load)
    return 1 if load["overlaps"] else 0


def print_report(args: argparse.Namespace, latency: dict, load: dict) -> None:
    print(f"(a) {args.serial_requests} sequential requests, fake with no service time (ms)")
    print(f"    {'':10} {'p50':>8} {'p99':>8} {'mean':>8}")
    for row in ("direct", "gateway", "added"):
        print(f"    {row:10} " + " ".join(f"{latency[row][k]:8.3f}" for k in ("p50", "p99", "mean")))
    print(f"(b) {args.workers} fakes x {args.service_ms:g} ms, {args.clients} clients, {args.load_requests} requests")
    print(f"    fake job time called straight: {load['fake_job_ms']:.1f} ms "
          f"(so {load['measured_capacity_rps']:.1f} req/s at best)")
    print(f"    ideal {load['ideal_rps']:.1f} req/s | straight (pinned clients) {load['straight_rps']:.1f} req/s")
    print(f"    through the gateway {load['gateway_rps']:.1f} req/s = {load['of_ideal']:.1%} of ideal, "
          f"{load['of_straight']:.1%} of straight, {load['of_measured_capacity']:.1%} of measured capacity")
    print(f"    overlapping jobs counted by the fakes: {load['overlaps']}")
    monitor = load["monitor"]
    print(f"(c) /monitor while saturated ({load['monitor_samples']} polls): "
          f"p50 {monitor['p50']:.2f} ms, p99 {monitor['p99']:.2f} ms")
    print("    (loopback, client + gateway + fakes on the same cores: the numbers include the client's cost)")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--serial-requests", type=int, default=2000)
    parser.add_argument("--load-requests", type=int, default=800)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--service-ms", type=float, default=50.0)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-gateway-") as directory:
        for part in ("a", "b"):
            (Path(directory) / part).mkdir()
        return trio.run(run_benchmarks, args, Path(directory))


if __name__ == "__main__":
    sys.exit(main())
