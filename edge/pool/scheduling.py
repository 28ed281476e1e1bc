"""Who is served next, and when a waiter could start: pure functions of the pool's state.

No I/O, no clock, no trio: the dispatcher passes `now` and the waiters it holds, and these
functions answer (gateway.md § Scheduling), so that they are tables in the tests.

- `next_assignment`: the next (waiter, worker) pair. Waiters are taken in service order
  (arrival, a slow one counted `slow_priority_offset_seconds` later); each gets the idle
  eligible worker idle the longest, except that a slow waiter never takes a worker when
  that would leave fewer than `reserved_fast_workers` eligible online workers not running
  slow jobs (unless the eligible pool is no larger than the reservation). A waiter that
  cannot be served lets the next one try: a measurement behind a reserved-out generation
  takes the reserved worker. A waiter that arrived before `impatient_before` (it has
  waited a good part of its queue wait) no longer defers to another gateway's next job:
  it may take a worker only seen free (`Pool.select(seen_free=True)`), or a gateway
  that holds every shared host would keep them from the others for good.
- `next_slot`: the next waiter for one of the `max_inflight` slots, in the same service
  order, with the same reservation: a slow request never takes a slot that would leave
  fewer than `reserved_fast_workers` slots free of slow requests, so a burst of
  generations holding every slot (most of them only waiting for a worker) never makes a
  measurement wait at the slot while the reserved host is idle.
- `estimated_start`: seconds before which a newcomer cannot start, a lower bound as far as
  service times stay between each path's low and high time (the 10th and 90th
  percentiles of its last 100 answers, never the median; the host's own 1007s are not
  timed): a waiter ahead counts only while its own wait lasts, unless it is sure to be
  served even at the high times; the lanes free at the low times. None when some time is
  unknown (then the request simply waits); a worker busy for another gateway, or
  draining, counts as free now. `surely_hopeless` then asks for a margin above the queue
  wait before an early refusal is given.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, cast

from edge.pool.pool import Pool, WorkerState
from shared.percentiles import percentiles

# gateway.md § Scheduling: a low percentile of a path's last 100 answers, none before 5.
SERVICE_TIME_SAMPLES = 100
SERVICE_TIME_MIN_SAMPLES = 5
SERVICE_TIME_LOW_FRACTION = 0.10  # nearest rank: with 5 to 10 answers, the fastest of them
SERVICE_TIME_HIGH_FRACTION = 0.90  # … the slowest of them
# An early refusal needs the estimate past the queue wait by this much (seconds, and a
# fraction of the wait): a bound from recent history is no promise about the next answers.
REFUSAL_MARGIN_SECONDS = 1.0
REFUSAL_MARGIN_FRACTION = 0.25
MAX_TIMED_PATHS = 64  # the GPU endpoints are five; anything beyond is not timed
# The classes as `/admin/stats` and the metrics name them (slow = `edge.dispatch.slow_paths`).
FAST, SLOW = "fast", "slow"
QUEUE_CLASSES = (FAST, SLOW)


def queue_class(path: str, is_slow: Callable[[str], bool]) -> str:
    return SLOW if is_slow(path) else FAST


def all_fast(path: str) -> bool:
    """The classifier until the gateway sets the live one (`ApiService.is_slow`)."""
    return False


@dataclass(frozen=True)
class SchedulingPolicy:
    """`edge.dispatch.reserved_fast_workers` and `slow_priority_offset_seconds`."""

    reserved_fast_workers: int = 1
    slow_priority_offset_seconds: float = 5.0


@dataclass(frozen=True)
class Waiting:
    """A request waiting for a worker, as the scheduler sees it."""

    arrived_at: float
    slow: bool
    exclude: frozenset[int] = frozenset()  # workers it already tried
    path: str = ""


def priority(waiting: Waiting, policy: SchedulingPolicy) -> float:
    """Its place in line: the arrival time, a slow request's pushed back by the offset."""
    return waiting.arrived_at + (policy.slow_priority_offset_seconds if waiting.slow else 0.0)


def service_order(waiters: Sequence[Waiting], policy: SchedulingPolicy) -> list[int]:
    """Positions in `waiters`, first to be served first; ties keep the order given."""
    return sorted(range(len(waiters)), key=lambda position: priority(waiters[position], policy))


