"""Who is served next, and the early-answer estimate, as tables: pool state in, choice out.

No sockets, no clock: `next_assignment`, `next_slot`, `estimated_start` and
`surely_hopeless` are pure functions of the pool (or the slots), the waiters and the
policy (gateway.md § Scheduling, § Capabilities).
"""

from __future__ import annotations

import pytest

from edge.pool.pool import Pool, ProbeResult
from edge.pool.scheduling import (
    SchedulingPolicy,
    ServiceTimes,
    SlotUse,
    Waiting,
    estimated_start,
    next_assignment,
    next_slot,
    service_order,
    surely_hopeless,
)

URLS = ["http://w0", "http://w1", "http://w2", "http://w3"]
GROW, MEASURE = "/api/v1/hair/grow", "/api/v1/hair/measure"


def pool_of(
    count: int,
    *,
    online: tuple[int, ...] | None = None,
    primaries: tuple[int, ...] = (),
    running: dict[int, str] | None = None,
    comfyui: dict[int, str] | None = None,
) -> Pool:
    """`running`: worker -> "slow" or "fast", leased at t=0 with a grow or a measurement."""
    pool = Pool(URLS[:count], [URLS[i] for i in primaries])
    for index in range(count) if online is None else online:
        checks = {"comfyui": (comfyui or {}).get(index, "ok"), "disk": "ok"}
        pool.record_probe(index, ProbeResult(0.0, ok=True, checks=checks), now=0.0)
    for index, kind in (running or {}).items():
        pool.lease(index, 0.0, path=GROW if kind == "slow" else MEASURE, slow=kind == "slow")
    return pool


def slow(name: str, at: float, exclude: frozenset[int] = frozenset()) -> tuple[str, Waiting]:
    return name, Waiting(at, True, exclude, GROW)


def fast(name: str, at: float, exclude: frozenset[int] = frozenset()) -> tuple[str, Waiting]:
    return name, Waiting(at, False, exclude, MEASURE)


def assign_all(pool: Pool, named: list[tuple[str, Waiting]], policy: SchedulingPolicy) -> list[tuple[str, int]]:
    """What the dispatcher does at a hand-over: take pairs until none is left."""
    waiting = list(named)
    handed: list[tuple[str, int]] = []
    while (pair := next_assignment(pool, [w for _, w in waiting], policy)) is not None:
        position, index = pair
        name, waiter = waiting.pop(position)
        pool.lease(index, 1.0, path=waiter.path, slow=waiter.slow)
        handed.append((name, index))
    return handed


DEFAULT = SchedulingPolicy(reserved_fast_workers=1, slow_priority_offset_seconds=5)


