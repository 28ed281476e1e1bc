"""`hairgate edge`: load and check settings, then `serve()` — the whole lifecycle in one place.

Start-up order is the promise made to monitoring: the first probe round finishes (and
`Worker 池初始化完成 | …` is logged) before the port accepts a connection. SIGTERM or
SIGINT stops accepting, lets in-flight requests finish (up to the longest request
timeout), then stops the background tasks; the process exits 0.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import hypercorn.trio
import trio
from hypercorn.config import Config

from edge.app import build_gateway, create_app
from edge.idempotency import open_idempotency
from edge.metrics import metrics_app
from edge.prober import Prober
from edge.shared_state import redis_client
from shared.logs import configure_logging
from shared.settings import Settings, SettingsError, load_settings

log = logging.getLogger("edge")


def run(args: argparse.Namespace) -> int:
    configure_logging()
    try:
        settings = load_edge_settings(args.config, args.secrets, args.bind)
    except SettingsError as error:
        print(f"hairgate edge: {error}", file=sys.stderr)
        return 2
    try:
        trio.run(serve, settings)
    except BaseExceptionGroup as group:
        bind_errors, others = group.split(OSError)
        if bind_errors is None or others is not None:
            raise
        # the port is taken or not ours to bind: say so in one line
        print(f"hairgate edge: cannot serve on {settings.edge.bind}: {_first_leaf(bind_errors)}", file=sys.stderr)
        return 1
    return 0


def _first_leaf(group: BaseExceptionGroup) -> BaseException:
    error: BaseException = group
    while isinstance(error, BaseExceptionGroup):
        error = error.exceptions[0]
    return error


def load_edge_settings(config: str, secrets: str | None, bind: str | None) -> Settings:
    """Settings as the gateway needs them; SettingsError names the offending key."""
    settings = load_settings(config, secrets)
    if bind is not None:
        settings = settings.model_copy(update={"edge": settings.edge.model_copy(update={"bind": bind})})
    check_edge_settings(settings)
    return settings


def check_edge_settings(settings: Settings) -> None:
    """What the strict model cannot know: the gateway's own must-haves."""
    if not settings.auth.shared_password:
        raise SettingsError(
            "auth.shared_password is empty: set it in the secrets file or HAIRGATE_SHARED_PASSWORD"
        )
    if not settings.edge.pool.workers:
        raise SettingsError("edge.pool.workers is empty: the gateway needs at least one worker URL")
    for key, bind in (("edge.bind", settings.edge.bind), ("edge.metrics_bind", settings.edge.metrics_bind or "x:1")):
        host, _, port = bind.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise SettingsError(f"{key} must be HOST:PORT, got {bind!r}")


async def serve(
    settings: Settings,
    shutdown_trigger: Callable[[], Awaitable[None]] | None = None,
    *,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run one gateway until `shutdown_trigger` returns (default: SIGTERM or SIGINT).

    Every task of the gateway is started here: the shared state is opened first, then the
    background tasks (the prober's first round before anything listens), then the public
    listener and the metrics listener. Stopping runs the other way round.
    """
    stopping = trio.Event()
    edge = settings.edge
    async with redis_client(edge.shared_state.redis_url) as redis:
        idempotency = await open_idempotency(edge.idempotency, redis) if edge.idempotency.enabled else None
        gateway = build_gateway(settings, idempotency=idempotency, redis=redis)
        checks = edge.health_check
        prober = Prober(
            gateway.dispatcher,
            gateway.upstream.probe,
            path=checks.path,
            interval_seconds=checks.interval_seconds,
            timeout_seconds=checks.timeout_seconds,
        )
        try:
            async with trio.open_nursery() as background:
                await background.start(gateway.request_log.run)
                if idempotency is not None:
                    await background.start(idempotency.run)
                await background.start(prober.run)  # returns after the first probe round
                background.start_soon(_stop_on, shutdown_trigger or wait_for_stop_signal, stopping)
                async with trio.open_nursery() as server:
                    urls = await server.start(_serve, create_app(gateway), hypercorn_config(settings), stopping)
                    if edge.metrics_bind:
                        metrics_urls = await server.start(
                            _serve, metrics_app(gateway.metrics), _metrics_config(edge.metrics_bind), stopping
                        )
                        log.info("指标服务已启动 | 地址=%s/metrics", " ".join(metrics_urls))
                    log.info("网关开始服务 | 地址=%s", " ".join(urls))
                    task_status.started(urls)
                log.info("网关已停止接收请求，进行中的请求已结束")
                background.cancel_scope.cancel()  # the server has drained: stop probing, flush the log
        finally:
            with trio.CancelScope(shield=True):
                await gateway.upstream.aclose()
                if idempotency is not None:
                    await idempotency.aclose()


async def _serve(
    app: Any, config: Config, stopping: trio.Event, *, task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED
) -> None:
    await hypercorn.trio.serve(app, config, shutdown_trigger=stopping.wait, task_status=task_status)


async def _stop_on(trigger: Callable[[], Awaitable[None]], stopping: trio.Event) -> None:
    await trigger()
    stopping.set()


def _metrics_config(bind: str) -> Config:
    config = Config()
    config.bind = [bind]
    config.include_server_header = False
    config.accesslog = None
    config.errorlog = logging.getLogger("hypercorn.error")
    return config


def hypercorn_config(settings: Settings) -> Config:
    config = Config()
    config.bind = [settings.edge.bind]
    dispatch = settings.edge.dispatch
    config.graceful_timeout = max(dispatch.request_timeout_seconds, dispatch.slow_request_timeout_seconds)
    config.include_server_header = False
    config.accesslog = None  # the request log is ours; hypercorn's would double it
    config.errorlog = logging.getLogger("hypercorn.error")  # through our handler, once
    if settings.edge.certfile:
        config.certfile, config.keyfile = settings.edge.certfile, settings.edge.keyfile
    return config


async def wait_for_stop_signal() -> None:
    # SIGHUP is received too, so that `systemctl reload` cannot kill the gateway (its default
    # action) and drop in-flight requests: settings reload is not built yet, say so instead.
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
        async for received in signals:
            if received == signal.SIGHUP:
                log.warning("收到 SIGHUP：网关暂不支持热加载配置，已忽略；修改配置后请重启网关")
                continue
            log.info("收到信号 %s，开始优雅退出", signal.Signals(received).name)
            return
