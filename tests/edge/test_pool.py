"""The pool state machine as tables of (state, event) -> state; no I/O, no clock."""

from __future__ import annotations

import math

import pytest

from edge.pool.pool import (
    FREE_CONFIRM_SECONDS,
    HOST_TURN_SECONDS,
    SHARED_MEMORY_SECONDS,
    Pool,
    ProbeResult,
    Thresholds,
    Transition,
)

A, B, C = "http://a:1", "http://b:1", "http://c:1"
OK = ProbeResult(sent_at=0.0, ok=True)
FAIL = ProbeResult(sent_at=0.0, ok=False, reason="refused")


def online_pool(*urls: str, primaries: tuple[str, ...] = (), thresholds: Thresholds = Thresholds()) -> Pool:
    pool = Pool(urls, primaries, thresholds)
    for worker in pool.workers:
        pool.record_probe(worker.index, OK, now=0.0)
    return pool


@pytest.mark.parametrize(
    ("thresholds", "probes", "online_after", "transitions"),
    [
        # healthy_threshold=1: one success brings a new worker online
        (Thresholds(2, 1, 60), [OK], [True], [Transition.CAME_ONLINE]),
        # healthy_threshold=2 needs two in a row; a failure resets the streak
        (Thresholds(2, 2, 60), [OK, FAIL, OK, OK], [False, False, False, True], [Transition.CAME_ONLINE]),
        # unhealthy_threshold=2: one blip does not take an online worker down
        (
            Thresholds(2, 1, 60),
            [OK, FAIL, OK, FAIL, FAIL],
            [True, True, True, True, False],
            [Transition.CAME_ONLINE, Transition.WENT_OFFLINE],
        ),
        # a worker that never came online: no "went offline", but "unreachable" once per streak
        (Thresholds(2, 1, 60), [FAIL, FAIL, FAIL, FAIL], [False] * 4, [Transition.UNREACHABLE]),
        (
            Thresholds(1, 1, 60),
            [FAIL, FAIL, OK, FAIL, FAIL],
            [False, False, True, False, False],
            [Transition.UNREACHABLE, Transition.CAME_ONLINE, Transition.WENT_OFFLINE],
        ),
    ],
)
def test_probe_sequences(thresholds, probes, online_after, transitions) -> None:
    pool = Pool([A], thresholds=thresholds)
    seen_online, events = [], []
    for probe in probes:
        event = pool.record_probe(0, probe, now=1.0)
        seen_online.append(pool.workers[0].online)
        if event is not None:
            events.append(event.transition)
    assert seen_online == online_after
    assert events == transitions


def test_offline_event_carries_the_probe_reason() -> None:
    pool = online_pool(A, thresholds=Thresholds(1, 1, 60))
    event = pool.record_probe(0, ProbeResult(5.0, ok=False, reason="HTTP 503"), now=5.0)
    assert event is not None and (event.transition, event.index, event.reason) == (
        Transition.WENT_OFFLINE,
        0,
        "HTTP 503",
    )


@pytest.mark.parametrize(
    ("probe_at", "online"),
    [(10.0, False), (69.9, False), (70.0, True), (200.0, True)],
)
def test_ejection_cooldown_holds_off_probe_successes(probe_at: float, online: bool) -> None:
    pool = online_pool(A, thresholds=Thresholds(2, 1, 60))
    event = pool.eject(0, now=10.0, reason="HTTP 500")
    assert event is not None and event.transition is Transition.EJECTED
    pool.record_probe(0, ProbeResult(probe_at, ok=True), now=probe_at)
    assert pool.workers[0].online is online


def test_ejecting_an_offline_worker_is_silent_but_still_cools_down() -> None:
    pool = Pool([A])
    assert pool.eject(0, now=0.0, reason="refused") is None
    pool.record_probe(0, ProbeResult(1.0, ok=True), now=1.0)
    assert not pool.workers[0].online