def reservation_allows_slow(pool: Pool, policy: SchedulingPolicy) -> bool:
    """May a slow request take one more (idle, hence not slow-running) eligible worker?"""
    tier = pool.eligible()
    if len(tier) <= policy.reserved_fast_workers:
        return True  # one host (or a pool no larger than the reservation) still serves everything
    free_of_slow = sum(not w.running_slow for w in tier)
    return free_of_slow - 1 >= policy.reserved_fast_workers


def pick_worker(
    pool: Pool, waiting: Waiting, policy: SchedulingPolicy, impatient_before: float = -math.inf
) -> WorkerState | None:
    """The worker `waiting` would get now, or None."""
    worker = pool.select(waiting.exclude, slow=waiting.slow, seen_free=waiting.arrived_at < impatient_before)
    if worker is None or (waiting.slow and not reservation_allows_slow(pool, policy)):
        return None
    return worker


def next_assignment(
    pool: Pool, waiters: Sequence[Waiting], policy: SchedulingPolicy, impatient_before: float = -math.inf
) -> tuple[int, int] | None:
    """(position in `waiters`, worker index) of the next hand-over, or None; waiters that
    arrived before `impatient_before` may take a worker only seen free."""
    impatient = any(w.arrived_at < impatient_before for w in waiters)
    if not waiters or pool.select(seen_free=impatient) is None:
        return None  # nothing idle at all: cheap when the pool is saturated
    for position in service_order(waiters, policy):
        worker = pick_worker(pool, waiters[position], policy, impatient_before)
        if worker is not None:
            return position, worker.index
    return None


@dataclass(frozen=True)
class SlotUse:
    """The `max_inflight` slots: how many exist, how many are held, how many by slow requests."""

    total: int
    in_use: int = 0
    slow_in_use: int = 0


def slot_allows(slots: SlotUse, slow: bool, policy: SchedulingPolicy) -> bool:
    """May a request of this class take a slot now?"""
    if slots.in_use >= slots.total:
        return False
    if not slow or slots.total <= policy.reserved_fast_workers:
        return True  # no room for a reservation: every slot serves everything
    return slots.total - slots.slow_in_use - 1 >= policy.reserved_fast_workers


def next_slot(slots: SlotUse, waiters: Sequence[Waiting], policy: SchedulingPolicy) -> int | None:
    """Position in `waiters` of the next one to get a slot, or None; a slow waiter the
    reservation holds back lets the next one try, as at the worker."""
    if slots.in_use >= slots.total:
        return None
    for position in service_order(waiters, policy):
        if slot_allows(slots, waiters[position].slow, policy):
            return position
    return None


class ServiceTimeBounds(Protocol):
    """A path's recent service times as two bounds: `low` (few answers were faster) and
    `high` (few were slower); None while unknown."""

    def low(self, path: str) -> float | None: ...

    def high(self, path: str) -> float | None: ...


def surely_hopeless(estimated_seconds: float, queue_wait_seconds: float) -> bool:
    """Refuse at once only when the estimate is past the queue wait by the margin."""
    margin = max(REFUSAL_MARGIN_SECONDS, REFUSAL_MARGIN_FRACTION * queue_wait_seconds)
    return estimated_seconds > queue_wait_seconds + margin


def estimated_start(
    pool: Pool,
    queue: Sequence[Waiting],
    newcomer: Waiting,
    policy: SchedulingPolicy,
    times: ServiceTimeBounds,
    now: float,
    queue_wait_seconds: float = math.inf,
) -> float | None:
    """Seconds from `now` before which `newcomer` (not in `queue`) cannot start; None: unknown.

    A lower bound, as far as service times stay within their bounds. Of the waiters of its
    class ahead of it, one is *sure* to be served before it when, even with every job at
    its `high` time and every waiter ahead of it served, it starts within its own queue
    wait (`queue_wait_seconds` from its arrival); any other may time out before its turn
    and is counted only until its wait ends. The newcomer can start once the lanes of its
    class, with every job at its `low` time, freed often enough for every sure waiter and
    every other one still waiting, and once more for it.
    """
    if times.low(newcomer.path) is None:
        return None
    key = priority(newcomer, policy)
    ahead = sorted((w for w in queue if w.slow == newcomer.slow and priority(w, policy) <= key),
                   key=lambda w: priority(w, policy))  # fmt: skip
    lows = [times.low(w.path) for w in ahead]
    highs = [times.high(w.path) for w in ahead]
    earliest = _lanes(pool, newcomer, policy, now, times.low, past_end=0.0)
    latest = _lanes(pool, newcomer, policy, now, times.high, past_end=math.inf)
    if earliest is None or latest is None or not earliest or None in lows or None in highs:
        return None
    sure, deadlines = 0, []
    heapq.heapify(latest)
    for waiting, high in zip(ahead, highs, strict=True):
        deadline = waiting.arrived_at + queue_wait_seconds - now
        if latest[0] <= deadline:
            sure += 1
        else:
            deadlines.append(deadline)
        heapq.heapreplace(latest, latest[0] + cast(float, high))
    shortest = min(cast("list[float]", lows), default=math.inf)
    return _first_start(earliest, shortest, sure, sorted(deadlines))


