#!/usr/bin/env python3
"""Scheduling on loopback: classes, departures, early answers, capabilities (gateway.md § Scheduling).

    scripts/bench_scheduling.py [--seconds 12]

It starts its own processes — fake GPU hosts (`tests.fakes.fake_worker`, service time per
path, the busy flag and `checks` in `/health`) and the real gateway (`hairgate edge`) —
and stops them on exit. Targets (issues 16 and 19), each printed with its verdict:

(a) classes: 3 hosts, generation 2 s / measurement 50 ms, 4 clients looping on
    generations and 2 on measurements for 12 s, with the features on (reservation 1,
    offset 5 s) and off (0, 0): measurement p95 < 0.4 s on (about 2 s off), >= 8
    generations, 0 failed, 0 overlaps;
(b) departure: a client leaving 0.5 s into a 3 s generation: the host sees the close
    within 1 s, and the next request (sent when the client left) is served at once;
(c) early answer: 1 host, generation 2.5 s (5 answers first, so its low time is known),
    `queue_wait_seconds = 1`: a second generation (start in about 2.45 s, past 1 s by more
    than the 1 s margin) is answered 1007 in < 0.25 s with Retry-After 3; reloaded with
    `queue_wait_seconds = 3`, it waits and is served;
(d) capabilities: 2 hosts, one reporting `comfyui: down`: 8 of 8 generations on the other,
    measurements on both; both down: generations on both, as without the check;
(e) the slot: `max_inflight = 6`, 3 hosts, 10 queued 2 s generations, then a measurement:
    served in < 1 s with the reservation (it waited 4.97 s for a FIFO slot before);
(f) early refusal replayed: the same seeded arrivals (a trickle of 0.1-0.3 s measurements,
    bursts of 8-10 s generations; 3 hosts, queue wait 10 s) through the real dispatcher in
    virtual time (`trio.testing.MockClock`, no sockets), with early refusal on and off:
    0 requests refused with it on that were served with it off.

Client, gateway and fakes share this machine's cores: on a loaded machine the latencies
include that load. Exit status 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import trio
import trio.testing

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: tests.fakes

from cluster.launcher import Process
from edge.pool.dispatch import Dispatcher
from edge.pool.pool import Pool, ProbeResult
from edge.pool.scheduling import SchedulingPolicy
from shared.percentiles import percentile
from tests.fakes.fake_worker import PNG_BASE64
from tests.fakes.launch import FakeCluster, FakeWorkerProcess
from tests.fakes.traffic import Arrival, bursty_arrivals, replay

GROW, MEASURE = "/api/v1/hair/grow", "/api/v1/hair/measure"
BODY = {"image_base64": PNG_BASE64, "gender": "unknown"}  # the gateway checks the magic bytes
ON = {"reserved_fast_workers": 1, "slow_priority_offset_seconds": 5}
OFF = {"reserved_fast_workers": 0, "slow_priority_offset_seconds": 0}
RELOADED = "SIGHUP：配置已重新加载"


@dataclass
class Verdicts:
    lines: list[str] = field(default_factory=list)
    missed: int = 0

    def check(self, what: str, ok: bool, measured: str) -> None:
        self.lines.append(f"    [{'ok' if ok else 'MISSED'}] {what}: {measured}")
        self.missed += not ok


class Bench(FakeCluster):
    """The processes of one run; every gateway gets the scheduling benchmark's timeouts."""

    def gateway(self, name: str, fakes: Iterable[FakeWorkerProcess], dispatch: dict[str, Any]) -> tuple[Process, Path]:
        edge = {
            "health_check": {"interval_seconds": 0.5},
            "dispatch": {
                "queue_wait_seconds": 30, "max_queue_wait_seconds": 60,
                "request_timeout_seconds": 10, "slow_request_timeout_seconds": 20, **dispatch,
            },
        }  # fmt: skip
        return super().gateway(name, fakes, edge)


async def post(client: httpx.AsyncClient, path: str, **kwargs: Any) -> tuple[httpx.Response, float]:
    started = time.perf_counter()
    response = await client.post(path, json=BODY, **kwargs)
    return response, time.perf_counter() - started


def succeeded(response: httpx.Response) -> bool:
    return response.status_code == 200 and response.json()["code"] == 0


async def overlaps(fakes: list[FakeWorkerProcess]) -> int:
    return sum([(await fake.stats())["overlaps"] for fake in fakes])


# --- (a) classes ---------------------------------------------------------------------