@pytest.mark.parametrize(
    ("online", "primaries", "expected"),
    [
        ({A, B, C}, (), [0, 1, 2]),  # empty primary list: all are primary
        ({A, B, C}, (A,), [0]),  # backups wait while a primary is online
        ({B, C}, (A,), [1, 2]),  # no primary online: backups serve
        ({B}, (A, B), [1]),
        (set(), (A,), []),
    ],
)
def test_eligible_tiers(online: set[str], primaries: tuple[str, ...], expected: list[int]) -> None:
    pool = Pool([A, B, C], primaries)
    for worker in pool.workers:
        if worker.url in online:
            pool.record_probe(worker.index, OK, now=0.0)
    assert [w.index for w in pool.eligible()] == expected


def test_statistics_count_primaries_and_busy() -> None:
    pool = online_pool(A, B, C, primaries=(A, B))
    pool.eject(1, now=1.0, reason="x")
    pool.lease(0)
    stats = pool.statistics()
    assert (stats.workers_total, stats.workers_healthy, stats.workers_busy) == (3, 2, 1)
    assert (stats.workers_primary_total, stats.workers_primary_healthy, stats.drill) == (2, 1, False)


def test_select_prefers_the_worker_idle_the_longest() -> None:
    pool = online_pool(A, B, C)
    for index, ended_at in [(0, 5.0), (1, 3.0), (2, 4.0)]:
        pool.lease(index)
        pool.release(index, ended_at)
    order = []
    for _ in range(3):
        worker = pool.select()
        assert worker is not None
        pool.lease(worker.index)
        order.append(worker.index)
    assert order == [1, 2, 0]
    assert pool.select() is None


def test_a_leased_worker_is_never_selected_twice() -> None:
    pool = online_pool(A)
    pool.lease(0)
    assert pool.select() is None
    with pytest.raises(RuntimeError):
        pool.lease(0)


def test_select_honours_exclusions() -> None:
    pool = online_pool(A, B)
    first = pool.select()
    assert first is not None
    other = pool.select(frozenset({first.index}))
    assert other is not None and other.index != first.index
    assert pool.select(frozenset({0, 1})) is None


@pytest.mark.parametrize(
    ("probe_sent_at", "busy", "idle"),
    [
        (9.0, True, True),  # sent while our request still ran: stale, ignored
        (10.0, True, False),  # sent after it ended: the worker really is busy
        (11.0, False, True),
    ],
)
def test_busy_report_counts_only_from_a_probe_sent_after_our_last_request(probe_sent_at, busy, idle) -> None:
    pool = online_pool(A)
    pool.lease(0)
    pool.release(0, now=10.0)
    pool.record_probe(0, ProbeResult(probe_sent_at, ok=True, busy=busy), now=12.0)
    assert pool.workers[0].idle is idle
    assert (pool.select() is not None) is idle


def test_later_free_probes_clear_a_busy_report() -> None:
    pool = online_pool(A)
    pool.record_probe(0, ProbeResult(1.0, ok=True, busy=True), now=1.0)
    assert pool.select() is None and pool.statistics().workers_busy == 1
    pool.record_probe(0, ProbeResult(2.0, ok=True, busy=False), now=2.0)
    pool.record_probe(0, ProbeResult(2.0 + 2 * FREE_CONFIRM_SECONDS, ok=True, busy=False), now=2.1)
    assert pool.select() is not None


def test_drill_flag_reports_changes_only() -> None:
    pool = Pool([A])
    assert [pool.set_drill(True), pool.set_drill(True), pool.set_drill(False)] == [True, False, True]
    assert pool.statistics().drill is False


def test_new_workers_start_offline_and_never_used() -> None:
    worker = Pool([A]).workers[0]
    assert (worker.online, worker.last_request_ended, worker.cooldown_until) == (False, -math.inf, -math.inf)


