"""The dispatcher in virtual time: FIFO waiters, leases on every exit path, fail-fast."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from edge.pool.dispatch import Busy, Dispatcher, Unavailable
from edge.pool.pool import Pool, ProbeResult

URLS = ["http://w0", "http://w1", "http://w2"]


def make_dispatcher(
    workers: int = 1,
    online: int | None = None,
    *,
    max_inflight: int = 64,
    queue_wait: float = 30,
    max_queue_wait: float = 590,
) -> Dispatcher:
    pool = Pool(URLS[:workers])
    for index in range(workers if online is None else online):
        pool.record_probe(index, ProbeResult(0.0, ok=True), now=0.0)
    return Dispatcher(pool, max_inflight=max_inflight, queue_wait_seconds=queue_wait, max_queue_wait_seconds=max_queue_wait)


async def hold_worker(dispatcher: Dispatcher, release: trio.Event, got: list[int], *, task_status=trio.TASK_STATUS_IGNORED):
    async with dispatcher.slot(), dispatcher.worker() as lease:
        got.append(lease.index)
        task_status.started()
        await release.wait()


async def test_no_online_worker_fails_at_once(autojump_clock) -> None:
    dispatcher = make_dispatcher(2, online=0)
    started = trio.current_time()
    with pytest.raises(Unavailable):
        async with dispatcher.slot():
            pass
    assert trio.current_time() == started


async def test_waiters_are_served_first_come_first_served(autojump_clock) -> None:
    dispatcher = make_dispatcher(1)
    release, served = trio.Event(), []

    async def client(name: str) -> None:
        async with dispatcher.slot(), dispatcher.worker():
            served.append(name)
            await trio.sleep(1)

    async with trio.open_nursery() as nursery:
        await nursery.start(hold_worker, dispatcher, release, [])
        for name in "abcde":
            nursery.start_soon(client, name)
            await trio.testing.wait_all_tasks_blocked()
        assert dispatcher.statistics().waiting_for_worker == 5
        release.set()
    assert served == list("abcde")


async def test_never_two_requests_on_one_worker(autojump_clock) -> None:
    dispatcher = make_dispatcher(3)
    active: set[int] = set()
    overlaps = 0

    async def client() -> None:
        nonlocal overlaps
        async with dispatcher.slot(), dispatcher.worker() as lease:
            overlaps += lease.index in active
            active.add(lease.index)
            await trio.sleep(0.5)
            active.discard(lease.index)

    async with trio.open_nursery() as nursery:
        for _ in range(20):
            nursery.start_soon(client)
    assert overlaps == 0
    assert dispatcher.statistics().slots_in_use == 0
    assert all(w.idle for w in dispatcher.pool.workers)


async def test_queue_wait_timeout_is_busy_and_leaves_no_trace(autojump_clock) -> None:
    dispatcher = make_dispatcher(1, queue_wait=5)
    release = trio.Event()
    async with trio.open_nursery() as nursery:
        await nursery.start(hold_worker, dispatcher, release, [])
        started = trio.current_time()
        with pytest.raises(Busy):
            async with dispatcher.slot(), dispatcher.worker():
                pass
        assert trio.current_time() - started == pytest.approx(5)
        assert dispatcher.statistics().waiting_for_worker == 0
        release.set()
    async with dispatcher.slot(), dispatcher.worker() as lease:
        assert lease.index == 0


async def test_slot_wait_timeout_is_busy(autojump_clock) -> None:
    dispatcher = make_dispatcher(2, max_inflight=1, max_queue_wait=7)
    release = trio.Event()
    async with trio.open_nursery() as nursery:
        await nursery.start(hold_worker, dispatcher, release, [])
        started = trio.current_time()
        with pytest.raises(Busy):
            async with dispatcher.slot():
                pass
        assert trio.current_time() - started == pytest.approx(7)
        release.set()
    assert dispatcher.statistics().slots_in_use == 0


async def test_waiters_fail_at_once_when_the_last_worker_goes(autojump_clock) -> None:
    dispatcher = make_dispatcher(1, queue_wait=30)
    release, outcomes = trio.Event(), []

    async def waiter() -> None:
        try:
            async with dispatcher.slot(), dispatcher.worker():
                outcomes.append("served")
        except Unavailable:
            outcomes.append(("unavailable", trio.current_time()))

    async with trio.open_nursery() as nursery:
        await nursery.start(hold_worker, dispatcher, release, [])
        nursery.start_soon(waiter)
        nursery.start_soon(waiter)
        await trio.testing.wait_all_tasks_blocked()
        ejected_at = trio.current_time()
        dispatcher.eject(0, "HTTP 500")
        await trio.testing.wait_all_tasks_blocked()
        assert outcomes == [("unavailable", ejected_at)] * 2
        release.set()


async def test_slot_waiters_fail_at_once_when_nothing_is_online(autojump_clock) -> None:
    dispatcher = make_dispatcher(1, max_inflight=1)
    release, outcomes = trio.Event(), []

    async def waiter() -> None:
        with pytest.raises(Unavailable):
            async with dispatcher.slot():
                outcomes.append("got a slot")
        outcomes.append("unavailable")

    async with trio.open_nursery() as nursery:
        await nursery.start(hold_worker, dispatcher, release, [])
        nursery.start_soon(waiter)
        await trio.testing.wait_all_tasks_blocked()
        dispatcher.record_probe(0, ProbeResult(trio.current_time(), ok=False))
        dispatcher.record_probe(0, ProbeResult(trio.current_time(), ok=False))
        await trio.testing.wait_all_tasks_blocked()
        assert outcomes == ["unavailable"]
        release.set()


async def test_cancelled_request_returns_its_worker_and_slot(autojump_clock) -> None:
    dispatcher = make_dispatcher(1, max_inflight=1)
    with trio.move_on_after(1):  # the client disconnects mid-request
        async with dispatcher.slot(), dispatcher.worker():
            await trio.sleep_forever()
    assert dispatcher.pool.workers[0].idle
    assert dispatcher.statistics().slots_in_use == 0


async def test_cancelled_waiter_gives_up_its_place(autojump_clock) -> None:
    dispatcher = make_dispatcher(1)
    release, served = trio.Event(), []

    async def client(name: str) -> None:
        async with dispatcher.worker():
            served.append(name)

    async with trio.open_nursery() as nursery:
        await nursery.start(hold_worker, dispatcher, release, [])
        leaving = trio.CancelScope()
        nursery.start_soon(_run_in, leaving, client, "leaves")
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(client, "stays")
        await trio.testing.wait_all_tasks_blocked()
        leaving.cancel()
        await trio.testing.wait_all_tasks_blocked()
        assert dispatcher.statistics().waiting_for_worker == 1
        release.set()
    assert served == ["stays"]
    assert dispatcher.pool.workers[0].idle


async def _run_in(scope: trio.CancelScope, fn, *args) -> None:
    with scope:
        await fn(*args)


async def test_retry_excludes_workers_already_tried(autojump_clock) -> None:
    dispatcher = make_dispatcher(2)
    async with dispatcher.worker() as first:
        pass
    async with dispatcher.worker(frozenset({first.index})) as second:
        assert second.index != first.index
    with pytest.raises(Unavailable):  # every online worker tried: nobody left to try
        async with dispatcher.worker(frozenset({0, 1})):
            pass


async def test_worker_freed_by_a_probe_is_handed_to_a_waiter(autojump_clock) -> None:
    dispatcher = make_dispatcher(1)
    dispatcher.record_probe(0, ProbeResult(trio.current_time(), ok=True, busy=True))
    served_at = []

    async def client() -> None:
        async with dispatcher.worker():
            served_at.append(trio.current_time())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(client)
        await trio.sleep(8)
        assert served_at == []
        dispatcher.record_probe(0, ProbeResult(trio.current_time(), ok=True, busy=False))
    assert served_at == [8]


async def test_worker_coming_online_serves_waiters(autojump_clock) -> None:
    dispatcher = make_dispatcher(2, online=1)
    release, got = trio.Event(), []
    async with trio.open_nursery() as nursery:
        await nursery.start(hold_worker, dispatcher, release, got)
        nursery.start_soon(hold_worker, dispatcher, release, got)
        await trio.testing.wait_all_tasks_blocked()
        dispatcher.record_probe(1, ProbeResult(trio.current_time(), ok=True))
        await trio.testing.wait_all_tasks_blocked()
        assert sorted(got) == [0, 1]
        release.set()