async def classes(bench: Bench, name: str, dispatch: dict[str, Any], seconds: float) -> dict[str, Any]:
    fakes = await bench.fakes(3, latency_ms_by_path={GROW: 2000, MEASURE: 50}, refuse_when_busy=True)
    gateway, _ = bench.gateway(name, fakes, dispatch)
    measurements: list[float] = []
    generations: list[float] = []
    failed = 0
    deadline = trio.current_time() + seconds

    async def loop(path: str, latencies: list[float]) -> None:
        nonlocal failed
        async with httpx.AsyncClient(base_url=gateway.url, timeout=60) as client:
            while trio.current_time() < deadline:
                response, elapsed = await post(client, path)
                if succeeded(response):
                    latencies.append(elapsed)
                else:
                    failed += 1

    async with trio.open_nursery() as nursery:
        for _ in range(4):
            nursery.start_soon(loop, GROW, generations)
        for _ in range(2):
            nursery.start_soon(loop, MEASURE, measurements)
    result = {
        "measure_p50": percentile(measurements, 0.50),
        "measure_p95": percentile(measurements, 0.95),
        "measurements": len(measurements),
        "generations": len(generations),
        "failed": failed,
        "overlaps": await overlaps(fakes),
    }
    gateway.kill()
    for fake in fakes:
        fake.kill()
    return result


# --- (b) departure -------------------------------------------------------------------


async def departure(bench: Bench) -> dict[str, Any]:
    (fake,) = await bench.fakes(1, latency_ms_by_path={GROW: 3000, MEASURE: 50}, refuse_when_busy=True)
    gateway, _ = bench.gateway("departure", [fake], ON)
    async with httpx.AsyncClient(base_url=gateway.url, timeout=0.5) as leaving:
        with contextlib.suppress(httpx.TimeoutException):  # the client gave up: httpx closed its connection
            await leaving.post(GROW, json=BODY, headers={"X-Request-ID": "leaves"})
    left_at = time.monotonic()
    async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as client:
        response, next_seconds = await post(client, MEASURE, headers={"X-Request-ID": "next"})
    stats = await fake.stats()
    (seen,) = stats["departures"]
    (job,) = [job for job in stats["jobs"] if job["request_id"] == "next"]
    result = {
        "close_seen_after_leaving_s": seen["at"] - left_at,
        "next_started_after_close_s": job["at"] - seen["at"],
        "next_total_s": next_seconds,
        "next_ok": succeeded(response),
        "overlaps": stats["overlaps"],
    }
    gateway.kill()
    fake.kill()
    return result


# --- (c) early answer ----------------------------------------------------------------


async def early_answer(bench: Bench) -> dict[str, Any]:
    (fake,) = await bench.fakes(1, latency_ms_by_path={GROW: 2500}, refuse_when_busy=True)
    gateway, config = bench.gateway("early", [fake], {**ON, "queue_wait_seconds": 1})
    result: dict[str, Any] = {}
    async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as client:
        for _ in range(5):  # the low service time needs 5 answers
            await post(client, GROW)

        async def second_while_first_runs() -> tuple[httpx.Response, float]:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(post, client, GROW)
                while (await fake.stats())["in_flight"] == 0:
                    await trio.sleep(0.01)
                async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as second:
                    return await post(second, GROW)
            raise AssertionError("unreachable")

        refused, refused_s = await second_while_first_runs()
        result["refused_code"] = refused.json()["code"]
        result["refused_s"] = refused_s
        result["retry_after"] = refused.headers.get("Retry-After")
        config.write_text(config.read_text().replace("queue_wait_seconds = 1\n", "queue_wait_seconds = 3\n"))
        gateway.reload()
        gateway.wait_for_log(RELOADED, 10)
        served, served_s = await second_while_first_runs()
        result["waited_ok"] = succeeded(served)
        result["waited_s"] = served_s
    gateway.kill()
    fake.kill()
    return result


# --- (d) capabilities ----------------------------------------------------------------


async def capabilities(bench: Bench) -> dict[str, Any]:
    down, up = await bench.fakes(2, checks={"disk": "ok", "comfyui": "down"})
    await up.configure(checks={"disk": "ok", "comfyui": "ok"})
    gateway, _ = bench.gateway("capabilities", [down, up], ON)

    async def jobs_by_host(path: str, count: int) -> list[int]:
        before = [len((await fake.stats())["jobs"]) for fake in (down, up)]
        async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as client:
            for _ in range(count):
                response, _ = await post(client, path)
                assert succeeded(response), response.text
        after = [len((await fake.stats())["jobs"]) for fake in (down, up)]
        return [a - b for a, b in zip(after, before, strict=True)]

    result = {
        "one_down_generations": await jobs_by_host(GROW, 8),
        "one_down_measurements": await jobs_by_host(MEASURE, 8),
    }
    await up.configure(checks={"disk": "ok", "comfyui": "down"})
    async with httpx.AsyncClient(base_url=gateway.url, timeout=5) as client:
        while (await client.get("/gateway-health")).json().get("workers_generation_ready", 0) != 0:
            await trio.sleep(0.05)
    result["both_down_generations"] = await jobs_by_host(GROW, 8)
    gateway.kill()
    return result


