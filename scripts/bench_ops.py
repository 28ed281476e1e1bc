#!/usr/bin/env python3
"""Operations benchmarks (issue 9): token rotation under load, two gateways on one pool.

    scripts/bench_ops.py [--skip-rotation] [--skip-two-gateways] [--rate 10] [--requests 2000]
                         [--clients-per-gateway 8] [--workers 4] [--service-ms 50]

(a) rotation: two real GPU hosts and one real gateway, all HTTPS (`trustme` certificates),
    a client at `--rate` req/s sending a real 480 px face, while `scripts/rotate_token.py
    --grace-seconds 2` rotates the token: the script's wall time and the failed requests
    (a transport error, a non-200 or a 1007), which must be 0;
(b) two gateways x W fake hosts of S ms that answer a second job 503 busy as a real host
    does: closed-loop throughput through both gateways at once as a fraction of what the
    same fakes deliver called straight (one client pinned per fake), the overlaps the fakes
    counted (must be 0) and the busy answers the gateways absorbed.

Everything shares this machine's cores; compare runs on the same machine. Exit 1 when a
request failed or a fake saw two jobs at once.
"""

from __future__ import annotations

import argparse
import secrets
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: tests, scripts

from cluster.files import write_secrets
from cluster.launcher import Process, child_env, free_port
from cluster.launcher import start_gateway as start_edge
from scripts.bench_gateway import closed_loop
from tests.fakes.launch import FakeWorkerProcess, write_gateway_settings
from tests.gpu_host.operations import Load, TlsPool, rotate_argv, small_face_json, start_gateway, steady_load

LOOPS = 4


async def rotation_under_load(directory: Path, rate: float) -> dict[str, float | str]:
    pool = TlsPool.start(directory, 2)
    gateway = start_gateway(pool, "gateway")
    try:
        load = Load()
        stop = trio.Event()
        async with trio.open_nursery() as nursery:
            for _ in range(LOOPS):  # one loop alone is capped by a real host's answer time
                nursery.start_soon(steady_load, gateway.url, pool.verify(), small_face_json(), stop, load, rate / LOOPS)
            await trio.sleep(2)  # the load runs before the rotation starts, as in production
            started = time.perf_counter()
            done = await trio.run_process(
                rotate_argv([gateway], gateway.secrets_path, pool.tls.ca_file), capture_stdout=True, check=False,
                env=child_env(),
            )  # fmt: skip
            seconds = time.perf_counter() - started
            stop.set()
        rate_seen = load.count / (time.monotonic() - load.started)
        return {
            "exit": done.returncode,
            "seconds": seconds,
            "requests": load.count,
            "failed": len(load.failures),
            "rate": rate_seen,
            "output": done.stdout.decode(),
        }
    finally:
        gateway.process.kill()
        pool.stop()


async def two_gateways(
    directory: Path, workers: int, service_ms: float, clients: int, requests: int
) -> dict[str, float]:
    token = secrets.token_hex(16)
    secrets_path = write_secrets(directory / "secrets.toml", token)
    fakes = [FakeWorkerProcess.start(token, service_ms, directory / f"fake-{n}.log") for n in range(workers)]
    gateways: list[Process] = []
    try:
        for fake in fakes:
            await fake.configure(refuse_when_busy=True)
        straight = await closed_loop([f.url for f in fakes], {"X-Internal-Token": token}, requests // 2)
        for fake in fakes:
            await fake.reset()
        for name in ("a", "b"):
            (directory / name).mkdir()
            port = free_port()
            edge = {"dispatch": {"queue_wait_seconds": 30, "max_queue_wait_seconds": 30}}
            config = write_gateway_settings(directory / name, port, [f.url for f in fakes], edge=edge)
            gateways.append(start_edge(config, secrets_path, port, directory / name / "gateway.log"))
        urls = [gateway.url for gateway in gateways for _ in range(clients)]
        through = await closed_loop(urls, {}, requests)
        stats = [await fake.stats() for fake in fakes]
    finally:
        for process in [*gateways, *(fake.process for fake in fakes)]:
            process.kill()
    return {
        "ideal_rps": workers / (service_ms / 1000),
        "straight_rps": straight,
        "two_gateways_rps": through,
        "of_straight": through / straight,
        "overlaps": sum(s["overlaps"] for s in stats),
        "busy_answers": sum(s["busy_refused"] for s in stats),
        "jobs": sum(s["completed"] for s in stats),  # a job answered busy never ran
    }


async def run(args: argparse.Namespace, directory: Path) -> int:
    failed = False
    if not args.skip_rotation:
        rotation = await rotation_under_load(directory / "rotation", args.rate)
        print(rotation.pop("output"))
        print(
            f"(a) rotation of a 2-host pool under {args.rate:g} req/s: exit {rotation['exit']}, "
            f"{rotation['seconds']:.1f} s, {rotation['requests']} requests ({rotation['rate']:.1f}/s), "
            f"{rotation['failed']} failed"
        )
        failed |= bool(rotation["failed"]) or rotation["exit"] != 0
    if not args.skip_two_gateways:
        (directory / "two").mkdir()
        load = await two_gateways(
            directory / "two", args.workers, args.service_ms, args.clients_per_gateway, args.requests
        )
        print(
            f"(b) 2 gateways x {args.workers} fakes ({args.service_ms:g} ms), {2 * args.clients_per_gateway} clients: "
            f"{load['two_gateways_rps']:.1f} req/s = {load['of_straight']:.2f} of straight {load['straight_rps']:.1f} "
            f"(ideal {load['ideal_rps']:.0f}); overlaps {load['overlaps']}, busy answers {load['busy_answers']}, "
            f"jobs {load['jobs']}"
        )
        failed |= bool(load["overlaps"])
    return 1 if failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-rotation", action="store_true")
    parser.add_argument("--skip-two-gateways", action="store_true")
    parser.add_argument("--rate", type=float, default=10.0, help="client req/s during the rotation")
    parser.add_argument("--requests", type=int, default=2000, help="requests through the two gateways")
    parser.add_argument("--clients-per-gateway", type=int, default=8)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--service-ms", type=float, default=50.0)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-ops-") as directory:
        return trio.run(run, args, Path(directory))


if __name__ == "__main__":
    sys.exit(main())
