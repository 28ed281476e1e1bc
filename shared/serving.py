"""What both services do alike around their app (style.md § The second step): the bind
check and the signal loop. SIGTERM or SIGINT start the graceful stop; SIGHUP reloads (its
default action would kill the service and drop the requests in flight, so it always means
"reload", `systemctl reload`), and a reload whose settings do not load keeps the running
ones. Each service says what a reload applies (`edge.reload`, `gpu_host.main`) and in which
words its log says it; Hypercorn's own extensions are `shared.http_server.install`.
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import trio

from shared.settings import SettingsError


def check_bind(key: str, bind: str) -> str:
    """`bind` when it is HOST:PORT with a port in 1-65535; SettingsError naming `key` otherwise."""
    host, _, port = bind.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise SettingsError(f"{key} must be HOST:PORT, got {bind!r}")
    return bind


@dataclass(frozen=True)
class SignalLog:
    """Where and in which words a service logs what its signals did."""

    logger: logging.Logger
    stopping: str  # %s: the signal's name
    reload_refused: str  # %s: the SettingsError, which names the key


async def handle_signals(
    stopping: trio.Event,
    reload: Callable[[], Awaitable[None]],
    log: SignalLog,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Until cancelled: SIGTERM/SIGINT set `stopping`; SIGHUP awaits `reload`, and a
    SettingsError from it is one error line. The receiver stays open while the service
    drains, so a repeated SIGTERM (a supervisor's, an impatient operator's) does not fall
    back to the default action and cut the requests in flight short."""
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
        task_status.started()
        async for received in signals:
            if received != signal.SIGHUP:
                log.logger.info(log.stopping, signal.Signals(received).name)
                stopping.set()
                continue
            try:
                await reload()
            except SettingsError as error:
                log.logger.error(log.reload_refused, error)
