"""`hairgate gpu-host`: the whole serving lifecycle of one GPU host, in one place.

settings -> token guard -> model process -> app -> Hypercorn (trio worker) with a shutdown
trigger. SIGTERM/SIGINT: graceful stop, exit 0. SIGHUP: re-read the settings and swap the
accepted tokens (token rotation without a model reload); bad settings keep the old ones.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from collections.abc import Callable
from functools import partial

import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio import serve as hypercorn_serve

from gpu_host.app import create_app
from gpu_host.auth import TokenGuard
from gpu_host.model_process import ModelProcess
from gpu_host.protocol import ChildConfig
from shared.logs import configure_logging
from shared.settings import Settings, SettingsError, load_settings

log = logging.getLogger("gpu_host.main")

GRACEFUL_TIMEOUT_SECONDS = 5.0


def run(args: argparse.Namespace) -> int:
    configure_logging()
    reload = partial(load_settings, args.config, args.secrets)  # called again on SIGHUP
    try:
        settings = reload()
        bind = check_bind(args.bind or settings.gpu_host.bind)
        guard = TokenGuard(settings.auth.accept_passwords)
    except (SettingsError, ValueError) as error:
        print(f"hairgate gpu-host: {error}", file=sys.stderr)
        return 2
    bind_errors: list[BaseException] = []
    try:
        trio.run(serve, settings, bind, guard, reload)
    except* OSError as group:  # the port is taken, or the address is not ours
        bind_errors = _leaves(group)
    for error in bind_errors:
        print(f"hairgate gpu-host: cannot serve on {bind}: {error}", file=sys.stderr)
    return 1 if bind_errors else 0


def _leaves(error: BaseException) -> list[BaseException]:
    if isinstance(error, BaseExceptionGroup):
        return [leaf for inner in error.exceptions for leaf in _leaves(inner)]
    return [error]


def check_bind(bind: str) -> str:
    """`HOST:PORT` with a port in 1-65535; ValueError naming the key otherwise."""
    host, _, port = bind.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"invalid gpu_host.bind / --bind {bind!r}: expected HOST:PORT")
    return bind


def child_config(settings: Settings) -> ChildConfig:
    return ChildConfig(
        bisenet_weights=settings.gpu_host.bisenet_weights,
        device=settings.gpu_host.device,
        limits=settings.analysis,
    )


async def serve(
    settings: Settings,
    bind: str,
    guard: TokenGuard,
    reload: Callable[[], Settings],
) -> None:
    model = ModelProcess(
        child_config(settings), inference_timeout_seconds=settings.gpu_host.inference_timeout_seconds
    )
    app = create_app(model, guard, settings.analysis)
    config = HypercornConfig()
    config.bind = [bind]
    config.graceful_timeout = GRACEFUL_TIMEOUT_SECONDS
    config.accesslog = None  # one line per request comes from the app, with its request_id
    config.errorlog = logging.getLogger("hypercorn.error")
    shutdown = trio.Event()
    async with trio.open_nursery() as nursery:
        await nursery.start(_handle_signals, shutdown, guard, reload)
        log.info(
            "GPU host starting | bind=%s device=%s bisenet_weights=%s tokens=%d",
            bind,
            settings.gpu_host.device,
            settings.gpu_host.bisenet_weights or "(fallback segmenter)",
            len(settings.auth.accept_passwords),
        )
        await hypercorn_serve(app, config, shutdown_trigger=shutdown.wait)
        nursery.cancel_scope.cancel()
    log.info("GPU host stopped")


async def _handle_signals(
    shutdown: trio.Event,
    guard: TokenGuard,
    reload: Callable[[], Settings],
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
        task_status.started()
        async for signum in signals:
            if signum == signal.SIGHUP:
                _reload_tokens(guard, reload)
            else:
                log.info("%s received: stopping", signal.Signals(signum).name)
                shutdown.set()


def _reload_tokens(guard: TokenGuard, reload: Callable[[], Settings]) -> None:
    try:
        guard.replace(reload().auth.accept_passwords)
    except (SettingsError, ValueError) as error:
        log.error("SIGHUP: settings not reloaded, keeping the current tokens: %s", error)