def test_reconfigure_keeps_indexes_retires_removed_and_adds_new_offline() -> None:
    pool = Pool(["http://a", "http://b", "http://c"], ["http://a"])
    for index in range(3):
        pool.record_probe(index, ProbeResult(0.0, ok=True), 0.0)
    pool.lease(1)  # a request is running on b when the reload removes it
    events = pool.reconfigure(["http://a", "http://c", "http://d"], ["http://d"], Thresholds(cooldown_seconds=5))
    assert [(e.transition, e.index) for e in events] == [(Transition.RETIRED, 1), (Transition.ADDED, 3)]
    assert [w.url for w in pool.active] == ["http://a", "http://c", "http://d"]
    assert pool.workers[3].index == 3 and not pool.workers[3].online, "a new worker waits for a probe"
    selected = pool.select()
    assert selected is not None and selected.url == "http://a", "primaries are re-read: d is primary but offline"
    assert [w.primary for w in pool.active] == [False, False, True]
    pool.release(1, 1.0)  # the request on the retired worker ends and gives back index 1
    assert pool.statistics().workers_total == 3 and pool.select(frozenset({0, 2})) is None
    assert pool.record_probe(1, ProbeResult(2.0, ok=True), 2.0) is None and not pool.workers[1].online
    assert pool.thresholds.cooldown_seconds == 5
    pool.reconfigure(["http://b"], [], Thresholds())  # b is back, with its old index
    assert [w.index for w in pool.active] == [1] and not pool.workers[1].online


def probe_with(comfyui: str | None = None, disk: str = "ok", ok: bool = True, at: float = 0.0) -> ProbeResult:
    checks = {"disk": disk} if comfyui is None else {"disk": disk, "comfyui": comfyui}
    return ProbeResult(at, ok=ok, checks=checks, inference_timeout_seconds=50)


@pytest.mark.parametrize(
    ("comfyui", "slow_eligible"),
    [
        (("down", "ok", "ok"), [1, 2]),  # a host whose ComfyUI is down gets no generation …
        (("down", "down", "ok"), [2]),
        (("down", "down", "down"), [0, 1, 2]),  # … unless none says ok: nothing changes
        (("down", "off", "off"), [0, 1, 2]),  # "off" is the preview, not a ComfyUI that is "ok"
        (("ok", None, "down"), [0, 1]),  # a host that reports no checks is not known to be down
    ],
)
def test_generation_eligibility_follows_comfyui(comfyui, slow_eligible) -> None:
    pool = Pool([A, B, C])
    for index, state in enumerate(comfyui):
        pool.record_probe(index, probe_with(state), now=0.0)
    assert [w.index for w in pool.eligible(slow=True)] == slow_eligible
    assert [w.index for w in pool.eligible()] == [0, 1, 2], "measurements go to every host"
    ready = [s != "down" for s in comfyui]
    assert pool.statistics().workers_generation_ready == sum(ready)


def test_a_down_comfyui_among_backups_counts_only_within_the_tier() -> None:
    pool = Pool([A, B, C], [A])
    pool.record_probe(0, probe_with("down"), now=0.0)
    pool.record_probe(1, probe_with("ok"), now=0.0)
    assert [w.index for w in pool.eligible(slow=True)] == [0], "the primary tier is A alone"


def test_a_low_disk_503_keeps_its_checks_and_a_failed_transport_keeps_the_last() -> None:
    pool = Pool([A], thresholds=Thresholds(1, 1, 60))
    pool.record_probe(0, probe_with("ok"), now=0.0)
    pool.record_probe(0, ProbeResult(1.0, ok=False, reason="HTTP 503", checks={"disk": "low", "comfyui": "ok"}), 1.0)
    worker = pool.workers[0]
    assert (worker.online, worker.disk_low, worker.generation_ready) == (False, True, False)
    pool.record_probe(0, ProbeResult(2.0, ok=False, reason="timeout"), 2.0)
    assert worker.disk_low, "a probe without an answer says nothing new about the checks"
    assert worker.inference_timeout_seconds is None


