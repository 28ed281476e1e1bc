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
- `next_slot`: the next waiter for one of the `max_inflight` slots, in the same service
  order, with the same reservation: a slow request never takes a slot that would leave
  fewer than `reserved_fast_workers` slots free of slow requests, so a burst of
  generations holding every slot (most of them only waiting for a worker) never makes a
  measurement wait at the slot while the reserved host is idle.
- `estimated_start`: seconds until a newcomer could start, replaying the waiters of its
  class ahead of it against the running jobs with each path's low service time (the 10th
  percentile of its last 100 answers, not the median: one fast answer after slow ones
  pulls it down at once); None when some time is unknown (then the request simply
  waits). It is meant as a lower bound: what it cannot time (a worker busy for another
  gateway, one draining) counts as free now, and a waiter ahead that would time out
  before its turn even so is left out of the replay. `surely_hopeless` then asks for a
  margin above the queue wait before an early refusal is given.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from edge.pool.pool import Pool, WorkerState
from shared.percentiles import percentile

# gateway.md § Scheduling: a low percentile of a path's last 100 answers, none before 5.
SERVICE_TIME_SAMPLES = 100
SERVICE_TIME_MIN_SAMPLES = 5
SERVICE_TIME_LOW_FRACTION = 0.10  # nearest rank: with 5 to 10 answers, the fastest of them
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


ServiceTime = Callable[[str], "float | None"]


def surely_hopeless(estimated_seconds: float, queue_wait_seconds: float) -> bool:
    """Refuse at once only when the estimate is past the queue wait by the margin."""
    margin = max(REFUSAL_MARGIN_SECONDS, REFUSAL_MARGIN_FRACTION * queue_wait_seconds)
    return estimated_seconds > queue_wait_seconds + margin


def estimated_start(
    pool: Pool,
    queue: Sequence[Waiting],
    newcomer: Waiting,
    policy: SchedulingPolicy,
    service_time: ServiceTime,
    now: float,
    queue_wait_seconds: float = math.inf,
) -> float | None:
    """Seconds from `now` until `newcomer` (not in `queue`) could start; None: unknown.
    A waiter ahead whose turn, by the replay, comes after its own queue wait ran out
    (`queue_wait_seconds` from its arrival) will have left by then: it takes no lane."""
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
        if lanes[0] > waiting.arrived_at + queue_wait_seconds - now:
            continue  # it times out before a lane frees, even by the lower bound
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
    """Each path's recent service times (the forward of a request the host served: not a
    failure, not the host's own 1007 such as its inference timeout), bounded."""

    def __init__(self) -> None:
        self._by_path: dict[str, deque[float]] = {}
        self._lows: dict[str, float | None] = {}  # until the next record: an estimate asks for each waiter

    def record(self, path: str, seconds: float) -> None:
        samples = self._by_path.get(path)
        if samples is None:
            if len(self._by_path) >= MAX_TIMED_PATHS:
                return
            samples = self._by_path[path] = deque(maxlen=SERVICE_TIME_SAMPLES)
        samples.append(seconds)
        self._lows.pop(path, None)

    def low(self, path: str) -> float | None:
        """The path's low service time (`SERVICE_TIME_LOW_FRACTION`), None before 5 answers."""
        if path in self._lows:
            return self._lows[path]
        samples = self._by_path.get(path)
        enough = samples is not None and len(samples) >= SERVICE_TIME_MIN_SAMPLES
        low = percentile(samples, SERVICE_TIME_LOW_FRACTION) if samples is not None and enough else None
        if samples is not None:  # an unknown path stays uncached: the cache is bounded as the paths are
            self._lows[path] = low
        return low
