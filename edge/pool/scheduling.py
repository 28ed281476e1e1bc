"""Who is served next, and when a waiter could start: pure functions of the pool's state.

No I/O, no clock, no trio: the dispatcher passes `now` and the waiters it holds, and these
functions answer (gateway.md § Scheduling), so that they are tables in the tests.

- `next_assignment`: the next (waiter, worker) pair. Waiters are taken in service order
  (arrival, a slow one counted `slow_priority_offset_seconds` later); each gets the idle
  eligible worker idle the longest, except that a slow waiter never takes a worker when
  that would leave fewer than `reserved_fast_workers` eligible online workers not running
  slow jobs (unless the eligible pool is no larger than the reservation). A waiter that
  cannot be served lets the next one try: a measurement behind a reserved-out generation
  takes the reserved worker.
- `estimated_start`: seconds until a newcomer could start, replaying the waiters of its
  class ahead of it against the running jobs with each path's median service time; None
  when some time is unknown (then the request simply waits). It is a lower bound: what it
  cannot time (a worker busy for another gateway, one draining) counts as free now, so an
  early refusal is only given when waiting is surely hopeless.
"""

from __future__ import annotations

import heapq
import statistics
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from edge.pool.pool import Pool, WorkerState

# gateway.md § Scheduling: the median of a path's last 100 answers, none before 5.
SERVICE_TIME_SAMPLES = 100
SERVICE_TIME_MIN_SAMPLES = 5
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


def pick_worker(pool: Pool, waiting: Waiting, policy: SchedulingPolicy) -> WorkerState | None:
    """The worker `waiting` would get now, or None."""
    worker = pool.select(waiting.exclude, slow=waiting.slow)
    if worker is None or (waiting.slow and not reservation_allows_slow(pool, policy)):
        return None
    return worker


def next_assignment(pool: Pool, waiters: Sequence[Waiting], policy: SchedulingPolicy) -> tuple[int, int] | None:
    """(position in `waiters`, worker index) of the next hand-over, or None."""
    if not waiters or pool.select() is None:
        return None  # nothing idle at all: cheap when the pool is saturated
    for position in service_order(waiters, policy):
        worker = pick_worker(pool, waiters[position], policy)
        if worker is not None:
            return position, worker.index
    return None


ServiceTime = Callable[[str], "float | None"]


def estimated_start(
    pool: Pool,
    queue: Sequence[Waiting],
    newcomer: Waiting,
    policy: SchedulingPolicy,
    service_time: ServiceTime,
    now: float,
) -> float | None:
    """Seconds from `now` until `newcomer` (not in `queue`) could start; None: unknown."""
    if service_time(newcomer.path) is None:
        return None
    lanes = _lanes(pool, newcomer, policy, service_time, now)
    if not lanes:
        return None
    key = priority(newcomer, policy)
    ahead = [w for w in queue if w.slow == newcomer.slow and priority(w, policy) <= key]
    heapq.heapify(lanes)
    for waiting in sorted(ahead, key=lambda w: priority(w, policy)):
        seconds = service_time(waiting.path)
        if seconds is None:
            return None
        heapq.heapreplace(lanes, lanes[0] + seconds)
    return lanes[0]


def _lanes(
    pool: Pool, newcomer: Waiting, policy: SchedulingPolicy, service_time: ServiceTime, now: float
) -> list[float] | None:
    """When each worker the newcomer's class may use is next free (seconds from now)."""
    slow_running: list[float] = []
    others: list[float] = []
    for worker in pool.eligible(newcomer.exclude, slow=newcomer.slow):
        free_in = 0.0
        if worker.leased:
            seconds = service_time(worker.leased_path)
            if seconds is None:
                return None
            free_in = max(0.0, seconds - (now - worker.leased_at))
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
    """Each path's recent service times (the forward of an answered request), bounded."""

    def __init__(self) -> None:
        self._by_path: dict[str, deque[float]] = {}
        self._medians: dict[str, float | None] = {}  # until the next record: an estimate asks for each waiter

    def record(self, path: str, seconds: float) -> None:
        samples = self._by_path.get(path)
        if samples is None:
            if len(self._by_path) >= MAX_TIMED_PATHS:
                return
            samples = self._by_path[path] = deque(maxlen=SERVICE_TIME_SAMPLES)
        samples.append(seconds)
        self._medians.pop(path, None)

    def median(self, path: str) -> float | None:
        if path in self._medians:
            return self._medians[path]
        samples = self._by_path.get(path)
        median = None if samples is None or len(samples) < SERVICE_TIME_MIN_SAMPLES else statistics.median(samples)
        if samples is not None:  # an unknown path stays uncached: the cache is bounded as the paths are
            self._medians[path] = median
        return median