def test_a_loading_host_that_never_came_online_is_loading_not_unreachable() -> None:
    pool = Pool([A], thresholds=Thresholds(2, 1, 60))
    loading = ProbeResult(0.0, ok=False, reason="HTTP 503 loading", loading=True)
    events = [pool.record_probe(0, loading, now=0.0) for _ in range(3)]
    assert [e.transition for e in events if e] == [Transition.LOADING]


@pytest.mark.parametrize(
    ("probe", "now", "idle"),
    [
        (None, 9.9, False),  # no probe yet: draining for the attempt's timeout …
        (None, 10.0, True),  # … then idle again, whatever the host said
        (ProbeResult(0.0, ok=True, busy=False), 1.0, True),  # a probe after the departure: free
        (ProbeResult(0.0, ok=True, busy=True), 1.0, False),  # still at it
        (ProbeResult(-1.0, ok=True, busy=False), 1.0, False),  # sent before the departure: stale
    ],
)
def test_a_departure_drains_the_worker_until_a_later_probe_or_the_timeout(probe, now, idle) -> None:
    pool = online_pool(A, B)
    pool.lease(0, -5.0, path="/api/v1/hair/grow", slow=True)
    pool.release(0, 0.0, drain_seconds=10.0)
    if probe is not None:
        pool.record_probe(0, probe, now=now)
    pool.expire_holds(now)
    assert pool.workers[0].idle is idle
    assert pool.workers[0].running_slow is not idle, "a draining generation still counts as slow work"
    assert (pool.statistics().workers_busy == 1) is not idle


FREE_AT = [ProbeResult(t, ok=True, busy=False) for t in (0.0, 0.01, FREE_CONFIRM_SECONDS, 0.2)]
BUSY_AT = [ProbeResult(t, ok=True, busy=True) for t in (0.0, 0.01, FREE_CONFIRM_SECONDS, 0.2)]


@pytest.mark.parametrize(
    ("probes", "now", "idle", "seen_free"),
    [
        ([], 0.0, False, False),  # busy from the very step that gave the lease back
        ([], 3600.0, False, False),  # … and time alone never frees it: another gateway's job may be long
        # a probe after the busy answer says free: only seen free (the other gateway's next job
        # may be on its way) until one FREE_CONFIRM_SECONDS later says so too
        ([FREE_AT[0]], 0.1, False, True),
        ([FREE_AT[0], FREE_AT[1]], 0.1, False, True),  # too soon after: not yet
        ([FREE_AT[0], FREE_AT[2]], 0.08, True, False),
        ([FREE_AT[0], BUSY_AT[1], FREE_AT[2]], 0.2, False, True),  # the other job began between: again
        ([FREE_AT[0], BUSY_AT[1], FREE_AT[2], FREE_AT[3]], 0.22, True, False),
        ([BUSY_AT[0]], 0.1, False, False),  # still running the other job
        ([ProbeResult(-0.5, ok=True, busy=False)] * 2, 0.1, False, False),  # sent before the answer: stale
    ],
)
def test_a_busy_answer_holds_the_worker_until_probes_apart_say_free(probes, now, idle, seen_free) -> None:
    pool = online_pool(A, B)
    pool.lease(0, -1.0, path="/api/v1/hair/measure")
    pool.release(0, 0.0, busy_elsewhere=True)
    assert pool.select() is pool.workers[1], "nobody can be handed the busy worker"
    for probe in probes:
        pool.record_probe(0, probe, now=now)
    pool.expire_holds(now)
    assert pool.workers[0].idle is idle
    assert pool.workers[0].seen_free is seen_free
    assert pool.workers[0].awaiting_probe is not idle, "the prober follows it until it is free"
    assert pool.workers[0].online, "busy elsewhere is not a failure"


