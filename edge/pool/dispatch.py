"""Dispatch: global in-flight slots, waiters for a worker in service order, explicit leases.

The dispatcher is the only runtime writer of the `Pool`; the prober and the forwarder
report to it (`record_probe`, `eject`), and it logs the pool's transitions. A request:

    async with dispatcher.slot(slow=s):                        # one of max_inflight, by class
        async with dispatcher.worker(tried, path=p, slow=s) as w:  # see edge.pool.scheduling
            with w.forwarding(timeout):                        # an abandoned forward drains,
                ...                                            # a busy answer holds: forward to w.url

Who gets the next slot and the next idle worker is `scheduling.next_slot` and
`scheduling.next_assignment` (fast and slow classes, the reservation, the slow offset);
a request that would wait longer than its queue wait by the estimate of
`scheduling.estimated_start` (and its margin) is refused at once (`EarlyRefusal`). A
forward answered "busy" (another gateway's job) gives its worker back marked busy in the
same step, before any waiter is handed it; the prober then follows that worker as after
a departure, until a probe says it is free (so does a probe that finds a worker busy
that this gateway does not use). A worker whose shared lease another gateway holds
(`HostLeased`) is given back held until that lease is announced given back
(`lease_released`, from `HostLeasing.watch`), looked at again after at most
`LEASE_RECHECK_SECONDS`: no probe can say more than the lease does.
Queue-wait timeouts (work never started) raise `Busy`; no online worker, on arrival or
while waiting, raises `Unavailable` at once. A client that leaves cancels its handler
(quart-trio): a wait ends and gives back its place; a forward left unfinished leaves its
worker draining: no new job until a probe sent after it says the host is free (the
prober probes it at once, then every 100 ms: `departures()`), or the attempt's timeout
has passed. Both context managers give back what they took on every exit path,
cancellation included.
"""

from __future__ import annotations

import logging
import math
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field

import trio

from edge.pool.errors import HostFailed, UpstreamError, WorkerBusy
from edge.pool.host_leases import NO_HOST_LEASES, HostLeased, HostLeasing, Turn
from edge.pool.pool import Pool, PoolEvent, ProbeResult, Thresholds, Transition
from edge.pool.scheduling import (
    SchedulingPolicy,
    ServiceTimes,
    SlotUse,
    Waiting,
    estimated_start,
    next_assignment,
    next_slot,
    slot_allows,
    surely_hopeless,
)

log = logging.getLogger("edge.pool")

# A waiter for a worker looks again this often: a draining worker's hold ends by time alone.
HOLD_CHECK_SECONDS = 1.0
# A waiter that has waited this part of its queue wait takes a host only seen free (pool.py):
# without it a gateway holding every shared host would keep it from the others for good.
IMPATIENT_FRACTION = 0.25
# A host another gateway leases is tried again after at most this long (its lease may have
# expired unannounced: the holder died, or a release was published while nobody listened).
LEASE_RECHECK_SECONDS = 1.0


class DispatchError(Exception):
    """The request never reached a worker."""


class Busy(DispatchError):
    """A queue wait timed out: every eligible worker stayed busy."""


class EarlyRefusal(Busy):
    """By the estimate, the request could not start within its queue wait: busy at once."""

    def __init__(self, retry_after_seconds: int) -> None:
        super().__init__(f"estimated start in {retry_after_seconds}s")
        self.retry_after_seconds = retry_after_seconds


class Unavailable(DispatchError):
    """No online worker could take the request."""


