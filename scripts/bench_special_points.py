#!/usr/bin/env python
"""Endpoint 99 on the gateway: latency on a 1 MP photo, and what a saturated 99 does to the loop.

    .venv/bin/python scripts/bench_special_points.py [--runs 30] [--workers 1] [--seconds 5]

1. Latency: `SpecialPoints.answer` (multipart JPEG of the astronaut at 1024×1024, ~1 MP)
   through the real face-worker processes, one request at a time: p50 / p95 over `--runs`.
2. The event loop under saturation, processes vs threads: `2 × workers` clients keep the
   endpoint busy while a probe task sleeps 1 ms in a loop; its lateness (p50 / p99 / max)
   is what every other request on the loop (`/monitor`, forwarding) waits on top of its
   own work. "threads" runs the same job in `trio.to_thread` (same limiter, one detector
   per process, used by one thread at a time): the design this module rejected.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx
import trio
from PIL import Image
from skimage import data

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from edge.local import face_jobs
from edge.local.face_workers import FaceWorkers
from edge.local.special_points import SpecialPoints
from shared.percentiles import percentile
from shared.settings import AnalysisSettings
from tests.analysis.images import encode

LIMITS = AnalysisSettings()
PROBE_SECONDS = 0.001


def one_megapixel_upload() -> tuple[bytes, str]:
    photo = Image.fromarray(data.astronaut()).resize((1024, 1024), Image.Resampling.LANCZOS)
    request = httpx.Request("POST", "http://bench/", files={"image": ("photo.jpg", encode(photo, "JPEG", quality=92))})
    return request.read(), request.headers["content-type"]


async def loop_lateness(seconds: float) -> list[float]:
    """How late a 1 ms sleep wakes up, in ms, for `seconds`."""
    lateness = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        started = time.perf_counter()
        await trio.sleep(PROBE_SECONDS)
        lateness.append((time.perf_counter() - started - PROBE_SECONDS) * 1000)
    return lateness


async def saturated(
    run_one: Callable[[], Awaitable[object]], clients: int, seconds: float
) -> tuple[list[float], float]:
    """Loop lateness while `clients` tasks call `run_one` back to back; and jobs per second."""
    done = 0

    async def client() -> None:
        nonlocal done
        while True:
            await run_one()
            done += 1

    async with trio.open_nursery() as nursery:
        for _ in range(clients):
            nursery.start_soon(client)
        await trio.sleep(1.0)  # past the first jobs
        done, started = 0, time.perf_counter()
        lateness = await loop_lateness(seconds)
        rate = done / (time.perf_counter() - started)
        nursery.cancel_scope.cancel()
    return lateness, rate


def report(label: str, lateness: list[float], rate: float) -> None:
    print(
        f"{label:<28} loop lateness p50 {percentile(lateness, 0.5):6.2f} ms  p99 {percentile(lateness, 0.99):6.2f} ms"
        f"  max {max(lateness):6.2f} ms   {rate:5.1f} jobs/s"
    )


async def main(runs: int, workers: int, seconds: float) -> None:
    body, content_type = one_megapixel_upload()
    pool = FaceWorkers(workers, queue_wait_seconds=600)
    endpoint = SpecialPoints(pool, LIMITS)
    async with trio.open_nursery() as nursery:
        await nursery.start(pool.run)
        times = []
        for run in range(runs + 1):
            started = time.perf_counter()
            answer = await endpoint.answer(body, content_type, f"bench-{run}")
            assert answer.code == 0, answer.envelope
            if run:  # the first one warms caches
                times.append((time.perf_counter() - started) * 1000)
        print(
            f"endpoint 99, 1 MP JPEG, {runs} runs, {workers} worker(s): "
            f"p50 {statistics.median(times):.1f} ms  p95 {percentile(times, 0.95):.1f} ms"
        )

        report("idle loop", await loop_lateness(seconds), 0.0)
        clients = 2 * workers
        lateness, rate = await saturated(lambda: endpoint.answer(body, content_type, "bench"), clients, seconds)
        report(f"saturated, processes ({workers})", lateness, rate)
        nursery.cancel_scope.cancel()

    limiter = trio.CapacityLimiter(workers)
    face_jobs.prepare_worker()  # this process's own, for the threads

    async def in_thread() -> object:
        return await trio.to_thread.run_sync(face_jobs.special_points, body, content_type, LIMITS, limiter=limiter)

    if workers == 1:  # one detector per process: more threads would share it concurrently
        lateness, rate = await saturated(in_thread, clients, seconds)
        report("saturated, threads (1)", lateness, rate)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=5.0)
    arguments = parser.parse_args()
    trio.run(main, arguments.runs, arguments.workers, arguments.seconds)