def test_a_seen_free_worker_goes_only_to_who_asks_for_one_and_is_then_ours() -> None:
    pool = online_pool(A)
    pool.lease(0, -1.0)
    pool.release(0, 0.0, busy_elsewhere=True)
    pool.record_probe(0, FREE_AT[0], now=0.01)
    assert pool.select() is None, "a patient waiter defers to the other gateway's next job"
    taken = pool.select(seen_free=True)
    assert taken is pool.workers[0]
    pool.lease(0, 0.02)
    assert not taken.reported_busy and taken.leased
    pool.release(0, 0.3)
    assert pool.select() is taken, "our own answer says it is free: no second look needed"


@pytest.mark.parametrize(
    ("shared", "now", "idle"),
    [
        (False, 3600.0, True),  # one gateway alone: its own answer says free for as long as it likes
        (True, 10.0 + FREE_CONFIRM_SECONDS / 2, True),  # fresh: nobody else could have confirmed it free yet
        (True, 10.0 + 2 * FREE_CONFIRM_SECONDS, False),  # stale: another gateway may have it by now
        (True, 10.0 + SHARED_MEMORY_SECONDS + 1, True),  # not found busy elsewhere for long: not shared any more
    ],
)
def test_a_shared_worker_idle_on_stale_knowledge_is_looked_at_again(shared, now, idle) -> None:
    # a gateway sent uploads to hosts it had last seen free long before (its own answer,
    # or the probe that confirmed it): others had taken them since, and they refused
    pool = online_pool(A)
    if shared:
        pool.lease(0, -1.0)
        pool.release(0, 0.0, busy_elsewhere=True)
        pool.record_probe(0, ProbeResult(0.1, ok=True, busy=False), now=0.1)
        pool.record_probe(0, ProbeResult(0.2, ok=True, busy=False), now=0.2)
    pool.lease(0, 9.0)
    pool.release(0, 10.0)
    assert pool.expire_holds(now) == ([] if idle else [0]), "a stale one is returned: someone must look"
    assert pool.workers[0].idle is idle
    assert pool.workers[0].awaiting_probe is not idle


@pytest.mark.parametrize(
    ("event", "idle"),
    [
        ("nothing", False),
        ("free probes", False),  # the holder keeps it between its jobs: the lease says more than /health
        ("released", True),
        ("another released", False),
        ("releases missed", True),  # a (re)subscription: any release may have gone unheard
        ("lease time up", True),
    ],
)
def test_a_host_leased_elsewhere_is_held_until_its_release_is_announced_or_its_time_is_up(event, idle) -> None:
    pool = online_pool(A, B)
    pool.lease(0, -1.0)
    pool.release(0, 0.0, leased_elsewhere_seconds=1.0)
    assert pool.select() is pool.workers[1] and not pool.workers[0].awaiting_probe, "no probe can end it"
    now = 0.5
    if event == "free probes":
        for probe in FREE_AT:
            pool.record_probe(0, probe, now=now)
    elif event == "released":
        assert pool.lease_released(A)
    elif event == "another released":
        assert not pool.lease_released(B)
    elif event == "releases missed":
        assert pool.lease_released(None)
    elif event == "lease time up":
        now = 1.0
    pool.expire_holds(now)
    assert pool.workers[0].idle is idle


def test_with_nothing_online_a_worker_may_return_after_its_cooldown_or_the_next_probe() -> None:
    pool = online_pool(A, B, thresholds=Thresholds(2, 1, cooldown_seconds=60))
    pool.eject(0, 10.0, "HTTP 500")
    pool.eject(1, 30.0, "HTTP 500")
    assert pool.seconds_until_one_may_return(40.0, probe_interval_seconds=8) == 30, "worker 0: cooldown until 70"
    assert pool.seconds_until_one_may_return(69.0, probe_interval_seconds=8) == 8, "the next probe at the soonest"
    unprobed = Pool([A])  # never online, never ejected: the next probe may bring it
    assert unprobed.seconds_until_one_may_return(0.0, probe_interval_seconds=8) == 8


