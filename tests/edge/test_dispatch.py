"""The dispatcher in virtual time: FIFO waiters, leases on every exit path, fail-fast."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from edge.pool.dispatch import IMPATIENT_FRACTION, LEASE_RECHECK_SECONDS, Busy, Dispatcher, EarlyRefusal, Unavailable
from edge.pool.errors import WorkerBusy
from edge.pool.host_leases import HostLeased, Turn
from edge.pool.pool import FREE_CONFIRM_SECONDS, Pool, ProbeResult
from edge.pool.scheduling import SchedulingPolicy
from tests.fakes.traffic import bursty_arrivals, replay

URLS = ["http://w0", "http://w1", "http://w2"]


def make_dispatcher(
    workers: int = 1,
    online: int | None = None,
    *,
    max_inflight: int = 64,
    queue_wait: float = 30,
    max_queue_wait: float = 590,
    early_refusal: bool = True,
) -> Dispatcher:
    pool = Pool(URLS[:workers])
    for index in range(workers if online is None else online):
        pool.record_probe(index, ProbeResult(0.0, ok=True), now=0.0)
    return Dispatcher(
        pool, max_inflight=max_inflight, queue_wait_seconds=queue_wait, max_queue_wait_seconds=max_queue_wait,
        early_refusal=early_refusal,
    )  # fmt: skip


async def hold_worker(
    dispatcher: Dispatcher, release: trio.Event, got: list[int], *, task_status=trio.TASK_STATUS_IGNORED
):
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
    release = trio.Event()
    outcomes: list[str | tuple[str, float]] = []

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
    release, got = trio.Event(), list[int]()
    async with trio.open_nursery() as nursery:
        await nursery.start(hold_worker, dispatcher, release, got)
        nursery.start_soon(hold_worker, dispatcher, release, got)
        await trio.testing.wait_all_tasks_blocked()
        dispatcher.record_probe(1, ProbeResult(trio.current_time(), ok=True))
        await trio.testing.wait_all_tasks_blocked()
        assert sorted(got) == [0, 1]
        release.set()


# --- scheduling: classes, early answers, departures (gateway.md § Scheduling) ----------

GROW, MEASURE = "/api/v1/hair/grow", "/api/v1/hair/measure"


async def test_a_measurement_never_waits_behind_generations_on_the_reserved_worker(autojump_clock) -> None:
    dispatcher = make_dispatcher(3)
    served: list[tuple[str, int, float]] = []

    async def client(name: str, slow: bool, seconds: float) -> None:
        async with dispatcher.worker(path=GROW if slow else MEASURE, slow=slow) as lease:
            served.append((name, lease.index, trio.current_time()))
            await trio.sleep(seconds)

    async with trio.open_nursery() as nursery:
        for number in range(4):
            nursery.start_soon(client, f"g{number}", True, 2.0)
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(client, "m", False, 0.05)
    starts = {name: (index, at) for name, index, at in served}
    assert starts["m"] == (2, 0), "the reserved worker serves the measurement at once"
    assert sorted(starts[f"g{n}"][1] for n in range(4)) == [0, 0, 2, 2], "two generations at a time"


async def test_an_early_answer_when_the_estimate_exceeds_the_queue_wait(autojump_clock) -> None:
    # one running and one queued 3 s generation: the newcomer starts in 6 s. Past a 4 s wait
    # by more than the margin (1 s): refused. Within a 7 s wait: it waits and is served.
    for queue_wait, refused in [(4, True), (7, False)]:
        dispatcher = make_dispatcher(1, queue_wait=queue_wait)
        for _ in range(5):
            dispatcher.service_times.record(GROW, 3.0)
        outcome: list[tuple[str, float] | tuple[str, int, float]] = []
        async with trio.open_nursery() as nursery:

            async def generation() -> None:
                # the nursery closes inside this iteration, so this is this iteration's dispatcher
                async with dispatcher.worker(path=GROW, slow=True):  # noqa: B023
                    await trio.sleep(3.0)

            for _ in range(2):
                nursery.start_soon(generation)
                await trio.testing.wait_all_tasks_blocked()
            started = trio.current_time()
            try:
                async with dispatcher.worker(path=GROW, slow=True):
                    outcome.append(("served", trio.current_time() - started))
            except EarlyRefusal as refusal:
                outcome.append(("refused", refusal.retry_after_seconds, trio.current_time() - started))
        if refused:
            assert outcome == [("refused", 6, 0)]
            assert dispatcher.counters.early_refusals == 1
        else:
            assert outcome == [("served", pytest.approx(6.0))]
            assert dispatcher.counters.early_refusals == 0


async def test_a_path_fast_again_is_not_refused_after_one_fast_answer(autojump_clock) -> None:
    # five 2 s answers, then one of 20 ms: the median said 2 s for 50 more answers and refused
    # requests that were then served at once; the low percentile follows the fast answer
    dispatcher = make_dispatcher(1, queue_wait=2)
    for seconds in [2.0] * 5 + [0.02]:
        dispatcher.service_times.record(MEASURE, seconds)
    served: list[float] = []

    async def measurement() -> None:
        async with dispatcher.worker(path=MEASURE):
            await trio.sleep(0.02)
            served.append(trio.current_time())

    async with trio.open_nursery() as nursery:
        for _ in range(8):
            nursery.start_soon(measurement)
    assert len(served) == 8 and dispatcher.counters.early_refusals == 0


async def test_the_hosts_own_1007_is_not_a_service_time(autojump_clock) -> None:
    dispatcher = make_dispatcher(1)
    for _ in range(5):
        async with dispatcher.worker(path=GROW, slow=True) as lease:
            with lease.forwarding(60):
                await trio.sleep(50)  # the host's inference timeout answered 1007
                lease.timed = False
    assert dispatcher.service_times.low(GROW) is None, "no estimate from timeouts"


async def test_no_estimate_before_five_answers_means_waiting(autojump_clock) -> None:
    dispatcher = make_dispatcher(1, queue_wait=1)
    for _ in range(4):
        dispatcher.service_times.record(GROW, 30)
    release = trio.Event()
    async with trio.open_nursery() as nursery:
        await nursery.start(hold_worker, dispatcher, release, [])
        with pytest.raises(Busy) as caught:
            async with dispatcher.worker(path=GROW, slow=True):
                pass
        assert not isinstance(caught.value, EarlyRefusal)
        release.set()


async def _abandon_a_forward(dispatcher: Dispatcher, timeout: float) -> int:
    """A forward cancelled half-way (its client left); returns the worker it held."""
    with trio.move_on_after(0.5):
        async with dispatcher.worker(path=GROW, slow=True) as lease:
            with lease.forwarding(timeout):
                await trio.sleep_forever()
    return lease.index


async def test_a_departed_forward_leaves_its_worker_draining_until_a_probe_says_free(autojump_clock) -> None:
    dispatcher = make_dispatcher(1)
    index = await _abandon_a_forward(dispatcher, timeout=60)
    assert dispatcher.counters.departures_forward == 1
    assert await dispatcher.workers_to_follow() == [index], "the prober is told to follow it"
    served_at: list[float] = []

    async def next_request() -> None:
        async with dispatcher.worker(path=MEASURE):
            served_at.append(trio.current_time())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(next_request)
        await trio.sleep(0.3)
        dispatcher.record_probe(index, ProbeResult(trio.current_time(), ok=True, busy=True))
        await trio.sleep(0.3)
        assert served_at == [], "the host still works on the abandoned job"
        freed_at = trio.current_time()
        dispatcher.record_probe(index, ProbeResult(freed_at, ok=True, busy=False))
    assert served_at == [freed_at]


async def test_a_draining_worker_is_idle_again_after_the_attempt_timeout(autojump_clock) -> None:
    dispatcher = make_dispatcher(1, queue_wait=30)
    await _abandon_a_forward(dispatcher, timeout=4)
    departed_at = trio.current_time()
    async with dispatcher.worker(path=MEASURE):
        waited = trio.current_time() - departed_at
    assert 4 <= waited <= 4 + 1, "no later than the timeout, give or take one hand-over tick"


async def test_an_answer_times_its_path_and_leaves_the_worker_idle(autojump_clock) -> None:
    dispatcher = make_dispatcher(1)
    for _ in range(5):
        async with dispatcher.worker(path=MEASURE) as lease:
            with lease.forwarding(10):
                await trio.sleep(0.25)
    assert dispatcher.service_times.low(MEASURE) == pytest.approx(0.25)
    assert dispatcher.pool.workers[0].idle and dispatcher.counters.departures_forward == 0


async def test_a_client_leaving_the_queue_is_a_queued_departure(autojump_clock) -> None:
    dispatcher = make_dispatcher(1)
    release = trio.Event()
    async with trio.open_nursery() as nursery:
        await nursery.start(hold_worker, dispatcher, release, [])
        with trio.move_on_after(1):
            async with dispatcher.worker():
                pass
        release.set()
    assert (dispatcher.counters.departures_queued, dispatcher.counters.departures_forward) == (1, 0)
    assert dispatcher.statistics().waiting_for_worker == 0


async def test_a_reload_of_the_reservation_applies_to_waiters(autojump_clock) -> None:
    dispatcher = make_dispatcher(2)
    served: list[str] = []

    async def generation(name: str) -> None:
        async with dispatcher.worker(path=GROW, slow=True):
            served.append(name)
            await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        for name in ("g1", "g2"):
            nursery.start_soon(generation, name)
            await trio.testing.wait_all_tasks_blocked()
        assert served == ["g1"], "one of two workers is reserved for fast work"
        dispatcher.reconfigure(
            URLS[:2], [], dispatcher.pool.thresholds, max_inflight=64, queue_wait_seconds=30,
            max_queue_wait_seconds=590, policy=SchedulingPolicy(reserved_fast_workers=0),
        )  # fmt: skip
        await trio.testing.wait_all_tasks_blocked()
        assert served == ["g1", "g2"]
        nursery.cancel_scope.cancel()


async def test_a_busy_answer_marks_the_worker_before_any_waiter_is_handed_it(autojump_clock) -> None:
    # the mark used to come after the lease's exit had handed the worker to the next waiter,
    # which uploaded its body to the busy host and bounced in turn
    dispatcher = make_dispatcher(1)
    handed: list[tuple[str, float]] = []

    async def bounced() -> None:
        with pytest.raises(WorkerBusy):
            async with dispatcher.worker(path=MEASURE) as lease:
                handed.append(("first", trio.current_time()))
                with lease.forwarding(10):
                    await trio.sleep(0.01)
                    raise WorkerBusy

    async def waiter() -> None:
        async with dispatcher.worker(path=MEASURE):
            handed.append(("waiter", trio.current_time()))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(bounced)
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(waiter)
        assert await dispatcher.workers_to_follow() == [0], "the prober follows it at once"
        await trio.sleep(5)  # no hold that ends by time: another gateway's job may be long
        assert [name for name, _ in handed] == ["first"], "nobody was handed the busy worker"
        dispatcher.record_probe(0, ProbeResult(0.005, ok=True, busy=False))  # sent before it said busy
        await trio.testing.wait_all_tasks_blocked()
        assert len(handed) == 1, "a probe sent before the busy answer says nothing"
        dispatcher.record_probe(0, ProbeResult(trio.current_time(), ok=True, busy=False))
        await trio.testing.wait_all_tasks_blocked()
        assert len(handed) == 1, "free once: the other gateway's next job may be on its way"
        await trio.sleep(FREE_CONFIRM_SECONDS)
        freed_at = trio.current_time()
        dispatcher.record_probe(0, ProbeResult(freed_at, ok=True, busy=False))
    assert handed[-1] == ("waiter", freed_at)
    assert dispatcher.pool.workers[0].online, "busy elsewhere is not a failure"


async def test_a_measurement_never_waits_at_the_slot_behind_a_burst_of_generations(autojump_clock) -> None:
    # max_inflight 6, 3 hosts, 10 queued 2 s generations: the FIFO slot limiter made the
    # measurement wait for a slot (4.97 s on loopback) while the reserved host was idle
    dispatcher = make_dispatcher(3, max_inflight=6)
    served: dict[str, float] = {}

    async def client(name: str, slow: bool, seconds: float) -> None:
        async with dispatcher.slot(slow=slow), dispatcher.worker(path=GROW if slow else MEASURE, slow=slow):
            served[name] = trio.current_time()
            await trio.sleep(seconds)

    async with trio.open_nursery() as nursery:
        for number in range(10):
            nursery.start_soon(client, f"g{number}", True, 2.0)
        await trio.testing.wait_all_tasks_blocked()
        assert dispatcher.statistics().slots_in_use == 5, "generations leave the reserved slot"
        nursery.start_soon(client, "m", False, 0.05)
    assert served["m"] == 0, "the measurement took the free slot and the reserved host at once"
    assert len(served) == 11, "every generation ran too"


def test_every_early_refusal_would_have_timed_out() -> None:
    # the same seeded arrivals with early refusal on and off (bursts of 8-10 s generations over
    # 0.1-0.3 s measurements, 3 hosts, 10 s queue wait): the median-based estimate refused
    # requests that were then served
    arrivals = bursty_arrivals(7, 120)

    async def replay_with(early_refusal: bool) -> list[str]:
        return await replay(make_dispatcher(3, queue_wait=10, early_refusal=early_refusal), arrivals)

    on = trio.run(replay_with, True, clock=trio.testing.MockClock(autojump_threshold=0))
    off = trio.run(replay_with, False, clock=trio.testing.MockClock(autojump_threshold=0))
    refused = [number for number, outcome in enumerate(on) if outcome == "refused"]
    assert len(refused) >= 5, "the replay must exercise early refusals"
    assert [off[number] for number in refused] == ["timed out"] * len(refused)


async def test_a_host_leased_elsewhere_goes_to_a_waiter_when_its_release_is_heard(autojump_clock) -> None:
    # the hold used to end only at a probe (every 100 ms), which between two of the holder's
    # jobs said free although the lease was still taken
    dispatcher = make_dispatcher(1)
    handed: list[float] = []

    async def leased_elsewhere() -> None:
        with pytest.raises(HostLeased):
            async with dispatcher.worker(path=MEASURE) as lease:
                with lease.forwarding(10):
                    raise HostLeased(30.0)

    async def waiter() -> None:
        async with dispatcher.worker(path=MEASURE):
            handed.append(trio.current_time())

    async with trio.open_nursery() as nursery:
        await leased_elsewhere()
        assert not dispatcher.pool.workers[0].awaiting_probe, "no probe is sent: only the lease can say"
        nursery.start_soon(waiter)
        await trio.sleep(0.5)
        dispatcher.record_probe(0, ProbeResult(trio.current_time(), ok=True, busy=False))
        dispatcher.record_probe(0, ProbeResult(trio.current_time() + 0.1, ok=True, busy=False))
        await trio.testing.wait_all_tasks_blocked()
        assert handed == [], "a free /health does not end another gateway's lease"
        dispatcher.lease_released("http://elsewhere")
        await trio.testing.wait_all_tasks_blocked()
        assert handed == []
        released_at = trio.current_time()
        dispatcher.lease_released(URLS[0])
    assert handed == [released_at]


async def test_a_lease_heard_of_by_nobody_is_looked_at_again_within_the_recheck(autojump_clock) -> None:
    dispatcher = make_dispatcher(1)
    with pytest.raises(HostLeased):
        async with dispatcher.worker(path=MEASURE) as lease:
            with lease.forwarding(10):
                raise HostLeased(30.0)  # its holder died, or its release was published unheard
    left_at = trio.current_time()
    async with dispatcher.worker(path=MEASURE):
        waited = trio.current_time() - left_at
    assert waited <= LEASE_RECHECK_SECONDS


async def test_the_turn_says_whether_a_waiter_here_takes_the_host_next_and_if_it_was_impatient(
    autojump_clock,
) -> None:
    dispatcher = make_dispatcher(2, queue_wait=8)
    release = trio.Event()
    async with trio.open_nursery() as nursery:
        await nursery.start(hold_worker, dispatcher, release, [])
        await nursery.start(hold_worker, dispatcher, release, [])
        assert dispatcher.turn(URLS[0]) == Turn(impatient=False, successor_waiting=False)
        nursery.start_soon(hold_worker, dispatcher, release, [])
        await trio.testing.wait_all_tasks_blocked()
        assert dispatcher.turn(URLS[0]).successor_waiting, "a third request waits for either host"
        release.set()
    assert dispatcher.turn(URLS[0]) == Turn(), "nothing runs there"
    # a waiter that waited past a quarter of its queue wait takes the host impatient
    dispatcher.pool.release(0, trio.current_time(), busy_elsewhere=True)
    dispatcher.pool.release(1, trio.current_time(), busy_elsewhere=True)
    impatient: list[bool] = []

    async def late() -> None:
        async with dispatcher.worker(path=MEASURE) as lease:
            impatient.append(lease.impatient)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(late)
        await trio.sleep(0.1)
        dispatcher.record_probe(0, ProbeResult(trio.current_time(), ok=True, busy=False))  # seen free, once
        await trio.sleep(IMPATIENT_FRACTION * 8 + 1)
    assert impatient == [True], "it took the host only seen free, and says so to the leases"
