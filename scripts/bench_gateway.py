#!/usr/bin/env python3
"""Closed-loop load on loopback: what the gateway adds, and how close it keeps a pool to full use.

    scripts/bench_gateway.py [--serial-requests 2000] [--load-requests 800] [--clients 16]
                             [--workers 4] [--service-ms 50]
                             [--ceiling-workers 8] [--ceiling-service-ms 5] [--ceiling-clients 32]
                             [--ceiling-requests 4000] [--compare-with DIR] [--no-haproxy] [--audit-off]

It starts its own processes — fake workers (`tests.fakes.fake_worker`), the real gateway
(`hairgate edge`), HAProxy when it is installed (`haproxy` on PATH: the same pool behind
`maxconn 1` per server, the reference for "a proxy that only queues"), and with
`--compare-with DIR` a second gateway run from another checkout (e.g. a `git worktree` of
an older commit) — and stops them on exit. Every target is measured in the same run, on
the same fakes. Every client keeps its connections alive (one `httpx.AsyncClient` each).

(a) added latency: N requests one at a time to a fake with no service time, straight and
    through each proxy, interleaved in blocks so machine noise hits all alike, with each
    process's CPU per request (the fake's: a bare Quart-trio app on Hypercorn, the stack's
    floor);
(b) saturation: W fakes x S ms, C concurrent clients: req/s as a fraction of what the
    same fakes deliver called straight (one client pinned per fake: a perfect
    dispatcher), plus the overlaps the fakes counted (must be 0), and /monitor meanwhile;
(c) throughput ceiling: many fakes with a short service time and more clients, so that
    CPU is the limit; each proxy's own CPU time per request (from /proc) says what one
    core of it can front (attach `py-spy record --pid` to the gateway here).

Client, proxies and fakes share this machine's cores: the client's own cost is in every
number, and other load on the machine makes them noisy. Compare runs on the same machine.
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx
import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: tests.fakes

from cluster.files import write_secrets
from cluster.launcher import Process, Service, child_env, free_port, start
from cluster.launcher import start_gateway as start_edge
from shared.percentiles import percentile
from tests.fakes.fake_worker import PNG_BASE64
from tests.fakes.launch import FakeWorkerProcess, write_gateway_settings

PATH = "/api/v1/hair/measure"
BODY = {"image_base64": PNG_BASE64, "gender": "unknown"}  # the gateway checks the magic bytes
BLOCK = 250  # requests per interleaved block in (a)
POOL_READY = "池初始化完成"


def summary_ms(samples: Sequence[float]) -> dict[str, float]:
    return {
        "p50": percentile(samples, 0.50) * 1000,
        "p99": percentile(samples, 0.99) * 1000,
        "mean": statistics.fmean(samples) * 1000,
    }


@dataclass
class Target:
    """Somewhere to send the requests: a fake itself, or a proxy in front of the fakes."""

    name: str
    url: str
    headers: dict[str, str]
    stop: object = None  # what to kill afterwards (a Process or a Popen)

    @property
    def pid(self) -> int | None:
        return self.stop.pid if isinstance(self.stop, (Process, subprocess.Popen)) else None

    def kill(self) -> None:
        if isinstance(self.stop, Process):
            self.stop.kill()
        elif isinstance(self.stop, subprocess.Popen):
            self.stop.kill()
            self.stop.wait()


def cpu_seconds(pid: int | None) -> float | None:
    """User + system CPU time of a process so far (Linux `/proc`); None elsewhere."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except (OSError, TypeError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def timed_post(client: httpx.AsyncClient, target: Target, url: str | None = None) -> float:
    started = time.perf_counter()
    response = await client.post((url or target.url) + PATH, json=BODY, headers=target.headers)
    elapsed = time.perf_counter() - started
    if response.status_code != 200 or response.json()["code"] != 0:
        raise RuntimeError(f"{target.name} answered {response.status_code}: {response.text[:200]}")
    return elapsed