@pytest.mark.parametrize(
    ("leases_shared", "events", "idle"),
    [
        (False, ["free"], False),  # /health alone: a second look must confirm it
        (True, ["free"], True),  # the lease guards the forward: one free probe does
        (True, ["released"], True),  # the holder's release announced: the job the answer met is over
        (False, ["free", "free later", "much later"], False),  # stale knowledge of a shared host …
        (True, ["free", "much later"], True),  # … is the lease's business with Redis
    ],
)
def test_with_shared_leases_the_lease_not_health_guards_a_forward(leases_shared, events, idle) -> None:
    pool = online_pool(A)
    pool.leases_shared = leases_shared
    pool.lease(0, 0.5)
    pool.release(0, 1.0, busy_elsewhere=True)  # the host answered busy: a job of a gateway without the lease
    now = 1.0
    for event in events:
        if event == "free":
            pool.record_probe(0, ProbeResult(1.1, ok=True, busy=False), now=1.1)
        elif event == "free later":
            pool.record_probe(0, ProbeResult(1.2, ok=True, busy=False), now=1.2)
        elif event == "released":
            assert pool.lease_released(A)
        else:
            now = 5.0
    pool.expire_holds(now)
    assert pool.workers[0].idle is idle


@pytest.mark.parametrize(("leases_shared", "idle"), [(False, False), (True, True)])
def test_a_busy_probe_holds_a_host_only_without_shared_leases(leases_shared, idle) -> None:
    # with leases the next forward asks Redis (a round trip, no upload): a host its holder
    # keeps across its own hand-overs is never free to a probe, and a gateway that held it
    # on /health never asked, never marked it wanted, and served nothing (bench_gateways 2x2)
    pool = online_pool(A)
    pool.leases_shared = leases_shared
    pool.record_probe(0, ProbeResult(1.0, ok=True, busy=True), now=1.0)  # another gateway's job
    pool.expire_holds(2.0)
    assert pool.workers[0].idle is idle


@pytest.mark.parametrize(
    ("asked_for_at", "leases_shared", "turn"),
    [
        (None, False, True),  # another gateway asked while our job ran: it gets a turn
        (0.5, False, False),  # the mark is our own, from before we got the host
        (None, True, False),  # with shared leases the lease's wanted mark does this
    ],
)
def test_a_host_another_gateway_wants_is_left_to_it_for_a_turn_after_our_job(asked_for_at, leases_shared, turn) -> None:
    # without shared state a gateway that keeps a host across its own hand-overs (a few ms
    # between two jobs) left the others only a probe's luck: requests waited out their queue
    pool = online_pool(A)
    pool.leases_shared = leases_shared
    if asked_for_at is not None:
        pool.asked_for(0, asked_for_at)
    pool.lease(0, 1.0)
    pool.record_probe(0, ProbeResult(1.1, ok=True, busy=True, wanted=True), now=1.1)
    pool.release(0, 1.2)
    free_at = []
    for sent_at in (1.3, 1.35, 1.2 + HOST_TURN_SECONDS + 0.01, 1.2 + HOST_TURN_SECONDS + 0.01 + FREE_CONFIRM_SECONDS):
        if pool.workers[0].idle:
            free_at.append(sent_at)
        pool.record_probe(0, ProbeResult(sent_at, ok=True, busy=False), now=sent_at)
    assert (free_at == []) is turn, "held through the turn, free only when probes after it confirm"
    assert pool.workers[0].idle


# --- failures a host named: rest, fixed time out (gateway.md § Failure kinds) ---------------


def test_a_resting_worker_stays_online_and_is_not_selected_until_its_rest_ends() -> None:
    pool = online_pool(A, B)
    pool.rest(0, now=10.0, seconds=2.0)
    during = pool.select()
    pool.expire_holds(11.9)
    still = pool.select()
    pool.expire_holds(12.0)
    after = pool.select()
    assert pool.workers[0].online and during is not None and during.index == 1
    assert still is not None and still.index == 1
    assert after is not None and after.index == 0  # idle the longest again
    assert pool.workers[0].resting_until is None


