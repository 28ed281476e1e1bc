"""The serving runtime both services start (`shared.serving`): the bind check, and the signal
loop driven by real signals sent to this process."""

import logging
import os
import signal

import pytest
import trio
import trio.testing

from shared.serving import SignalLog, check_bind, handle_signals
from shared.settings import SettingsError

LOG = SignalLog(logging.getLogger("test.serving"), stopping="%s: stopping", reload_refused="not reloaded: %s")


@pytest.mark.parametrize("bind", ["127.0.0.1:8080", "0.0.0.0:1", "[::1]:65535", "host.example:443"])
def test_a_host_and_port_is_a_bind(bind):
    assert check_bind("edge.bind", bind) == bind


@pytest.mark.parametrize("bind", ["8080", ":8080", "127.0.0.1:", "127.0.0.1:0", "127.0.0.1:65536", "127.0.0.1:http"])
def test_anything_else_is_refused_naming_the_key(bind):
    with pytest.raises(SettingsError, match=r"^gpu_host\.bind must be HOST:PORT, got "):
        check_bind("gpu_host.bind", bind)


async def _signalled(received: trio.Event) -> None:
    os.kill(os.getpid(), signal.SIGHUP)
    await received.wait()


async def test_sighup_reloads_and_a_bad_reload_keeps_serving(caplog):
    stopping = trio.Event()
    reloads: list[str] = []
    answered = trio.Event()

    async def reload() -> None:
        reloads.append("called")
        answered.set()
        if len(reloads) == 1:
            raise SettingsError("edge.pool.workers is empty")

    async with trio.open_nursery() as nursery:
        await nursery.start(handle_signals, stopping, reload, LOG)
        await _signalled(answered)
        answered = trio.Event()
        await _signalled(answered)  # the loop survived the refused reload
        nursery.cancel_scope.cancel()
    assert reloads == ["called", "called"]
    assert not stopping.is_set()
    assert [record.getMessage() for record in caplog.records if record.levelno == logging.ERROR] == [
        "not reloaded: edge.pool.workers is empty"
    ]


async def test_sigterm_stops_and_a_second_one_does_not_kill_the_draining_service():
    stopping = trio.Event()

    async def reload() -> None:
        raise AssertionError("SIGTERM is not a reload")

    async with trio.open_nursery() as nursery:
        await nursery.start(handle_signals, stopping, reload, LOG)
        os.kill(os.getpid(), signal.SIGTERM)
        await stopping.wait()
        # with the receiver closed, SIGTERM's default action would end this test's process
        os.kill(os.getpid(), signal.SIGTERM)
        await trio.testing.wait_all_tasks_blocked()
        nursery.cancel_scope.cancel()
    assert stopping.is_set()