class WorkerLease:
    """The worker a request holds; returned to the pool when the `worker()` block exits.
    `impatient`: its request had waited long enough not to defer to another gateway."""

    def __init__(
        self, index: int, url: str, path: str, service_times: ServiceTimes, *, impatient: bool = False
    ) -> None:
        self.index = index
        self.url = url
        self.impatient = impatient
        self._path = path
        self._service_times = service_times
        self.abandoned_timeout: float | None = None  # set when a forward was left unfinished
        self.still_running_seconds: float | None = None  # the host answered, its job runs on (a timeout)
        self.busy_elsewhere = False  # it answered "busy": given back marked so
        self.leased_elsewhere_seconds: float | None = None  # another gateway holds its lease
        self.timed = True  # the answer's time is a service time (not the host's own 1007)
        self.handed_on = False  # given back, it went at once to a request waiting for it

    @contextmanager
    def forwarding(self, timeout_seconds: float) -> Iterator[None]:
        """Around the forward: an answer times the path (unless `timed` was cleared); a
        busy answer gives the worker back busy; leaving it any other way than with an
        answer or a finished exchange (cancelled, the client left) leaves the worker
        draining for at most `timeout_seconds`."""
        started = trio.current_time()
        try:
            yield
        except HostLeased as leased:
            self.leased_elsewhere_seconds = min(leased.seconds, LEASE_RECHECK_SECONDS)
            raise
        except WorkerBusy:
            self.busy_elsewhere = True
            raise
        except HostFailed as failed:
            if failed.may_still_run:  # drained like a departure: no job until a probe says free
                self.still_running_seconds = timeout_seconds
            raise
        except UpstreamError:  # the exchange ended (or never began): nothing left running because of it
            raise  # (a timeout ejects the worker instead; a host's answer naming its failure came whole)
        except BaseException:
            self.abandoned_timeout = timeout_seconds
            raise
        if self.timed:
            self._service_times.record(self._path, trio.current_time() - started)


@dataclass
class _Waiter:
    waiting: Waiting
    event: trio.Event = field(default_factory=trio.Event)
    index: int | None = None  # set when a worker is handed over
    impatient: bool = False  # … to one that had waited long enough not to defer
    unavailable: bool = False


@dataclass(eq=False)
class _SlotWaiter:
    waiting: Waiting
    event: trio.Event = field(default_factory=trio.Event)
    granted: bool = False
    unavailable: bool = False


@dataclass
class DispatchCounters:
    """Counted since start, read by the metrics at scrape time."""

    early_refusals: int = 0
    departures_queued: int = 0  # the handler was cancelled (its client left) while waiting
    departures_forward: int = 0  # … during its forward


@dataclass(frozen=True)
class DispatchStatistics:
    slots_in_use: int
    waiting_for_slot: int
    waiting_for_worker: int