@pytest.mark.parametrize(
    ("pool", "waiters", "policy", "expected"),
    [
        # reservation: three hosts, generations only: one stays free for measurements
        (pool_of(3), [slow("g1", 0), slow("g2", 0.1), slow("g3", 0.2)], DEFAULT, [("g1", 0), ("g2", 1)]),
        # … and a measurement served after the blocked generation still takes the reserved host
        (
            pool_of(3),
            [slow("g1", 0), slow("g2", 0.1), slow("g3", 0.2), fast("m1", 6)],
            DEFAULT,
            [("g1", 0), ("g2", 1), ("m1", 2)],
        ),
        # a host running a measurement is not running a slow job: it counts as the reserved one
        (
            pool_of(3, running={0: "fast"}),
            [slow("g1", 0), slow("g2", 0.1), slow("g3", 0.2)],
            DEFAULT,
            [("g1", 1), ("g2", 2)],
        ),
        (pool_of(3, running={0: "slow"}), [slow("g1", 0), slow("g2", 0.1)], DEFAULT, [("g1", 1)]),
        # reservation 0: off
        (
            pool_of(3),
            [slow("g1", 0), slow("g2", 0), slow("g3", 0)],
            SchedulingPolicy(0, 5),
            [("g1", 0), ("g2", 1), ("g3", 2)],
        ),
        # reservation 2 on three hosts: one generation at a time
        (pool_of(3), [slow("g1", 0), slow("g2", 0)], SchedulingPolicy(2, 5), [("g1", 0)]),
        # small pools: one host (no larger than the reservation) still serves generations
        (pool_of(1), [slow("g1", 0)], DEFAULT, [("g1", 0)]),
        (pool_of(2), [slow("g1", 0), slow("g2", 0)], SchedulingPolicy(2, 5), [("g1", 0), ("g2", 1)]),
        # two hosts, one reserved: one generation at a time
        (pool_of(2), [slow("g1", 0), slow("g2", 0)], DEFAULT, [("g1", 0)]),
        # offset: a generation that arrived 3 s before a measurement still goes after it …
        (pool_of(1), [slow("g", 0), fast("m", 3)], DEFAULT, [("m", 0)]),
        # … one that arrived 6 s before goes first: no generation starves
        (pool_of(1), [slow("g", 0), fast("m", 6)], DEFAULT, [("g", 0)]),
        # offset 0: plain arrival order
        (pool_of(1), [slow("g", 0), fast("m", 3)], SchedulingPolicy(1, 0), [("g", 0)]),
        # same class: first come, first served, whatever the list order
        (pool_of(1), [fast("m2", 2), fast("m1", 1)], DEFAULT, [("m1", 0)]),
        # primaries and backups: one primary online is the whole eligible pool (no reservation)
        (pool_of(3, primaries=(0,)), [slow("g1", 0)], DEFAULT, [("g1", 0)]),
        # no primary online: the two backups are the pool, and the reservation applies there
        (pool_of(3, online=(1, 2), primaries=(0,)), [slow("g1", 0), slow("g2", 0.1)], DEFAULT, [("g1", 1)]),
        # a waiter that tried every idle host lets the next one take it
        (
            pool_of(2),
            [fast("retry", 0, frozenset({0, 1})), fast("m", 1)],
            DEFAULT,
            [
                ("m", 0),
            ],
        ),
        # capabilities: generations skip the host whose ComfyUI is down, measurements do not
        (
            pool_of(2, comfyui={0: "down"}),
            [slow("g1", 0), fast("m1", 6)],
            SchedulingPolicy(0, 5),
            [("g1", 1), ("m1", 0)],
        ),
        # … and while the only "ok" host is busy, a generation waits for it
        (pool_of(2, comfyui={0: "down"}, running={1: "slow"}), [slow("g1", 0)], SchedulingPolicy(0, 5), []),
        # both down: generations go where they would have gone
        (
            pool_of(2, comfyui={0: "down", 1: "down"}),
            [slow("g1", 0), slow("g2", 0)],
            SchedulingPolicy(0, 5),
            [("g1", 0), ("g2", 1)],
        ),
        # "off" (the built-in preview) is not "ok": with no "ok" host, down hosts still draw
        (pool_of(2, comfyui={0: "down", 1: "off"}), [slow("g1", 0)], SchedulingPolicy(0, 5), [("g1", 0)]),
    ],
)
def test_next_assignment(pool: Pool, waiters, policy: SchedulingPolicy, expected) -> None:
    assert assign_all(pool, waiters, policy) == expected


def test_a_reload_that_changes_the_numbers_changes_the_choice() -> None:
    waiters = [slow("g1", 0), slow("g2", 0.1), slow("g3", 0.2)]
    assert assign_all(pool_of(3), waiters, SchedulingPolicy(1, 5)) == [("g1", 0), ("g2", 1)]
    assert assign_all(pool_of(3), waiters, SchedulingPolicy(0, 5)) == [("g1", 0), ("g2", 1), ("g3", 2)]
    ordered = [slow("g", 0), fast("m", 3)]
    assert service_order([w for _, w in ordered], SchedulingPolicy(1, 5)) == [1, 0]
    assert service_order([w for _, w in ordered], SchedulingPolicy(1, 2)) == [0, 1]


def test_nothing_idle_is_none_at_once() -> None:
    assert next_assignment(pool_of(1, running={0: "fast"}), [Waiting(0, False)], DEFAULT) is None
    assert next_assignment(pool_of(1), [], DEFAULT) is None


def times(**answers: float | list[float]) -> ServiceTimes:
    """Five answers of each given time, or the answers given."""
    service = ServiceTimes()
    for name, seconds in answers.items():
        for one in seconds if isinstance(seconds, list) else [seconds] * 5:
            service.record({"grow": GROW, "measure": MEASURE}[name], one)
    return service


