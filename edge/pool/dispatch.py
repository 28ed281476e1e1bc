"""Dispatch: global in-flight slots, FIFO waiters for a worker, and explicit leases.

The dispatcher is the only runtime writer of the `Pool`; the prober and the forwarder
report to it (`record_probe`, `eject`), and it logs the pool's transitions. A request:

    async with dispatcher.slot():                  # one of max_inflight, FIFO
        async with dispatcher.worker(tried) as w:  # an idle eligible worker, FIFO
            ...                                    # forward to w.url

Queue-wait timeouts (work never started) raise `Busy`; no online worker, on arrival or
while waiting, raises `Unavailable` at once; a client that leaves while its request waits
(`ClientWatch.mark_left`) ends those waits with `ClientLeft`, but never a forward already
under way (the worker's state must stay true). Upstream timeouts are the forwarder's
business. Both context managers give back what they took on every exit path,
cancellation included.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager, nullcontext
from dataclasses import dataclass, field

import trio

from edge.pool.pool import Pool, PoolEvent, ProbeResult, Thresholds, Transition

log = logging.getLogger("edge.pool")

# A worker that answered "busy" (another gateway's job) is skipped this long, or until a
# probe sees it free (gateway.md § Several gateways).
BUSY_ELSEWHERE_SECONDS = 1.0


class DispatchError(Exception):
    """The request never reached a worker."""


class Busy(DispatchError):
    """A queue wait timed out: every eligible worker stayed busy."""


class Unavailable(DispatchError):
    """No online worker could take the request."""


class ClientLeft(DispatchError):
    """The client disconnected while its request was still waiting in the queue."""


class ClientWatch:
    """Lets a request's client end the request's queue waits, and only those.

    Hypercorn does not cancel an application whose client disconnects. While a request
    waits for a slot or a worker, `departure()` (the ASGI layer's "wait until the client
    disconnects") is awaited beside the wait, and a departure ends the wait with
    `ClientLeft`, giving back the place. Nothing listens outside the waits: a request
    that never waits pays nothing, and a forward under way is never interrupted.
    """

    def __init__(self, departure: Callable[[], Awaitable[None]] | None = None) -> None:
        self.left = False
        self._departure = departure

    def mark_left(self) -> None:
        self.left = True

    @asynccontextmanager
    async def cancellable_wait(self) -> AsyncIterator[None]:
        if self.left:
            raise ClientLeft
        if self._departure is None:
            yield
            return
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._end_on_departure, nursery.cancel_scope)
                try:
                    yield
                finally:
                    nursery.cancel_scope.cancel()  # the wait is over: stop listening
        except BaseExceptionGroup as group:
            # the listener never raises: what is inside is the wait's own outcome (Busy, …)
            raise group.exceptions[0] if len(group.exceptions) == 1 else group
        if self.left:
            raise ClientLeft

    async def _end_on_departure(self, wait: trio.CancelScope) -> None:
        await self._departure()  # type: ignore[misc]
        self.left = True
        wait.cancel()


@dataclass(frozen=True)
class WorkerLease:
    """The worker a request holds; returned to the pool when the `worker()` block exits."""

    index: int
    url: str


@dataclass
class _Waiter:
    exclude: frozenset[int]
    event: trio.Event = field(default_factory=trio.Event)
    index: int | None = None  # set when a worker is handed over
    unavailable: bool = False


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
    ) -> None:
        self.pool = pool
        self._slots = trio.CapacityLimiter(max_inflight)
        self._queue_wait_seconds = queue_wait_seconds
        self._max_queue_wait_seconds = max_queue_wait_seconds
        self._slot_waiters: set[trio.CancelScope] = set()
        self._waiters: deque[_Waiter] = deque()

    # --- slots --------------------------------------------------------------------------

    @asynccontextmanager
    async def slot(self, watch: ClientWatch | None = None) -> AsyncIterator[None]:
        # The borrower is a token object, not the current task, so the slot's owner is
        # this block whatever task machinery runs it.
        token = object()
        if not self.pool.any_online():
            raise Unavailable
        try:
            self._slots.acquire_on_behalf_of_nowait(token)
        except trio.WouldBlock:
            async with watch.cancellable_wait() if watch else nullcontext():
                await self._wait_for_slot(token)
        try:
            yield
        finally:
            self._slots.release_on_behalf_of(token)

    async def _wait_for_slot(self, token: object) -> None:
        with trio.move_on_after(self._max_queue_wait_seconds) as timeout:
            with trio.CancelScope() as nothing_online:
                self._slot_waiters.add(nothing_online)
                try:
                    await self._slots.acquire_on_behalf_of(token)
                    return
                finally:
                    self._slot_waiters.discard(nothing_online)
            raise Unavailable
        if timeout.cancelled_caught:
            raise Busy

    # --- workers ------------------------------------------------------------------------

    @asynccontextmanager
    async def worker(
        self, exclude: frozenset[int] = frozenset(), watch: ClientWatch | None = None
    ) -> AsyncIterator[WorkerLease]:
        """Lease an idle eligible worker not in `exclude` (those already tried)."""
        index = self._take_now(exclude)
        if index is None:
            index = await self._wait_for_worker(exclude, watch)
        try:
            yield WorkerLease(index, self.pool.workers[index].url)
        finally:
            self.pool.release(index, trio.current_time())
            self._hand_over()

    def _take_now(self, exclude: frozenset[int]) -> int | None:
        self.pool.expire_busy_elsewhere(trio.current_time())
        if not self.pool.eligible(exclude):
            raise Unavailable
        if self._waiters:  # first come, first served: queue behind earlier requests
            return None
        worker = self.pool.select(exclude)
        if worker is None:
            return None
        self.pool.lease(worker.index)
        return worker.index

    async def _wait_for_worker(self, exclude: frozenset[int], watch: ClientWatch | None) -> int:
        waiter = _Waiter(exclude)
        self._waiters.append(waiter)
        self._hand_over()
        try:
            async with watch.cancellable_wait() if watch else nullcontext():
                with trio.move_on_after(self._queue_wait_seconds):
                    while not waiter.event.is_set():
                        # a worker marked busy elsewhere frees itself by time alone, not by an event
                        with trio.move_on_after(BUSY_ELSEWHERE_SECONDS):
                            await waiter.event.wait()
                        self._hand_over()
        except BaseException:
            self._abandon(waiter)
            raise
        if waiter.index is not None:
            return waiter.index
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

    def _hand_over(self) -> None:
        """Give idle workers to waiters in arrival order; cheap when nobody waits."""
        if not self._waiters:
            return
        self.pool.expire_busy_elsewhere(trio.current_time())
        for waiter in list(self._waiters):
            worker = self.pool.select(waiter.exclude)
            if worker is None:
                if self.pool.select() is None:
                    return  # nothing idle at all: later waiters cannot be served either
                continue  # this waiter has tried the idle ones; a later one may take them
            self.pool.lease(worker.index)
            waiter.index = worker.index
            self._waiters.remove(waiter)
            waiter.event.set()

    def _fail_hopeless_waiters(self) -> None:
        """Waiters no online worker can ever serve fail now, not after queue_wait_seconds."""
        for waiter in list(self._waiters):
            if not self.pool.eligible(waiter.exclude):
                waiter.unavailable = True
                self._waiters.remove(waiter)
                waiter.event.set()
        if not self.pool.any_online():
            for scope in self._slot_waiters:
                scope.cancel()

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
    ) -> None:
        """Apply reloaded settings; requests in flight keep their slot and their worker."""
        for event in self.pool.reconfigure(workers, primary_workers, thresholds):
            _log_event(event)
        self._slots.total_tokens = max_inflight
        self._queue_wait_seconds = queue_wait_seconds
        self._max_queue_wait_seconds = max_queue_wait_seconds
        self._fail_hopeless_waiters()
        self._hand_over()

    # --- reports from the prober and the forwarder --------------------------------------

    def record_probe(self, index: int, result: ProbeResult) -> None:
        event = self.pool.record_probe(index, result, trio.current_time())
        _log_event(event)
        self._fail_hopeless_waiters()
        self._hand_over()

    def mark_busy_elsewhere(self, index: int) -> None:
        """Call after the lease on `index` is given back (a release clears every busy mark)."""
        self.pool.mark_busy_elsewhere(index, trio.current_time(), BUSY_ELSEWHERE_SECONDS)

    def eject(self, index: int, reason: str) -> None:
        event = self.pool.eject(index, trio.current_time(), reason)
        _log_event(event)
        self._fail_hopeless_waiters()
        self._hand_over()  # ejecting the last primary makes the idle backups eligible

    def statistics(self) -> DispatchStatistics:
        return DispatchStatistics(
            slots_in_use=self._slots.borrowed_tokens,
            waiting_for_slot=self._slots.statistics().tasks_waiting,
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
    elif event.transition is Transition.UNREACHABLE:
        log.warning("Worker 探活失败，未上线 | worker=%d | url=%s | 原因=%s", event.index, event.url, event.reason)
    else:
        log.warning("Worker 下线（转发失败，进入隔离期） | worker=%d | url=%s | 原因=%s", event.index, event.url, event.reason)