async def added_latency(targets: list[Target], requests: int) -> dict[str, dict[str, float]]:
    """Each target's latency, what each proxy adds to the first target's (a fake called
    straight), and the CPU each target's process spent per request while its blocks ran:
    the fake's is what one request costs a bare Quart-trio app on Hypercorn, the floor of
    the stack the gateway is built on."""
    samples: dict[str, list[float]] = {target.name: [] for target in targets}
    cpu = dict.fromkeys(samples, 0.0)
    async with httpx.AsyncClient(timeout=10) as client:
        for _ in range(50):  # warm every path: connections, caches
            for target in targets:
                await timed_post(client, target)
        done = 0
        while done < requests:
            block = min(BLOCK, requests - done)
            for target in targets:
                before = cpu_seconds(target.pid) or 0.0
                for _ in range(block):
                    samples[target.name].append(await timed_post(client, target))
                cpu[target.name] += (cpu_seconds(target.pid) or 0.0) - before
            done += block
    direct = summary_ms(samples[targets[0].name])
    report = {}
    for target in targets:
        measured = summary_ms(samples[target.name])
        report[target.name] = {**measured, "cpu_ms": cpu[target.name] / requests * 1000}
        if target is not targets[0]:
            report[f"{target.name} added"] = {k: measured[k] - direct[k] for k in direct}
    return report


async def closed_loop(target: Target, urls: list[str], requests: int) -> float:
    """`len(urls)` clients, client i always on urls[i], sharing `requests`; returns req/s."""
    remaining = requests

    async def client_loop(url: str) -> None:
        nonlocal remaining
        async with httpx.AsyncClient(timeout=30) as client:
            while remaining > 0:
                remaining -= 1
                await timed_post(client, target, url)

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


async def pool_load(
    fakes: list[FakeWorkerProcess], proxies: list[Target], clients: int, requests: int, *, monitor: bool
) -> dict[str, dict[str, float]]:
    """Straight (pinned clients) first, then each proxy with `clients` clients, in turn."""
    straight = Target("straight", "", {"X-Internal-Token": fakes[0].token})
    results: dict[str, dict[str, float]] = {
        "straight": {"rps": await closed_loop(straight, [f.url for f in fakes], requests), "overlaps": 0}
    }
    for proxy in proxies:
        for fake in fakes:
            await fake.reset()
        samples: list[float] = []
        stop = trio.Event()
        async with trio.open_nursery() as nursery:
            if monitor and proxy.name.startswith("gateway"):
                nursery.start_soon(poll_monitor, proxy.url, samples, stop)
            cpu_before = cpu_seconds(proxy.pid)
            rps = await closed_loop(proxy, [proxy.url] * clients, requests)
            cpu_after = cpu_seconds(proxy.pid)
            stop.set()
        overlaps = sum([(await fake.stats())["overlaps"] for fake in fakes])
        results[proxy.name] = {"rps": rps, "of_straight": rps / results["straight"]["rps"], "overlaps": overlaps}
        if cpu_before is not None and cpu_after is not None:  # the proxy's own CPU per request
            results[proxy.name]["cpu_ms"] = (cpu_after - cpu_before) / requests * 1000
        if samples:
            results[proxy.name].update({f"monitor_{k}": v for k, v in summary_ms(samples).items()})
    return results


def gateway_settings(directory: Path, fakes: list[FakeWorkerProcess], port: int, audit: bool = True) -> Path:
    edge = {
        "health_check": {"interval_seconds": 2},
        "dispatch": {"queue_wait_seconds": 30, "max_queue_wait_seconds": 30},
        "rate_limit": {"enabled": False},  # a benchmark client is one IP sending thousands
        "audit": {"enabled": audit},
    }
    return write_gateway_settings(directory, port, [f.url for f in fakes], edge=edge)