@pytest.mark.parametrize(
    ("pool", "queue", "newcomer", "service", "now", "expected"),
    [
        # one host running a 1.2 s generation for 0.2 s: a second one starts in 1.0 s
        (pool_of(1, running={0: "slow"}), [], Waiting(0.2, True, path=GROW), times(grow=1.2), 0.2, 1.0),
        # a generation queued ahead of it adds its own 1.2 s
        (
            pool_of(1, running={0: "slow"}),
            [Waiting(0.1, True, path=GROW)],
            Waiting(0.2, True, path=GROW),
            times(grow=1.2),
            0.2,
            2.2,
        ),
        # a job that ran past its low time counts as ending now, not in the past
        (pool_of(1, running={0: "slow"}), [], Waiting(5, True, path=GROW), times(grow=1.2), 5.0, 0.0),
        # fewer than 5 answers on a path: no estimate, the request simply waits
        (pool_of(1, running={0: "slow"}), [], Waiting(0.2, True, path=GROW), ServiceTimes(), 0.2, None),
        (pool_of(1, running={0: "slow"}), [], Waiting(0.2, False, path=MEASURE), times(grow=1.2), 0.2, None),
        # three hosts, one reserved: generations use two lanes, both 1 s from free; two queued
        # ahead take them, the newcomer starts when the first of those ends
        (
            pool_of(3, running={0: "slow", 1: "slow"}),
            [Waiting(0.5, True, path=GROW)] * 2,
            Waiting(1, True, path=GROW),
            times(grow=2.0, measure=0.05),
            1.0,
            3.0,
        ),
        # a measurement on the same pool uses the free third host at once
        (
            pool_of(3, running={0: "slow", 1: "slow"}),
            [],
            Waiting(1, False, path=MEASURE),
            times(grow=2.0, measure=0.05),
            1.0,
            0.0,
        ),
        # queue wait 2 s: of three generations queued at t=0 behind a 1.2 s job, the first
        # is sure to start in 1.0 s; the second would start at 2.2 s, past its wait: it may
        # leave, and so may the third; the newcomer starts at 2.2 s, not 4.6 s
        (
            pool_of(1, running={0: "slow"}),
            [Waiting(0, True, path=GROW)] * 3,
            Waiting(0.2, True, path=GROW),
            times(grow=1.2),
            0.2,
            2.2,
        ),
        # answers between 1 and 3 s, queue wait 2 s: the one queued ahead is not sure (at 3 s
        # the lane frees in 2.8 s, past its wait, 1.9 s); at 1 s the lane frees in 0.8 s and,
        # served, the one ahead frees it again at 1.8 s, before it would have left
        (
            pool_of(1, running={0: "slow"}),
            [Waiting(0.1, True, path=GROW)],
            Waiting(0.2, True, path=GROW),
            times(grow=[1.0] * 5 + [3.0] * 5),
            0.2,
            1.8,
        ),
        # … a job 5 s in (up to 6 s): the lane frees within 1 s, and the one ahead (0.5 s of
        # its 2 s wait gone) is sure to be served; the newcomer follows it, 1 s after now at best
        (
            pool_of(1, running={0: "slow"}),
            [Waiting(4.5, True, path=GROW)],
            Waiting(5.0, True, path=GROW),
            times(grow=[1.0] * 5 + [6.0] * 5),
            5.0,
            1.0,
        ),
    ],
)
def test_estimated_start(pool: Pool, queue, newcomer: Waiting, service: ServiceTimes, now: float, expected) -> None:
    got = estimated_start(pool, queue, newcomer, DEFAULT, service, now, queue_wait_seconds=2.0)
    assert got == (None if expected is None else pytest.approx(expected))


def test_a_resting_worker_starts_its_lane_when_its_rest_ends() -> None:
    pool = pool_of(1)
    pool.rest(0, now=0.0, seconds=4.0)  # out of GPU memory twice: no job for 4 s
    newcomer = Waiting(1.0, False, path=MEASURE)
    got = estimated_start(pool, [], newcomer, DEFAULT, times(measure=1.0), 1.0, queue_wait_seconds=30.0)
    assert got == pytest.approx(3.0)


