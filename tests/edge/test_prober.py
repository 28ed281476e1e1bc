"""The prober in virtual time with fake probe functions (no sockets)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from functools import partial

import pytest
import trio
import trio.testing

from edge.pool.dispatch import IMPATIENT_FRACTION, Dispatcher
from edge.pool.pool import FREE_CONFIRM_SECONDS, Pool, Thresholds
from edge.pool.prober import (
    HELD_FAST_SECONDS,
    HELD_PROBE_INTERVAL_SECONDS,
    HELD_SLOW_PROBE_INTERVAL_SECONDS,
    HealthAnswer,
    Prober,
    judge,
)

URLS = ["http://w0", "http://w1", "http://w2"]


class FakeWorkers:
    """Answers probes per URL: an HealthAnswer, an exception to raise, or "hang"."""

    def __init__(self, answers: Mapping[str, object]) -> None:
        self.answers = dict(answers)
        self.calls: list[tuple[str, float]] = []
        self.wanted: list[bool] = []

    async def probe(self, url: str, timeout: float, wanted: bool = False) -> HealthAnswer:
        self.calls.append((url, trio.current_time()))
        self.wanted.append(wanted)
        answer = self.answers[url.removesuffix("/health")]
        if answer == "hang":
            await trio.sleep_forever()
        if isinstance(answer, Exception):
            raise answer
        assert isinstance(answer, HealthAnswer)
        return answer


HEALTHY = HealthAnswer(200, b'{"status": "ok"}')


def make(
    answers: Mapping[str, object], primaries=(), thresholds=Thresholds(2, 1, 60)
) -> tuple[Prober, Dispatcher, FakeWorkers]:
    pool = Pool(list(answers), primaries, thresholds)
    dispatcher = Dispatcher(pool, max_inflight=8, queue_wait_seconds=30, max_queue_wait_seconds=590)
    fakes = FakeWorkers(answers)
    prober = Prober(dispatcher, fakes.probe, path="/health", interval_seconds=8, timeout_seconds=3)
    return prober, dispatcher, fakes


@pytest.mark.parametrize(
    ("answer", "ok", "busy"),
    [
        (HealthAnswer(200, b'{"status":"ok"}'), True, False),
        (HealthAnswer(200, b'{"status":"ok","busy":true}'), True, True),
        (HealthAnswer(200, b'{"busy":"yes"}'), True, False),
        (HealthAnswer(200, b"[1]"), True, False),
        (HealthAnswer(200, b"<html>ok</html>"), False, False),
        (HealthAnswer(503, b'{"status":"loading"}'), False, False),
        (HealthAnswer(401, b'{"detail":"bad token"}'), False, False),
    ],
)
def test_judge(answer: HealthAnswer, ok: bool, busy: bool) -> None:
    result = judge(answer, sent_at=1.0)
    assert (result.ok, result.busy) == (ok, busy)


async def test_first_round_completes_before_started_and_logs_once(autojump_clock, caplog) -> None:
    caplog.set_level(logging.INFO, logger="edge.pool")
    answers = {URLS[0]: HEALTHY, URLS[1]: ConnectionRefusedError("refused"), URLS[2]: "hang"}
    prober, dispatcher, fakes = make(answers, primaries=(URLS[0], URLS[1]))
    async with trio.open_nursery() as nursery:
        started = trio.current_time()
        await nursery.start(prober.run)
        # all three probed concurrently: the hanging one bounds the round at the timeout
        assert trio.current_time() - started == pytest.approx(3)
        assert [w.online for w in dispatcher.pool.workers] == [True, False, False]
        await trio.sleep(30)
        nursery.cancel_scope.cancel()
    lines = [r.getMessage() for r in caplog.records if "池初始化完成" in r.getMessage()]
    assert lines == ["Worker 池初始化完成 | 总数=3 | 在线=1 | 主worker=2"]
    rounds = sorted({at for url, at in fakes.calls if url == URLS[0] + "/health"})
    assert rounds == [0, 8, 16, 24, 32]  # every interval from the first round, not from its end


async def test_worker_going_down_then_up_is_logged_on_transitions_only(autojump_clock, caplog) -> None:
    caplog.set_level(logging.INFO, logger="edge.pool")
    prober, dispatcher, fakes = make({URLS[0]: HEALTHY})
    await prober.probe_all()
    fakes.answers[URLS[0]] = HealthAnswer(503, b"{}")
    for _ in range(4):
        await prober.probe_all()
    assert not dispatcher.pool.workers[0].online
    fakes.answers[URLS[0]] = HEALTHY
    await prober.probe_all()
    messages = [r.getMessage().split(" |")[0] for r in caplog.records]
    assert messages == ["Worker 上线", "Worker 下线", "Worker 上线"]
    assert [r.levelname for r in caplog.records] == ["INFO", "WARNING", "INFO"]


async def test_busy_health_keeps_a_worker_from_dispatch_until_later_probes(autojump_clock) -> None:
    prober, dispatcher, fakes = make({URLS[0]: HealthAnswer(200, b'{"busy": true}')})
    await prober.probe_all()
    assert dispatcher.pool.workers[0].online and dispatcher.pool.select() is None
    fakes.answers[URLS[0]] = HEALTHY
    await prober.probe_all()
    assert dispatcher.pool.select() is None, "free once: another gateway's next job may be on its way"
    await trio.sleep(FREE_CONFIRM_SECONDS)
    await prober.probe_all()
    assert dispatcher.pool.select() is not None


async def test_a_round_that_finds_a_host_busy_has_it_followed_and_confirmed_free(autojump_clock) -> None:
    # a round's busy answer held the worker for a whole interval: nobody followed it
    prober, dispatcher, fakes = make({URLS[0]: HealthAnswer(200, b'{"busy": true}')})
    async with trio.open_nursery() as nursery:
        await nursery.start(prober.run)
        assert dispatcher.pool.select() is None
        await trio.sleep(0.25)
        fakes.answers[URLS[0]] = HEALTHY
        freed_at = trio.current_time()
        while dispatcher.pool.select() is None:
            await trio.sleep(0.001)
        waited = trio.current_time() - freed_at
        nursery.cancel_scope.cancel()
    assert waited <= HELD_PROBE_INTERVAL_SECONDS + FREE_CONFIRM_SECONDS + 0.01, "followed, not left to the next round"
    probes = [at for url, at in fakes.calls if url.startswith(URLS[0])]
    assert 4 <= len(probes) <= 6, "the round, every 100 ms while busy, then one look to confirm"


async def test_probe_does_not_wait_for_a_worker_serving_a_request(autojump_clock) -> None:
    prober, dispatcher, fakes = make({URLS[0]: HealthAnswer(200, b'{"busy": true}')})
    await prober.probe_all()
    fakes.answers[URLS[0]] = HEALTHY
    await prober.probe_all()
    async with dispatcher.worker():
        before = trio.current_time()
        fakes.answers[URLS[0]] = HealthAnswer(200, b'{"busy": true}')
        await prober.probe_all()  # probes while the lease is held
        assert trio.current_time() == before
    # that probe was sent during our request, so its "busy" is stale: still dispatchable
    assert dispatcher.pool.select() is not None


@pytest.mark.parametrize(
    ("answer", "ok", "loading", "checks", "timeout"),
    [
        (
            HealthAnswer(
                200,
                b'{"status":"ok","busy":false,"inference_timeout_seconds":50,"checks":{"disk":"ok","comfyui":"down"}}',
            ),
            True,
            False,
            {"disk": "ok", "comfyui": "down"},
            50,
        ),
        (
            HealthAnswer(503, b'{"status":"error","message":"...","checks":{"disk":"low","comfyui":"ok"}}'),
            False,
            False,
            {"disk": "low", "comfyui": "ok"},
            None,
        ),
        (HealthAnswer(503, b'{"status":"loading"}'), False, True, {}, None),
        (
            HealthAnswer(200, b'{"status":"ok","checks":{"disk":1,"comfyui":"ok"},"inference_timeout_seconds":true}'),
            True,
            False,
            {"comfyui": "ok"},
            None,
        ),  # what is not a string (or a number) is ignored
        (HealthAnswer(200, b'{"status":"ok","checks":"all good"}'), True, False, {}, None),
        (HealthAnswer(502, b"<html>bad gateway</html>"), False, False, None, None),  # no body: keep the last
    ],
)
def test_judge_reads_checks_loading_and_the_inference_timeout(answer, ok, loading, checks, timeout) -> None:
    result = judge(answer, sent_at=1.0)
    assert (result.ok, result.loading, result.checks, result.inference_timeout_seconds) == (
        ok,
        loading,
        checks,
        timeout,
    )


async def test_a_loading_host_is_logged_at_info_saying_loading(autojump_clock, caplog) -> None:
    caplog.set_level(logging.INFO, logger="edge.pool")
    prober, _dispatcher, _fakes = make({URLS[0]: HealthAnswer(503, b'{"status":"loading"}')})
    for _ in range(3):
        await prober.probe_all()
    records = [r for r in caplog.records if r.name == "edge.pool"]
    assert [(r.levelname, "loading" in r.getMessage()) for r in records] == [("INFO", True)]
    assert "探活失败" not in records[0].getMessage()


async def test_one_warning_per_worker_whose_inference_timeout_leaves_no_margin(autojump_clock, caplog) -> None:
    caplog.set_level(logging.INFO, logger="edge.pool")

    def health(timeout: float) -> HealthAnswer:
        return HealthAnswer(200, b'{"status":"ok","inference_timeout_seconds":%g}' % timeout)

    # the margin the settings check asks of one file: max(1 s, 5 %) of the gateway's 60 s = 3 s
    answers = {URLS[0]: health(50), URLS[1]: health(58), URLS[2]: health(57)}
    prober, _dispatcher, fakes = make(answers)
    prober.reconfigure(path="/health", interval_seconds=8, timeout_seconds=3, request_timeout_seconds=60)
    for _ in range(3):
        await prober.probe_all()
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "worker=1" in warnings[0] and "(58)" in warnings[0]
    fakes.answers[URLS[0]] = health(65)  # a host reloaded with a longer timeout: named once more
    await prober.probe_all()
    await prober.probe_all()
    assert len([r for r in caplog.records if r.levelname == "WARNING"]) == 2


async def test_a_departure_is_probed_at_once_then_every_100_ms_until_free(autojump_clock) -> None:
    busy = HealthAnswer(200, b'{"status":"ok","busy":true}')
    prober, dispatcher, fakes = make({URLS[0]: HEALTHY})
    async with trio.open_nursery() as nursery:
        await nursery.start(prober.run)
        fakes.calls.clear()
        fakes.answers[URLS[0]] = busy
        with trio.move_on_after(1):  # a client leaves 1 s into its forward
            async with dispatcher.worker() as lease:
                with lease.forwarding(60):
                    await trio.sleep_forever()
        departed_at = trio.current_time()
        await trio.sleep(0.35)
        assert not dispatcher.pool.workers[0].idle
        fakes.answers[URLS[0]] = HEALTHY
        await trio.sleep(0.1)
        assert dispatcher.pool.workers[0].idle
        nursery.cancel_scope.cancel()
    probed = [round(at - departed_at, 3) for _, at in fakes.calls]
    assert probed == [0, 0.1, 0.2, 0.3, 0.4], "at once, then every 100 ms, and no more once free"


async def test_a_host_kept_busy_elsewhere_is_looked_at_less_often_after_a_while(autojump_clock) -> None:
    # 3 gateways x 10 probes a second on every host another gateway kept took the CPU the jobs needed
    prober, dispatcher, fakes = make({URLS[0]: HealthAnswer(200, b'{"busy": true}')})
    async with trio.open_nursery() as nursery:
        await nursery.start(prober.run)
        await trio.sleep(3.0)
        nursery.cancel_scope.cancel()
    probes = [at for url, at in fakes.calls if url.startswith(URLS[0])]
    fast = HELD_FAST_SECONDS / HELD_PROBE_INTERVAL_SECONDS
    slow = (3.0 - HELD_FAST_SECONDS) / HELD_SLOW_PROBE_INTERVAL_SECONDS
    assert len(probes) <= 1 + fast + slow + 2, "every 100 ms for the first second, then every 400 ms"
    assert dispatcher.pool.select() is None


async def test_a_host_kept_elsewhere_is_asked_for_once_a_request_here_has_waited_long(autojump_clock) -> None:
    # gateway.md § Several gateways: only the host sees who waits for it; the gateway that
    # holds it reads "wanted" on its own probes and gives it a turn
    prober, dispatcher, fakes = make({URLS[0]: HEALTHY})
    await prober.probe_all()
    fakes.answers[URLS[0]] = HealthAnswer(200, b'{"status": "ok", "busy": true}')  # job after job
    dispatcher.pool.lease(0, trio.current_time())
    dispatcher.pool.release(0, trio.current_time(), busy_elsewhere=True)  # another gateway's job
    async with trio.open_nursery() as nursery:
        nursery.start_soon(partial(_wait_for_worker, dispatcher))
        await trio.testing.wait_all_tasks_blocked()
        await prober.probe_all()
        await trio.sleep(IMPATIENT_FRACTION * dispatcher.queue_wait_seconds + 0.1)
        await prober.probe_all()
        assert dispatcher.pool.workers[0].asked_for_at == trio.current_time()
        nursery.cancel_scope.cancel()
    assert fakes.wanted == [False, False, True]


async def _wait_for_worker(dispatcher: Dispatcher) -> None:
    async with dispatcher.worker():
        pass
