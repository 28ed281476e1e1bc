"""The supervisor and the pipe, with a real spawned child running the fake entry point."""

from __future__ import annotations

import multiprocessing.context
import os
import select
import signal
import threading
from pathlib import Path
from typing import ClassVar

import pytest
import trio
import trio.testing

from gpu_host.model_process import ModelBusy, ModelProcess, ModelUnavailable
from gpu_host.supervisor import Phase
from shared.contract import Code, ContractError
from tests.gpu_host.conftest import Fifos, fake_model
from tests.gpu_host.processes import is_running

WAIT = 30  # generous upper bound for a spawn on a loaded 2-core machine; never reached when healthy


async def _started(nursery: trio.Nursery, model: ModelProcess) -> ModelProcess:
    await nursery.start(model.run)
    with trio.fail_after(WAIT):
        await model.wait_ready()
    return model


async def test_ready_child_answers_with_its_result_and_reports_device() -> None:
    async with trio.open_nursery() as nursery:
        model = await _started(nursery, fake_model())
        data = await model.infer("rid-1", "measure", b"hello", {"gender": "male"})
        stats = model.statistics()
        nursery.cancel_scope.cancel()
    assert data["endpoint"] == "measure"
    assert data["image_bytes"] == 5
    assert data["options"] == {"gender": "male"}
    assert data["request_id"] == "rid-1"
    assert data["pid"] != os.getpid()
    assert (stats.state, stats.device, stats.segmenter, stats.busy) == (Phase.READY, "cpu", "fake", False)


async def test_contract_failure_crosses_the_pipe_as_code_and_message() -> None:
    async with trio.open_nursery() as nursery:
        model = await _started(nursery, fake_model())
        with pytest.raises(ContractError) as caught:
            await model.infer("rid", "measure", b"fail:1006", {})
        # an unexpected exception in the analysis is a 1007, and the child lives on
        with pytest.raises(ContractError) as bug:
            await model.infer("rid", "measure", b"raise", {})
        pid = model.statistics().pid
        after = await model.infer("rid", "measure", b"ok", {})
        nursery.cancel_scope.cancel()
    assert (caught.value.code, caught.value.message) == (Code.MULTIPLE_FACES, "scripted failure")
    assert bug.value.code is Code.SYSTEM_ERROR
    assert "boom" not in bug.value.message  # internals stay in the child's log
    assert after["pid"] == pid


async def test_child_killed_mid_request_gives_1007_then_a_new_child_serves(fifos: Fifos) -> None:
    async with trio.open_nursery() as nursery:
        model = await _started(nursery, fake_model())
        outcome: list[BaseException] = []
        answered = trio.Event()

        async def request() -> None:
            try:
                await model.infer("doomed", "measure", fifos.command, {})
            except ContractError as error:
                outcome.append(error)
            answered.set()

        nursery.start_soon(request)
        with trio.fail_after(WAIT):
            victim = await fifos.wait_entered()
        assert model.statistics().busy
        os.kill(victim, signal.SIGKILL)
        with trio.fail_after(WAIT):
            await answered.wait()
            assert not model.ready()
            await model.wait_ready()
        data = await model.infer("next", "measure", b"ok", {})
        stats = model.statistics()
        nursery.cancel_scope.cancel()
    assert [getattr(e, "code", None) for e in outcome] == [Code.SYSTEM_ERROR]
    assert data["pid"] != victim
    assert stats.restarts == 1


async def test_inference_over_the_timeout_is_killed_with_1007_and_recovers() -> None:
    async with trio.open_nursery() as nursery:
        model = await _started(nursery, fake_model(timeout=1.0))
        hung_pid = model.statistics().pid
        with pytest.raises(ContractError) as caught:
            await model.infer("slow", "measure", b"hang", {})
        assert not model.ready()  # not ready until the new child is
        assert "timed out" in (model.statistics().message or "")
        with trio.fail_after(WAIT):
            await model.wait_ready()
        data = await model.infer("next", "measure", b"ok", {})
        nursery.cancel_scope.cancel()
    assert caught.value.code is Code.SYSTEM_ERROR
    assert "超时" in caught.value.message
    assert data["pid"] != hung_pid