def _first_start(lanes: list[float], shortest: float, sure: int, deadlines: list[float]) -> float:
    """The first moment the lanes (jobs of `shortest` seconds back to back) have freed once
    for each of `sure` waiters, each other waiter whose deadline is not past, and the newcomer."""
    heapq.heapify(lanes)
    freed, waiting, gone = 0, sure + len(deadlines), 0
    while True:
        if gone < len(deadlines) and deadlines[gone] < lanes[0]:
            at = deadlines[gone]  # that waiter left: one fewer to serve first
            gone, waiting = gone + 1, waiting - 1
        else:
            at = lanes[0]
            freed += 1
            heapq.heapreplace(lanes, at + shortest)
        if freed >= waiting + 1:
            return at


def _lanes(
    pool: Pool,
    newcomer: Waiting,
    policy: SchedulingPolicy,
    now: float,
    seconds_for: Callable[[str], float | None],
    past_end: float,
) -> list[float] | None:
    """When each worker the newcomer's class may use is next free (seconds from now), by
    `seconds_for` a running job's path; a job past that time ends in `past_end` seconds."""
    slow_running: list[float] = []
    others: list[float] = []
    for worker in pool.eligible(newcomer.exclude, slow=newcomer.slow):
        free_in = 0.0
        if worker.leased:
            seconds = seconds_for(worker.leased_path)
            if seconds is None:
                return None
            left = seconds - (now - worker.leased_at)
            free_in = left if left > 0 else past_end
        if worker.resting_until is not None:  # a failure kind's backoff: no job before it ends
            free_in = max(free_in, worker.resting_until - now)
        (slow_running if worker.running_slow else others).append(free_in)
    if not newcomer.slow:
        return slow_running + others
    everyone = len(pool.eligible())
    if everyone <= policy.reserved_fast_workers:
        return slow_running + others
    # Slow jobs run on at most this many workers at once: those running slow jobs now,
    # then whichever others free up first.
    slow_lanes = everyone - policy.reserved_fast_workers
    return (sorted(slow_running) + sorted(others))[:slow_lanes]


class ServiceTimes:
    """Each path's recent service times (the forward of a request the host served: not a
    failure, not the host's own 1007 such as its inference timeout), bounded."""

    def __init__(self) -> None:
        self._by_path: dict[str, deque[float]] = {}
        self._bounds: dict[str, tuple[float, float] | None] = {}  # until the next record: asked for each waiter

    def record(self, path: str, seconds: float) -> None:
        samples = self._by_path.get(path)
        if samples is None:
            if len(self._by_path) >= MAX_TIMED_PATHS:
                return
            samples = self._by_path[path] = deque(maxlen=SERVICE_TIME_SAMPLES)
        samples.append(seconds)
        self._bounds.pop(path, None)

    def low(self, path: str) -> float | None:
        """The path's low service time (`SERVICE_TIME_LOW_FRACTION`), None before 5 answers."""
        bounds = self._bounds_of(path)
        return None if bounds is None else bounds[0]

    def high(self, path: str) -> float | None:
        """The path's high service time (`SERVICE_TIME_HIGH_FRACTION`), None before 5 answers."""
        bounds = self._bounds_of(path)
        return None if bounds is None else bounds[1]

    def _bounds_of(self, path: str) -> tuple[float, float] | None:
        if path in self._bounds:
            return self._bounds[path]
        samples = self._by_path.get(path)
        if samples is None:  # an unknown path stays uncached: the cache is bounded as the paths are
            return None
        bounds = None
        if len(samples) >= SERVICE_TIME_MIN_SAMPLES:
            low, high = percentiles(samples, SERVICE_TIME_LOW_FRACTION, SERVICE_TIME_HIGH_FRACTION)
            bounds = (low, high)
        self._bounds[path] = bounds
        return bounds