def test_a_longer_rest_is_not_shortened_by_a_shorter_one() -> None:
    pool = online_pool(A)
    pool.rest(0, now=0.0, seconds=8.0)
    pool.rest(0, now=1.0, seconds=1.0)
    assert pool.workers[0].resting_until == 8.0


def test_failures_in_a_row_count_by_kind_until_a_good_answer() -> None:
    pool = online_pool(A)
    counts = [pool.count_failure(0, "cuda_oom"), pool.count_failure(0, "cuda_oom"), pool.count_failure(0, "timeout")]
    pool.answered(0)
    assert counts == [1, 2, 1]
    assert pool.count_failure(0, "cuda_oom") == 1


def test_an_ejection_may_carry_its_own_time_out() -> None:
    pool = online_pool(A, thresholds=Thresholds(2, 1, cooldown_seconds=60))
    event = pool.eject(0, now=100.0, reason="error_type=model_load_failed", cooldown_seconds=10)
    early = pool.record_probe(0, ProbeResult(109.9, ok=True), now=109.9)
    back = pool.record_probe(0, ProbeResult(110.0, ok=True), now=110.0)
    assert event is not None and event.transition is Transition.EJECTED
    assert early is None and back is not None and back.transition is Transition.CAME_ONLINE


def test_the_next_hold_end_is_the_soonest_rest_or_drain() -> None:
    pool = online_pool(A, B, C)
    assert pool.next_hold_end() == math.inf
    pool.rest(0, now=0.0, seconds=4.0)
    pool.lease(1, now=0.0)
    pool.release(1, now=1.0, drain_seconds=2.0)
    assert pool.next_hold_end() == 3.0


@pytest.mark.parametrize(
    ("resting", "leased", "offline", "load"),
    [
        ((), (), (), 0.0),
        ((0,), (), (), 1 / 3),
        ((0,), (1,), (), 2 / 3),
        ((0,), (1,), (2,), 1.0),  # both online hosts take no job
        ((), (), (0, 1, 2), 1.0),  # none online: nothing can take one
        ((), (1,), (0,), 0.5),
    ],
)
def test_the_load_is_busy_or_resting_online_workers_over_online_ones(resting, leased, offline, load) -> None:
    pool = online_pool(A, B, C)
    for index in resting:
        pool.rest(index, now=0.0, seconds=5.0)
    for index in leased:
        pool.lease(index, now=0.0)
    for index in offline:
        pool.eject(index, now=0.0, reason="test")
    assert pool.load(now=1.0) == pytest.approx(load)


def test_a_rest_over_counts_no_more_in_the_load_before_anyone_expires_it() -> None:
    pool = online_pool(A, B)
    pool.rest(0, now=0.0, seconds=2.0)
    assert (pool.load(now=1.9), pool.load(now=2.0)) == (0.5, 0.0)


def test_seconds_until_free_is_the_soonest_any_worker_may_take_a_job() -> None:
    pool = online_pool(A, B, thresholds=Thresholds(2, 1, cooldown_seconds=60))
    pool.rest(0, now=0.0, seconds=4.0)
    pool.lease(1, now=0.0)
    assert pool.seconds_until_free(1.0, probe_interval_seconds=8, busy_seconds=2) == 2.0  # B's job
    pool.release(1, now=1.0)
    pool.rest(1, now=1.0, seconds=8.0)
    assert pool.seconds_until_free(1.0, probe_interval_seconds=8, busy_seconds=2) == 3.0  # A's rest
    pool.eject(0, now=1.0, reason="error_type=cuda_error")
    assert pool.seconds_until_free(1.0, probe_interval_seconds=8, busy_seconds=2) == 8.0  # B's rest