class Dispatcher:
    """FIFO hand-out of global slots and pool workers; see the module docstring."""

    def __init__(
        self,
        pool: Pool,
        *,
        max_inflight: int,
        queue_wait_seconds: float,
        max_queue_wait_seconds: float,
        policy: SchedulingPolicy = SchedulingPolicy(),
        early_refusal: bool = True,
        host_leases: HostLeasing = NO_HOST_LEASES,
    ) -> None:
        """`early_refusal` False: every request waits its queue wait (a benchmark's control).
        `host_leases`: the shared leases the forwards take, when several gateways share hosts."""
        self.pool = pool
        self.policy = policy
        self.counters = DispatchCounters()
        self.service_times = ServiceTimes()
        self._early_refusal = early_refusal
        self._slots = SlotUse(max_inflight)
        self._queue_wait_seconds = queue_wait_seconds
        self._max_queue_wait_seconds = max_queue_wait_seconds
        self._slot_waiters: list[_SlotWaiter] = []
        self._waiters: list[_Waiter] = []
        self._to_follow: set[int] = set()  # workers held until a probe says free, for the prober
        self._to_follow_changed = trio.Event()
        self._leases: dict[int, WorkerLease] = {}  # worker index -> the request on it
        self._host_leases = host_leases
        pool.leases_shared = host_leases is not NO_HOST_LEASES

    # --- slots --------------------------------------------------------------------------

    @asynccontextmanager
    async def slot(self, *, slow: bool = False) -> AsyncIterator[None]:
        """One of `max_inflight` slots, given in service order with the reservation
        (`scheduling.next_slot`), waited for at most `max_queue_wait_seconds`."""
        if not self.pool.any_online():
            raise Unavailable
        if not self._slot_waiters and slot_allows(self._slots, slow, self.policy):
            self._take_slot(slow, 1)  # nobody waits, one is free: the common case
        else:
            waiter = _SlotWaiter(Waiting(trio.current_time(), slow))
            self._slot_waiters.append(waiter)
            self._hand_out_slots()
            if not waiter.granted:
                await self._wait_for_slot(waiter)
        try:
            yield
        finally:
            self._take_slot(slow, -1)
            self._hand_out_slots()

    async def _wait_for_slot(self, waiter: _SlotWaiter) -> None:
        try:
            with trio.move_on_after(self._max_queue_wait_seconds):
                await waiter.event.wait()
        except BaseException as leaving:
            if isinstance(leaving, trio.Cancelled):  # the client left while queued
                self.counters.departures_queued += 1
            self._abandon_slot(waiter)
            raise
        if waiter.granted:
            return
        self._abandon_slot(waiter)
        raise Unavailable if waiter.unavailable else Busy

    def _abandon_slot(self, waiter: _SlotWaiter) -> None:
        if waiter in self._slot_waiters:
            self._slot_waiters.remove(waiter)
        if waiter.granted:  # granted in the same step it gave up: give it back
            waiter.granted = False
            self._take_slot(waiter.waiting.slow, -1)
            self._hand_out_slots()

    def _take_slot(self, slow: bool, count: int) -> None:
        slots = self._slots
        self._slots = SlotUse(slots.total, slots.in_use + count, slots.slow_in_use + (count if slow else 0))

    def _hand_out_slots(self) -> None:
        if not self._slot_waiters:
            return
        while (position := next_slot(self._slots, [w.waiting for w in self._slot_waiters], self.policy)) is not None:
            waiter = self._slot_waiters.pop(position)
            self._take_slot(waiter.waiting.slow, 1)
            waiter.granted = True
            waiter.event.set()

    # --- workers ------------------------------------------------------------------------

    @asynccontextmanager
    async def worker(
        self,
        exclude: frozenset[int] = frozenset(),
        *,
        path: str = "",
        slow: bool = False,
        waiting_since: float | None = None,
    ) -> AsyncIterator[WorkerLease]:
        """Lease an idle eligible worker not in `exclude` (those already tried) for a
        request on `path` of the slow class or not. `waiting_since`: when the request
        first waited for a worker, for a later attempt: its place in the queue and its
        patience count from then (a request sent back each time it met another gateway's
        lease would otherwise never grow impatient, never mark a host wanted, and a
        gateway that keeps every host across its hand-overs would starve it)."""
        now = trio.current_time()
        self._expire_holds(now)
        if not self.pool.eligible(exclude):
            raise Unavailable
        waiter = _Waiter(Waiting(now if waiting_since is None else waiting_since, slow, exclude, path))
        self._waiters.append(waiter)
        self._hand_over()
        if waiter.index is None:
            self._refuse_if_hopeless(waiter)
            await self._wait_for_worker(waiter)
        assert waiter.index is not None
        lease = WorkerLease(
            waiter.index,
            self.pool.workers[waiter.index].url,
            path,
            self.service_times,
            impatient=waiter.impatient,
        )
        self._leases[lease.index] = lease
        try:
            yield lease
        finally:
            now = trio.current_time()
            self._leases.pop(lease.index, None)
            if lease.abandoned_timeout is not None:
                self.counters.departures_forward += 1
                self.pool.release(lease.index, now, drain_seconds=lease.abandoned_timeout)
            elif lease.still_running_seconds is not None:
                self.pool.release(lease.index, now, drain_seconds=lease.still_running_seconds)
            else:  # busy or leased elsewhere: marked in this same step, before the hand-over below
                self.pool.release(
                    lease.index,
                    now,
                    busy_elsewhere=lease.busy_elsewhere,
                    leased_elsewhere_seconds=lease.leased_elsewhere_seconds,
                )
            self._follow_if_held(lease.index)
            lease.handed_on = lease.index in self._hand_over()

    def _expire_holds(self, now: float) -> None:
        for index in self.pool.expire_holds(now):  # held again as stale: the prober looks
            self._follow_if_held(index)

    def _follow_if_held(self, index: int) -> None:
        """A worker held until a probe says it is free goes to the prober."""
        if self.pool.workers[index].awaiting_probe:
            self._to_follow.add(index)
            self._to_follow_changed.set()

    def _refuse_if_hopeless(self, waiter: _Waiter) -> None:
        """Early answer: the estimated start is past the queue wait, by the margin."""
        if not self._early_refusal:
            return
        others = [w.waiting for w in self._waiters if w is not waiter]
        now = trio.current_time()
        start = estimated_start(
            self.pool, others, waiter.waiting, self.policy, self.service_times, now, self._queue_wait_seconds
        )
        if start is not None and surely_hopeless(start, self._queue_wait_seconds):
            self._waiters.remove(waiter)
            self.counters.early_refusals += 1
            raise EarlyRefusal(max(1, math.ceil(start)))

    async def _wait_for_worker(self, waiter: _Waiter) -> None:
        try:
            with trio.move_on_after(self._queue_wait_seconds):
                while not waiter.event.is_set():
                    # a hold that ends by time alone (draining, a rest) frees a worker without
                    # an event: look again when the soonest one ends (a rest of 1 s is 1 s)
                    look_again = min(trio.current_time() + HOLD_CHECK_SECONDS, self.pool.next_hold_end())
                    with trio.move_on_at(look_again):
                        await waiter.event.wait()
                    self._hand_over()
        except BaseException as leaving:
            if isinstance(leaving, trio.Cancelled):  # the client left while queued
                self.counters.departures_queued += 1
            self._abandon(waiter)
            raise
        if waiter.index is not None:
            return
        self._abandon(waiter)
        raise Unavailable if waiter.unavailable else Busy

    def _abandon(self, waiter: _Waiter) -> None:
        """A waiter gives up (timeout, cancellation): it must not keep a worker or a place."""
        if waiter in self._waiters:
            self._waiters.remove(waiter)
        if waiter.index is not None:
            self.pool.release(waiter.index, trio.current_time())
            waiter.index = None
            self._hand_over()

    def _hand_over(self) -> list[int]:
        """Give idle workers to waiters in service order; cheap when nobody waits. The
        workers given."""
        given: list[int] = []
        if not self._waiters:
            return given
        now = trio.current_time()
        self._expire_holds(now)
        impatient_before = now - IMPATIENT_FRACTION * self._queue_wait_seconds
        while (
            pair := next_assignment(self.pool, [w.waiting for w in self._waiters], self.policy, impatient_before)
        ) is not None:
            position, index = pair
            waiter = self._waiters.pop(position)
            self.pool.lease(index, now, path=waiter.waiting.path, slow=waiter.waiting.slow)
            waiter.index, waiter.impatient = index, waiter.waiting.arrived_at < impatient_before
            waiter.event.set()
            given.append(index)
        return given

    async def watch_host_leases(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Hear of other gateways' leases given back (and tell the leases about turns here)."""
        await self._host_leases.watch(self, task_status=task_status)

    def turn(self, url: str) -> Turn:
        """The request on the worker at `url` (or about to take it), for its shared lease."""
        lease = next((lease for lease in self._leases.values() if lease.url == url), None)
        if lease is None:
            return Turn()
        return Turn(impatient=lease.impatient, successor_waiting=self._successor_waiting(lease.index))

    def wants(self, index: int) -> bool:
        """Should a probe of worker `index` tell its host that a request here has waited long
        for it? Without shared leases: it is held busy elsewhere and an impatient waiter could
        take it (with leases, the lease's wanted mark says so)."""
        worker = self.pool.workers[index]
        if self.pool.leases_shared or not worker.reported_busy or worker.leased:
            return False
        impatient_before = trio.current_time() - IMPATIENT_FRACTION * self._queue_wait_seconds
        impatient = [w for w in self._waiters if w.waiting.arrived_at < impatient_before]
        return any(e.index == index for w in impatient for e in self.pool.eligible(w.waiting.exclude))

    def asked_for(self, index: int) -> None:
        """A probe told worker `index`'s host that a request here waits for it (`wants`)."""
        self.pool.asked_for(index, trio.current_time())

    def _successor_waiting(self, index: int) -> bool:
        """Will a waiter here be handed worker `index` once its request ends? Those that
        may take it outnumber the other workers idle for them (they go first, idle longer)."""
        takers = [w for w in self._waiters if any(e.index == index for e in self.pool.eligible(w.waiting.exclude))]
        idle = {e.index for w in takers for e in self.pool.eligible(w.waiting.exclude) if e.idle}
        return len(takers) > len(idle)

    async def workers_to_follow(self) -> list[int]:
        """Wait until workers were given back held until a probe says free (a forward
        abandoned, a busy answer); those since the last call."""
        await self._to_follow_changed.wait()
        self._to_follow_changed = trio.Event()
        held, self._to_follow = sorted(self._to_follow), set()
        return held

    def _fail_hopeless_waiters(self) -> None:
        """Waiters no online worker can ever serve fail now, not after queue_wait_seconds."""
        for waiter in list(self._waiters):
            if not self.pool.eligible(waiter.waiting.exclude):
                waiter.unavailable = True
                self._waiters.remove(waiter)
                waiter.event.set()
        if not self.pool.any_online():
            for slot_waiter in self._slot_waiters:
                slot_waiter.unavailable = True
                slot_waiter.event.set()
            self._slot_waiters.clear()

    # --- settings reload ------------------------------------------------------------------

    def reconfigure(
        self,
        workers: Sequence[str],
        primary_workers: Sequence[str],
        thresholds: Thresholds,
        *,
        max_inflight: int,
        queue_wait_seconds: float,
        max_queue_wait_seconds: float,
        policy: SchedulingPolicy,
    ) -> None:
        """Apply reloaded settings; requests in flight keep their slot and their worker."""
        for event in self.pool.reconfigure(workers, primary_workers, thresholds):
            _log_event(event)
        self.policy = policy
        self._slots = SlotUse(max_inflight, self._slots.in_use, self._slots.slow_in_use)
        self._queue_wait_seconds = queue_wait_seconds
        self._max_queue_wait_seconds = max_queue_wait_seconds
        self._fail_hopeless_waiters()
        self._hand_out_slots()
        self._hand_over()

    # --- reports from the prober and the forwarder --------------------------------------

    def record_probe(self, index: int, result: ProbeResult) -> None:
        was_held = self.pool.workers[index].awaiting_probe
        event = self.pool.record_probe(index, result, trio.current_time())
        _log_event(event)
        # the host's own word on another gateway's lease there: idle under it, the lease is stale
        self._host_leases.host_probed(self.pool.workers[index].url, result.sent_at, free=result.ok and not result.busy)
        if not was_held and not self.pool.leases_shared:
            # a round's probe found it busy with a job not ours: followed as after a busy answer
            # (with shared leases the holder's release is announced: no probe needed)
            self._follow_if_held(index)
        self._fail_hopeless_waiters()
        self._hand_over()

    def lease_released(self, url: str | None) -> None:
        """Another gateway gave back its lease on `url` (None: any may have been missed)."""
        if self.pool.lease_released(url):
            self._hand_over()

    def expire_holds(self) -> None:
        """A hold that ends by time alone (draining) ends now if due."""
        self._expire_holds(trio.current_time())
        self._hand_over()

    def eject(self, index: int, reason: str, *, cooldown_seconds: float | None = None) -> PoolEvent | None:
        """Offline at once, for `cooldown_seconds` (else the thresholds'); the event when it was online."""
        event = self.pool.eject(index, trio.current_time(), reason, cooldown_seconds=cooldown_seconds)
        _log_event(event)
        self._fail_hopeless_waiters()
        self._hand_over()  # ejecting the last primary makes the idle backups eligible
        return event

    def rest(self, index: int, seconds: float) -> None:
        """Worker `index` stays online but gets no job for `seconds` (a failure kind's backoff)."""
        self.pool.rest(index, trio.current_time(), seconds)

    def count_failure(self, index: int, kind: str) -> int:
        """One more failure of `kind` in a row from worker `index`; the count (the backoff's n)."""
        return self.pool.count_failure(index, kind)

    def answered(self, index: int) -> None:
        """Worker `index` answered well: its failures in a row start again."""
        self.pool.answered(index)

    @property
    def queue_wait_seconds(self) -> float:
        """How long a request may wait for a worker (a reload may change it)."""
        return self._queue_wait_seconds

    def statistics(self) -> DispatchStatistics:
        return DispatchStatistics(
            slots_in_use=self._slots.in_use,
            waiting_for_slot=len(self._slot_waiters),
            waiting_for_worker=len(self._waiters),
        )


def _log_event(event: PoolEvent | None) -> None:
    if event is None:
        return
    if event.transition is Transition.CAME_ONLINE:
        log.info("Worker 上线 | worker=%d | url=%s", event.index, event.url)
    elif event.transition is Transition.ADDED:
        log.info("Worker 已加入（待探活后接收请求） | worker=%d | url=%s", event.index, event.url)
    elif event.transition is Transition.RETIRED:
        log.info("Worker 已移除（不再分配新请求） | worker=%d | url=%s", event.index, event.url)
    elif event.transition is Transition.WENT_OFFLINE:
        log.warning("Worker 下线 | worker=%d | url=%s | 原因=%s", event.index, event.url, event.reason)
    elif event.transition is Transition.LOADING:
        log.info("Worker 模型加载中（loading），暂未上线 | worker=%d | url=%s", event.index, event.url)
    elif event.transition is Transition.UNREACHABLE:
        log.warning("Worker 探活失败，未上线 | worker=%d | url=%s | 原因=%s", event.index, event.url, event.reason)
    else:
        log.warning(
            "Worker 下线（转发失败，进入隔离期） | worker=%d | url=%s | 原因=%s", event.index, event.url, event.reason
        )
