"""`hairgate edge`: load and check settings, then `serve()` — the whole lifecycle in one place.

Start-up order is the promise made to monitoring: the first probe round finishes (and
`Worker 池初始化完成 | …` is logged) before the port accepts a connection. SIGTERM or
SIGINT stops accepting, lets in-flight requests finish (up to the longest request
timeout), then stops the background tasks; the process exits 0.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

import hypercorn.trio
import trio
from hypercorn.config import Config
from quart_trio import QuartTrio

from edge.admission.idempotency import IdempotencyUnavailable, open_idempotency, store_kind
from edge.app import create_app
from edge.gateway import Gateway, build_gateway, probe_options
from edge.observe.metrics import metrics_app
from edge.pool.prober import Prober
from edge.reload import reload_settings
from edge.shared_state import redis_client
from edge.web.server import GatewayConfig, GatewayH11Protocol
from shared.http_server import install
from shared.logs import configure_logging
from shared.secrets_file import SecretsSource, is_header_safe
from shared.serving import SignalLog, check_bind, handle_signals
from shared.settings import ENV_SHARED_PASSWORD, Settings, SettingsError, load_settings

log = logging.getLogger("edge")


def run(args: argparse.Namespace) -> int:
    configure_logging()
    try:
        settings = load_edge_settings(args.config, args.secrets, args.bind)
    except SettingsError as error:
        print(f"hairgate edge: {error}", file=sys.stderr)
        return 2
    reload = partial(load_edge_settings, args.config, args.secrets, args.bind)
    secrets = SecretsSource.locate(args.config, args.secrets, ENV_SHARED_PASSWORD)
    try:
        trio.run(partial(serve, settings, reload=reload, secrets=secrets))
    except IdempotencyUnavailable as error:
        print(f"hairgate edge: cannot open the idempotency store (edge.idempotency.path): {error}", file=sys.stderr)
        return 1
    except BaseExceptionGroup as group:
        listener_errors, others = group.split(ListenerError)
        if listener_errors is None or others is not None:
            raise
        # the port is taken or not ours to bind: say so in one line
        print(f"hairgate edge: {_first_leaf(listener_errors)}", file=sys.stderr)
        return 1
    return 0


class ListenerError(Exception):
    """A listener could not serve; names its address (the OSError of a bind names none)."""

    def __init__(self, bind: str, error: OSError) -> None:
        super().__init__(f"cannot serve on {bind}: {error}")


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
        raise SettingsError("auth.shared_password is empty: set it in the secrets file or HAIRGATE_SHARED_PASSWORD")
    if not is_header_safe(settings.auth.shared_password):
        # it travels as a header value: a stray space or newline would fail every forward
        raise SettingsError(
            "auth.shared_password must be printable ASCII without spaces (check for a trailing newline)"
        )
    if not settings.edge.pool.workers:
        raise SettingsError("edge.pool.workers is empty: the gateway needs at least one worker URL")
    try:  # a store named but not configured: refused at start, as any other bad setting
        store_kind(settings.edge.idempotency, bool(settings.edge.shared_state.redis_url), settings.audit.postgres_dsn)
    except IdempotencyUnavailable as error:
        raise SettingsError(str(error)) from None
    check_bind("edge.bind", settings.edge.bind)
    if settings.edge.metrics_bind:
        check_bind("edge.metrics_bind", settings.edge.metrics_bind)


async def serve(
    settings: Settings,
    shutdown_trigger: Callable[[], Awaitable[None]] | None = None,
    *,
    reload: Callable[[], Settings] | None = None,
    secrets: SecretsSource | None = None,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run one gateway until `shutdown_trigger` returns (default: SIGTERM or SIGINT).

    SIGHUP calls `reload` and applies what it returns (`edge.reload`); without `reload` it
    is logged and ignored (it must never kill a serving gateway).

    Every task of the gateway is started here: the shared state is opened first, then the
    background tasks (the prober's first round before anything listens), then the public
    listener and the metrics listener. Stopping runs the other way round.
    """
    install(GatewayH11Protocol)  # Hypercorn HTTP/1.1-only and contained, before any listener opens
    stopping = trio.Event()
    edge = settings.edge
    async with redis_client(edge.shared_state.redis_url) as redis:
        idempotency = (
            await open_idempotency(edge.idempotency, redis, postgres_dsn=settings.audit.postgres_dsn)
            if edge.idempotency.enabled
            else None
        )
        gateway = build_gateway(settings, idempotency=idempotency, redis=redis, secrets=secrets)
        prober = Prober(gateway.dispatcher, gateway.upstream.probe, **probe_options(settings))
        listener = GatewayConfig(edge)
        try:
            async with trio.open_nursery() as background:
                await background.start(gateway.request_log.run)
                await background.start(gateway.audit.run)
                if idempotency is not None:
                    await background.start(idempotency.run)
                await background.start(gateway.static_cleanup.run)
                await background.start(gateway.face_workers.run)  # endpoints 4 and 99
                await background.start(gateway.features.run)
                await background.start(prober.run)  # returns after the first probe round
                # another gateway's host lease given back: its waiters here take the host at once
                await background.start(gateway.dispatcher.watch_host_leases)
                app = create_app(gateway)
                if shutdown_trigger is None:
                    on_hangup = partial(_reload, gateway, app, prober, listener, reload)
                    await background.start(handle_signals, stopping, on_hangup, _SIGNAL_LOG)
                else:
                    background.start_soon(_stop_on, shutdown_trigger, stopping)
                async with trio.open_nursery() as server:
                    urls = await server.start(_serve, app, listener, stopping)
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
    app: Any,
    config: Config,
    stopping: trio.Event,
    *,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    try:
        await hypercorn.trio.serve(app, config, shutdown_trigger=stopping.wait, task_status=task_status)
    except* OSError as errors:
        raise ListenerError(" ".join(config.bind), _first_os_error(errors)) from None


def _first_os_error(group: BaseExceptionGroup[OSError]) -> OSError:
    error = _first_leaf(group)
    assert isinstance(error, OSError)
    return error


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


_SIGNAL_LOG = SignalLog(
    log,
    stopping="收到信号 %s，开始优雅退出",
    reload_refused="SIGHUP：新配置无效，继续使用原配置 | %s",  # one line naming the key
)


async def _reload(
    gateway: Gateway, app: QuartTrio, prober: Prober, listener: GatewayConfig, reload: Callable[[], Settings] | None
) -> None:
    """SIGHUP: read the settings and apply them (SettingsError: the old ones keep serving)."""
    if reload is None:
        log.warning("收到 SIGHUP：未提供配置文件，无法重新加载，已忽略")
        return
    await reload_settings(gateway, app, prober, listener, reload)
    await prober.probe_all()  # new workers: probed now, not an interval from now