# --- (e) the slot ----------------------------------------------------------------------


async def slot_burst(bench: Bench, name: str, dispatch: dict[str, Any]) -> dict[str, Any]:
    fakes = await bench.fakes(3, latency_ms_by_path={GROW: 2000, MEASURE: 50}, refuse_when_busy=True)
    gateway, _ = bench.gateway(name, fakes, {**dispatch, "max_inflight": 6})
    result: dict[str, Any] = {}
    async with httpx.AsyncClient(base_url=gateway.url, timeout=60) as client, trio.open_nursery() as nursery:
        for _ in range(10):
            nursery.start_soon(post, client, GROW)
        while sum([(await fake.stats())["in_flight"] for fake in fakes]) < 2:
            await trio.sleep(0.01)  # the generations are in: two run, eight queue
        await trio.sleep(0.2)
        response, result["measure_s"] = await post(client, MEASURE)
        result["measure_ok"] = succeeded(response)
    gateway.kill()
    for fake in fakes:
        fake.kill()
    return result


# --- (f) early refusal replayed ---------------------------------------------------------

REPLAY_QUEUE_WAIT = 10.0
REPLAY_HOSTS = 3


async def replay_through(arrivals: list[Arrival], early_refusal: bool) -> list[str]:
    pool = Pool([f"http://host-{n}" for n in range(REPLAY_HOSTS)])
    for index in range(REPLAY_HOSTS):
        pool.record_probe(index, ProbeResult(0.0, ok=True), now=0.0)
    dispatcher = Dispatcher(
        pool, max_inflight=64, queue_wait_seconds=REPLAY_QUEUE_WAIT, max_queue_wait_seconds=60,
        policy=SchedulingPolicy(), early_refusal=early_refusal,
    )  # fmt: skip
    return await replay(dispatcher, arrivals)


def early_refusal_replay(seeds: int, seconds: float) -> dict[str, Any]:
    totals = {"requests": 0, "refused_on": 0, "refused_and_timed_out_off": 0, "refused_but_served_off": 0,
              "timed_out_on": 0, "timed_out_off": 0}  # fmt: skip
    for seed in range(seeds):
        arrivals = bursty_arrivals(seed, seconds)
        on = trio.run(replay_through, arrivals, True, clock=trio.testing.MockClock(autojump_threshold=0))
        off = trio.run(replay_through, arrivals, False, clock=trio.testing.MockClock(autojump_threshold=0))
        totals["requests"] += len(arrivals)
        totals["refused_on"] += on.count("refused")
        totals["timed_out_on"] += on.count("timed out")
        totals["timed_out_off"] += off.count("timed out")
        for with_it, without in zip(on, off, strict=True):
            if with_it == "refused":
                totals["refused_and_timed_out_off"] += without == "timed out"
                totals["refused_but_served_off"] += without == "served"
    return totals


async def run(args: argparse.Namespace, directory: Path) -> tuple[dict[str, Any], ...]:
    bench = Bench(directory)
    try:
        on = await classes(bench, "classes-on", ON, args.seconds)
        off = await classes(bench, "classes-off", OFF, args.seconds)
        left = await departure(bench)
        early = await early_answer(bench)
        capable = await capabilities(bench)
        slot_on = await slot_burst(bench, "slot-on", ON)
        slot_off = await slot_burst(bench, "slot-off", OFF)
    finally:
        bench.stop()
    return on, off, left, early, capable, slot_on, slot_off