def test_service_times_are_a_low_percentile_of_the_last_hundred() -> None:
    service = ServiceTimes()
    for seconds in [9.0] * 50 + [1.0] * 100:
        service.record(GROW, seconds)
    assert service.low(GROW) == 1.0, "the older 50 fell out of the window"
    for seconds in [0.5] * 9:
        service.record(GROW, seconds)
    assert service.low(GROW) == 1.0, "9 fast of 100: the 10th percentile is still 1 s"
    service.record(GROW, 0.5)
    assert service.low(GROW) == 0.5, "the 10th fast answer is the 10th percentile, the median says 1 s"
    assert service.low(MEASURE) is None


def test_a_low_time_follows_each_new_service_time() -> None:
    # the value is kept between records (an estimate asks for it once per waiter)
    service = times(grow=2.0)
    assert service.low(GROW) == 2.0
    service.record(GROW, 0.02)  # five slow answers, then the path is fast again
    assert service.low(GROW) == 0.02, "one fast answer is enough: the median stayed at 2 s"
    assert service.low(MEASURE) is None


@pytest.mark.parametrize(
    ("estimate", "queue_wait", "hopeless"),
    [
        (2.9, 2.0, False),  # within the 1 s margin
        (3.1, 2.0, True),
        (2.4, 1.0, True),  # a short wait: still the whole second of margin
        (24.0, 20.0, False),  # a long one: a quarter of it (5 s)
        (25.1, 20.0, True),
    ],
)
def test_an_early_refusal_needs_the_margin(estimate: float, queue_wait: float, hopeless: bool) -> None:
    assert surely_hopeless(estimate, queue_wait) is hopeless


def slot_order(slots: SlotUse, named: list[tuple[str, Waiting]], policy: SchedulingPolicy) -> list[str]:
    """What the dispatcher does when slots free up: take waiters until none may have one."""
    waiting, granted = list(named), []
    while (position := next_slot(slots, [w for _, w in waiting], policy)) is not None:
        name, waiter = waiting.pop(position)
        slots = SlotUse(slots.total, slots.in_use + 1, slots.slow_in_use + waiter.slow)
        granted.append(name)
    return granted


@pytest.mark.parametrize(
    ("slots", "waiters", "policy", "expected"),
    [
        # max_inflight 6, reservation 1: generations hold at most 5, a measurement gets the 6th
        (
            SlotUse(6),
            [slow(f"g{n}", n * 0.1) for n in range(10)] + [fast("m", 9)],
            DEFAULT,
            ["g0", "g1", "g2", "g3", "g4", "m"],
        ),
        # … and within the offset it goes first
        (
            SlotUse(6),
            [slow(f"g{n}", n * 0.1) for n in range(10)] + [fast("m", 2)],
            DEFAULT,
            ["m", "g0", "g1", "g2", "g3", "g4"],
        ),
        (SlotUse(6, 5, 5), [slow("g5", 0.5), fast("m", 2)], DEFAULT, ["m"]),
        # reservation 0: first come, first served (by the offset), every slot to anyone
        (SlotUse(6, 5, 5), [slow("g5", 0.5), fast("m", 6)], SchedulingPolicy(0, 5), ["g5"]),
        (SlotUse(6, 5, 5), [slow("g5", 0.5), fast("m", 2)], SchedulingPolicy(0, 5), ["m"]),
        # fast work may hold every slot: the reservation is for fast work, not against it
        (SlotUse(3), [fast(f"m{n}", n) for n in range(4)], DEFAULT, ["m0", "m1", "m2"]),
        # slots held by measurements are free of slow work: a generation may take one
        (SlotUse(3, 1, 0), [slow("g", 0)], DEFAULT, ["g"]),
        # no room for a reservation (max_inflight 1): the one slot serves everything
        (SlotUse(1), [slow("g", 0)], DEFAULT, ["g"]),
        (SlotUse(2, 2, 1), [fast("m", 0)], DEFAULT, []),  # every slot held: nobody
    ],
)
def test_next_slot(slots: SlotUse, waiters, policy: SchedulingPolicy, expected: list[str]) -> None:
    assert slot_order(slots, waiters, policy) == expected