def start_gateway(
    name: str, directory: Path, token: str, fakes: list[FakeWorkerProcess], checkout: Path | None, audit: bool = True
) -> Target:
    directory.mkdir(parents=True)
    port = free_port()
    config = gateway_settings(directory, fakes, port, audit)
    secrets_file = write_secrets(directory / "secrets.toml", token)
    if checkout is None:
        process = start_edge(config, secrets_file, port, directory / "gateway.log")
    else:  # `python -m` runs the code of the working directory: the other checkout's
        cli = "cluster.cli" if (checkout / "cluster" / "cli.py").is_file() else "shared.cli"  # before issue 41
        argv = [sys.executable, "-m", cli, "edge", "--config", str(config), "--secrets", str(secrets_file)]
        argv += ["--bind", f"127.0.0.1:{port}"]
        process = start(
            Service(name, argv, f"http://127.0.0.1:{port}", "/health"), directory / "gateway.log", cwd=checkout
        )
        process.wait_for_log(POOL_READY, 30)
        process.poll_until(
            lambda: httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200, "its port", 30
        )
    return Target(name, f"http://127.0.0.1:{port}", {}, process)


def start_haproxy(directory: Path, token: str, fakes: list[FakeWorkerProcess]) -> Target | None:
    binary = shutil.which("haproxy")
    if binary is None:
        return None
    directory.mkdir(parents=True)
    port = free_port()
    servers = "\n".join(f"    server w{i} {fake.url.removeprefix('http://')} maxconn 1" for i, fake in enumerate(fakes))
    (directory / "haproxy.cfg").write_text(
        f"""global
    maxconn 4096
defaults
    mode http
    timeout connect 5s
    timeout client 60s
    timeout server 60s
    timeout queue 30s
    option http-keep-alive
frontend bench
    bind 127.0.0.1:{port}
    default_backend pool
backend pool
    balance leastconn
    http-request set-header X-Internal-Token {token}
{servers}
"""
    )
    process = subprocess.Popen(
        [binary, "-f", str(directory / "haproxy.cfg")], stdout=subprocess.DEVNULL, env=child_env()
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 10
    while True:
        try:
            httpx.post(url + PATH, json=BODY, timeout=1)
            break
        except httpx.TransportError:
            if time.monotonic() > deadline:
                process.kill()
                raise RuntimeError("haproxy did not start") from None
            time.sleep(0.05)
    return Target("haproxy", url, {}, process)


async def start_fakes(token: str, count: int, service_ms: float, started: list[Target]) -> list[FakeWorkerProcess]:
    fakes = [FakeWorkerProcess.start(token, service_ms) for _ in range(count)]
    for fake in fakes:
        started.append(Target("fake", fake.url, {}, fake.process))
        await fake.configure(image="none")
    return fakes


async def proxies_for(
    phase: str,
    directory: Path,
    token: str,
    fakes: list[FakeWorkerProcess],
    args: argparse.Namespace,
    started: list[Target],
) -> list[Target]:
    proxies = [start_gateway("gateway", directory / phase / "gateway", token, fakes, None)]
    if args.compare_with is not None:
        proxies.append(start_gateway("gateway-old", directory / phase / "old", token, fakes, args.compare_with))
    if args.audit_off:  # the same gateway without its audit trail (edge.audit.enabled = false)
        proxies.append(
            start_gateway("gateway-audit-off", directory / phase / "audit-off", token, fakes, None, audit=False)
        )
    if not args.no_haproxy and (haproxy := start_haproxy(directory / phase / "haproxy", token, fakes)) is not None:
        proxies.append(haproxy)
    started.extend(proxies)
    return proxies


async def run_benchmarks(args: argparse.Namespace, directory: Path) -> int:
    token = secrets.token_hex(16)
    started: list[Target] = []  # this phase's processes
    try:
        (solo,) = await start_fakes(token, 1, 0, started)
        proxies = await proxies_for("a", directory, token, [solo], args, started)
        direct = Target("direct", solo.url, {"X-Internal-Token": token}, solo.process)
        latency = await added_latency([direct, *proxies], args.serial_requests)
        stop_all(started)

        pool = await start_fakes(token, args.workers, args.service_ms, started)
        proxies = await proxies_for("b", directory, token, pool, args, started)
        saturation = await pool_load(pool, proxies, args.clients, args.load_requests, monitor=True)
        stop_all(started)

        pool = await start_fakes(token, args.ceiling_workers, args.ceiling_service_ms, started)
        proxies = await proxies_for("c", directory, token, pool, args, started)
        for proxy in proxies:  # for `py-spy record --pid …` while (c) runs
            print(f"(c) {proxy.name} pid {proxy.stop.pid}", flush=True)  # type: ignore[attr-defined]
        ceiling = await pool_load(pool, proxies, args.ceiling_clients, args.ceiling_requests, monitor=False)
    finally:
        stop_all(started)
    print_report(args, latency, saturation, ceiling)
    # the gateway's promise; HAProxy is only the reference (its retries may overlap)
    gateways = [
        result for results in (saturation, ceiling) for name, result in results.items() if name.startswith("gateway")
    ]
    return 1 if any(result["overlaps"] for result in gateways) else 0


def stop_all(started: list[Target]) -> None:
    for target in started:
        target.kill()
    started.clear()


def print_report(args: argparse.Namespace, latency: dict, saturation: dict, ceiling: dict) -> None:
    print(f"(a) {args.serial_requests} sequential requests, fake with no service time (ms)")
    print(f"    {'':18} {'p50':>8} {'p99':>8} {'mean':>8} {'CPU/request':>12}")
    for row, values in latency.items():
        cpu = f"{values['cpu_ms']:12.3f}" if "cpu_ms" in values else ""
        print(f"    {row:18} " + " ".join(f"{values[k]:8.3f}" for k in ("p50", "p99", "mean")) + cpu)
    print("    (CPU/request: the process's own; direct's is the fake's, a bare Quart-trio app on Hypercorn)")
    for title, results in (
        (f"(b) saturation: {args.workers} fakes x {args.service_ms:g} ms, {args.clients} clients, "
         f"{args.load_requests} requests", saturation),
        (f"(c) ceiling: {args.ceiling_workers} fakes x {args.ceiling_service_ms:g} ms, {args.ceiling_clients} clients, "
         f"{args.ceiling_requests} requests", ceiling),
    ):  # fmt: skip
        print(title)
        haproxy = results.get("haproxy")
        for name, result in results.items():
            line = f"    {name:12} {result['rps']:8.1f} req/s"
            if "of_straight" in result:
                line += f" = {result['of_straight']:.3f} of straight, overlaps {result['overlaps']:.0f}"
            if haproxy is not None and name.startswith("gateway"):  # issue 41's ceiling target: >= 0.45
                line += f", {result['rps'] / haproxy['rps']:.2f} of haproxy"
            if "cpu_ms" in result:
                line += f", {result['cpu_ms']:.2f} ms of its CPU per request"
            if "monitor_p50" in result:
                line += f" | /monitor p50 {result['monitor_p50']:.2f} ms p99 {result['monitor_p99']:.2f} ms"
            print(line)
    print("    (loopback, client + proxies + fakes on the same cores: the numbers include the client's cost)")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--serial-requests", type=int, default=2000)
    parser.add_argument("--load-requests", type=int, default=800)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--service-ms", type=float, default=50.0)
    parser.add_argument("--ceiling-workers", type=int, default=8)
    parser.add_argument("--ceiling-service-ms", type=float, default=5.0)
    parser.add_argument("--ceiling-clients", type=int, default=32)
    parser.add_argument("--ceiling-requests", type=int, default=4000)
    parser.add_argument("--compare-with", type=Path, help="another checkout whose gateway is measured too")
    parser.add_argument("--no-haproxy", action="store_true")
    parser.add_argument(
        "--audit-off", action="store_true", help="also measure a gateway with edge.audit.enabled = false"
    )
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-gateway-") as directory:
        return trio.run(run_benchmarks, args, Path(directory))


if __name__ == "__main__":
    sys.exit(main())