async def test_child_that_crashes_itself_is_replaced() -> None:
    async with trio.open_nursery() as nursery:
        model = await _started(nursery, fake_model())
        with pytest.raises(ContractError) as caught:
            await model.infer("x", "measure", b"crash", {})
        with trio.fail_after(WAIT):
            await model.wait_ready()
        assert (await model.infer("y", "mask", b"ok", {}))["endpoint"] == "mask"
        nursery.cancel_scope.cancel()
    assert caught.value.code is Code.SYSTEM_ERROR


async def test_load_failure_is_reported_and_not_retried() -> None:
    async with trio.open_nursery() as nursery:
        model = fake_model(load="fail")
        await nursery.start(model.run)
        with trio.fail_after(WAIT):
            while model.statistics().state is not Phase.FAILED:
                await model.wait_transition()
        stats = model.statistics()
        with pytest.raises(ModelUnavailable):
            await model.infer("x", "measure", b"ok", {})
        nursery.cancel_scope.cancel()
    assert stats.state is Phase.FAILED
    assert "weights file not found" in (stats.message or "")
    assert stats.restarts == 0


async def test_child_dying_while_loading_is_restarted_and_stays_not_ready() -> None:
    async with trio.open_nursery() as nursery:
        model = fake_model(load="exit")
        await nursery.start(model.run)
        with trio.fail_after(WAIT):
            while model.statistics().restarts < 2:
                await model.wait_transition()
        stats = model.statistics()
        nursery.cancel_scope.cancel()
    assert stats.state is Phase.WAITING  # backing off before the next try
    assert "exit code 3" in (stats.message or "")


async def test_a_second_request_while_one_runs_is_refused_busy_at_once(fifos: Fifos) -> None:
    async with trio.open_nursery() as nursery:
        model = await _started(nursery, fake_model())
        first_done = trio.Event()

        async def first() -> None:
            await model.infer("first", "measure", fifos.command, {})
            first_done.set()

        nursery.start_soon(first)
        with trio.fail_after(WAIT):
            await fifos.wait_entered()
        with trio.fail_after(1), pytest.raises(ModelBusy):  # at once: the host never queues
            await model.infer("second", "measure", b"ok", {})
        assert model.statistics().busy and not first_done.is_set()
        await fifos.release_child()
        with trio.fail_after(WAIT):
            await first_done.wait()
        after = await model.infer("third", "measure", b"ok", {})  # free again
        nursery.cancel_scope.cancel()
    assert after["request_id"] == "third"


async def test_a_caller_that_leaves_mid_inference_keeps_the_child_and_its_answer_is_dropped(fifos: Fifos) -> None:
    # A departed client (issue 16): the child finishes alone; it is never killed for it.
    async with trio.open_nursery() as nursery:
        model = await _started(nursery, fake_model())
        pid = model.statistics().pid
        with trio.CancelScope() as caller:

            async def leave_once_inside() -> None:
                await fifos.wait_entered()
                caller.cancel()

            nursery.start_soon(leave_once_inside)
            await model.infer("departed", "measure", fifos.command, {})
        busy_after_leaving = model.statistics().busy
        with pytest.raises(ModelBusy):  # one inference at a time still holds
            await model.infer("too-soon", "measure", b"ok", {})
        await fifos.release_child()
        with trio.fail_after(WAIT):
            await model.wait_idle()
        # the answer the child still owed is not the answer to the next request
        data = await model.infer("next", "measure", b"ok", {})
        stats = model.statistics()
        nursery.cancel_scope.cancel()
    assert caller.cancelled_caught
    assert busy_after_leaving
    assert data["request_id"] == "next" and data["pid"] == pid
    assert (stats.pid, stats.restarts, stats.state) == (pid, 0, Phase.READY)