def report(
    args: argparse.Namespace, on: dict, off: dict, left: dict, early: dict, capable: dict,
    slots: tuple[dict, dict], replayed: dict,
) -> int:  # fmt: skip
    verdicts = Verdicts()
    print(f"(a) classes: 3 hosts, generation 2 s / measurement 50 ms, 4 + 2 looping clients, {args.seconds:g} s")
    print(f"    {'':4} {'meas p50':>9} {'meas p95':>9} {'meas':>5} {'gens':>5} {'failed':>6} {'overlaps':>8}")
    for name, row in (("on", on), ("off", off)):
        print(f"    {name:4} {row['measure_p50']:9.3f} {row['measure_p95']:9.3f} {row['measurements']:5d} "
              f"{row['generations']:5d} {row['failed']:6d} {row['overlaps']:8d}")  # fmt: skip
    verdicts.check("measurement p95 < 0.4 s (on)", on["measure_p95"] < 0.4, f"{on['measure_p95']:.3f} s")
    verdicts.check(">= 8 generations (on)", on["generations"] >= 8, str(on["generations"]))
    verdicts.check("0 failed, 0 overlaps", not (on["failed"] or on["overlaps"] or off["failed"] or off["overlaps"]),
                   f"failed {on['failed']}+{off['failed']}, overlaps {on['overlaps']}+{off['overlaps']}")  # fmt: skip
    print("(b) departure: a client leaves 0.5 s into a 3 s generation; the next request is sent then")
    verdicts.check("the host sees the close within 1 s", left["close_seen_after_leaving_s"] < 1,
                   f"{left['close_seen_after_leaving_s']:.3f} s after the client left")  # fmt: skip
    verdicts.check("the next request is served at once", left["next_ok"] and left["next_total_s"] < 0.4,
                   f"started {left['next_started_after_close_s']:.3f} s after the close, answered in "
                   f"{left['next_total_s']:.3f} s")  # fmt: skip
    print("(c) early answer: 1 host, generation 2.5 s, a second generation while the first runs")
    retry_after = early["retry_after"]
    verdicts.check("queue_wait 1 s: 1007 in < 0.25 s, Retry-After 3",
                   early["refused_code"] == 1007 and early["refused_s"] < 0.25 and retry_after == "3",
                   f"code {early['refused_code']} in {early['refused_s']:.3f} s, "
                   f"Retry-After {retry_after}")  # fmt: skip
    verdicts.check("queue_wait 3 s: waits and is served", early["waited_ok"], f"served in {early['waited_s']:.3f} s")
    print("(d) capabilities: jobs per host [comfyui down, comfyui ok]")
    verdicts.check("8 of 8 generations to the ok host", capable["one_down_generations"] == [0, 8],
                   str(capable["one_down_generations"]))  # fmt: skip
    verdicts.check("measurements to both", all(capable["one_down_measurements"]), str(capable["one_down_measurements"]))
    verdicts.check("both down: generations on both, as today", all(capable["both_down_generations"]),
                   str(capable["both_down_generations"]))  # fmt: skip
    slot_on, slot_off = slots
    print("(e) the slot: max_inflight 6, 3 hosts, 10 queued 2 s generations, then a measurement")
    verdicts.check("measurement < 1 s (reservation on)", slot_on["measure_ok"] and slot_on["measure_s"] < 1,
                   f"{slot_on['measure_s']:.3f} s "
                   f"(reservation 0, offset 0: {slot_off['measure_s']:.3f} s)")  # fmt: skip
    print(
        f"(f) early refusal replayed: {args.replay_seeds} seeded runs of {args.replay_seconds:g} s, "
        f"{REPLAY_HOSTS} hosts, queue_wait {REPLAY_QUEUE_WAIT:g} s, {replayed['requests']} requests"
    )
    print(
        f"    on: {replayed['refused_on']} refused, {replayed['timed_out_on']} timed out; "
        f"off: {replayed['timed_out_off']} timed out"
    )
    verdicts.check("every request refused with it on timed out with it off", replayed["refused_but_served_off"] == 0,
                   f"{replayed['refused_and_timed_out_off']} of {replayed['refused_on']} timed out off, "
                   f"{replayed['refused_but_served_off']} served off")  # fmt: skip
    print("\n".join(verdicts.lines))
    print("    (loopback; client, gateway and fakes share this machine's cores)")
    return 1 if verdicts.missed else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seconds", type=float, default=12.0, help="length of each classes run (a)")
    parser.add_argument("--replay-seeds", type=int, default=20, help="seeded arrival lists replayed in (f)")
    parser.add_argument("--replay-seconds", type=float, default=300.0, help="length of each replay (f), virtual")
    parser.add_argument("--only-replay", action="store_true", help="run (f) alone: no processes")
    args = parser.parse_args(argv)
    if args.only_replay:
        replayed = early_refusal_replay(args.replay_seeds, args.replay_seconds)
        print(replayed)
        return 1 if replayed["refused_but_served_off"] else 0
    with tempfile.TemporaryDirectory(prefix="bench-scheduling-") as directory:
        on, off, left, early, capable, slot_on, slot_off = trio.run(run, args, Path(directory))
    replayed = early_refusal_replay(args.replay_seeds, args.replay_seconds)  # its own trio.run, virtual time
    return report(args, on, off, left, early, capable, (slot_on, slot_off), replayed)


if __name__ == "__main__":
    sys.exit(main())