async def test_a_request_deadline_shorter_than_the_inference_gives_1007_and_keeps_the_child(fifos: Fifos) -> None:
    async with trio.open_nursery() as nursery:
        model = await _started(nursery, fake_model())
        pid = model.statistics().pid
        with trio.fail_after(WAIT), pytest.raises(ContractError) as caught:
            await model.infer("late", "measure", fifos.command, {}, wait_seconds=0.2)
        with trio.fail_after(WAIT):
            await fifos.wait_entered()  # the child is still inside it
        assert model.statistics().busy
        await fifos.release_child()
        with trio.fail_after(WAIT):
            await model.wait_idle()
        data = await model.infer("next", "measure", b"ok", {})
        stats = model.statistics()
        nursery.cancel_scope.cancel()
    assert caught.value.code is Code.SYSTEM_ERROR and "0.2" in caught.value.message
    assert data["request_id"] == "next" and (stats.pid, stats.restarts) == (pid, 0)


# -- one definition of ready (defect 5), a loop that never blocks (defect 6) ---------------


def _wait_dead(pid: int) -> None:
    """Block (no checkpoint: no other task runs meanwhile) until `pid` has exited."""
    pidfd = os.pidfd_open(pid)
    try:
        readable, _, _ = select.select([pidfd], [], [], WAIT)
    finally:
        os.close(pidfd)
    assert readable, f"pid {pid} still running after {WAIT} s"


async def test_a_child_that_died_idle_makes_infer_unavailable_not_a_1007() -> None:
    async with trio.open_nursery() as nursery:
        model = await _started(nursery, fake_model())
        pid = model.statistics().pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        _wait_dead(pid)  # dead before the supervisor task has had a chance to notice
        health_ready = model.statistics().state is Phase.READY
        with pytest.raises(ModelUnavailable):  # 503, retried elsewhere; not a 1007 about the photo
            await model.infer("after-death", "measure", b"ok", {})
        nursery.cancel_scope.cancel()
    assert not health_ready  # /health and infer agree


class _SlowToReap(multiprocessing.context.SpawnProcess):
    """A child whose reaping (join) is held until the test says so, as a child stuck in the
    kernel after SIGKILL would be; records whether the test could run meanwhile."""

    entered = threading.Event()
    released = threading.Event()
    released_in_time: ClassVar[list[bool]] = []  # class-wide: the test reads it after the child is gone

    def join(self, timeout: float | None = None) -> None:
        if self.exitcode is None or not self.released_in_time:
            self.entered.set()
            self.released_in_time.append(self.released.wait(WAIT))
        super().join(timeout)


class _SlowToReapContext(multiprocessing.context.SpawnContext):
    Process = _SlowToReap


async def test_reaping_a_dead_child_never_blocks_the_event_loop() -> None:
    async with trio.open_nursery() as nursery:
        model = await _started(nursery, fake_model(context=_SlowToReapContext()))
        pid = model.statistics().pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        with trio.fail_after(WAIT):
            await trio.to_thread.run_sync(_SlowToReap.entered.wait)
        during = model.statistics()  # the loop runs while the reap is held
        _SlowToReap.released.set()
        with trio.fail_after(WAIT):
            await model.wait_ready()
        nursery.cancel_scope.cancel()
    assert _SlowToReap.released_in_time[:1] == [True]
    assert during.state is not Phase.READY


async def test_a_load_over_its_deadline_is_killed_logged_and_retried(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    gate = tmp_path / "gate"
    os.mkfifo(gate)  # never opened for writing: the fake child hangs before Ready
    async with trio.open_nursery() as nursery:
        model = fake_model(load_timeout=0.5, load_gate=str(gate))
        await nursery.start(model.run)
        first_pid = model.statistics().pid
        with trio.fail_after(WAIT):
            while model.statistics().restarts < 1:
                await model.wait_transition()
        stats = model.statistics()
        with trio.fail_after(WAIT):
            while model.statistics().pid in (None, first_pid):
                await model.wait_transition()
        nursery.cancel_scope.cancel()
    assert first_pid is not None and not is_running(first_pid)
    assert stats.state is Phase.WAITING
    assert "model load timed out after 0.5s" in (stats.message or "")
    assert "model load timed out" in caplog.text
