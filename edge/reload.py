"""SIGHUP: apply re-read settings to a running gateway without failing a request.

`EDGE_SETTINGS` says for every `edge` setting whether a reload applies it (`LIVE`) or it
takes a restart (`RESTART`: the listeners, the files and stores opened at start, the
upstream client's CA); a test walks `EdgeSettings` against it, so a new setting cannot
be left undecided. A restart-only setting that changed keeps its old value, with one
warning naming it. Invalid new settings never get here: the caller logs one error line
and keeps serving with the old ones.

A reload and a token switch (`POST /admin/token`) both hold `Gateway.settings_lock` from
reading to applying, so neither undoes the other: the one that comes second starts from
what the first left (the switch writes the secrets file that the reload then reads).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Literal

import trio
from pydantic import BaseModel
from quart_trio import QuartTrio

from edge.app import configure_limits
from edge.gateway import Gateway, image_store, retry_policy, scheduling_policy, thresholds
from edge.pool.prober import Prober
from edge.web.server import GatewayConfig
from shared.settings import Settings

log = logging.getLogger("edge.reload")

LIVE: Literal["live"] = "live"
RESTART: Literal["restart"] = "restart"

# Dotted below `edge.`; a section listed whole applies whole.
EDGE_SETTINGS: dict[str, Literal["live", "restart"]] = {
    "bind": RESTART,
    "metrics_bind": RESTART,
    "certfile": RESTART,
    "keyfile": RESTART,
    "public_base_url": LIVE,
    "static_dir": RESTART,
    "request_log": RESTART,
    "request_log_max_bytes": RESTART,  # belongs to the log file opened at start
    "max_body_bytes": LIVE,
    "max_header_bytes": LIVE,  # the app's check, and h11's buffer for new connections
    "body_idle_timeout_seconds": LIVE,
    "body_timeout_seconds": LIVE,
    "shared_state": RESTART,
    "idempotency": RESTART,
    "audit": RESTART,  # the store is opened at start
    "cpu": RESTART,
    "rate_limit": LIVE,
    "pool.workers": LIVE,
    "pool.primary_workers": LIVE,
    "pool.ca_file": RESTART,  # the upstream client's TLS context is built at start
    "health_check": LIVE,
    "dispatch": LIVE,  # request timeouts include the shutdown grace (`GatewayConfig`)
    "static_cleanup": LIVE,
    "features": LIVE,
}


def restart_keys() -> list[str]:
    return [key for key, status in EDGE_SETTINGS.items() if status == RESTART]


def keep_restart_keys(current: Settings, new: Settings) -> tuple[Settings, list[str]]:
    """`new` with the restart-only settings of `current`, and the names of those that differed."""
    edge = new.edge
    changed = []
    for key in restart_keys():
        old = _get(current.edge, key)
        if _get(edge, key) != old:
            changed.append(f"edge.{key}")
            edge = _replace(edge, key, old)
    return new.model_copy(update={"edge": edge}), changed


async def reload_settings(
    gateway: Gateway, app: QuartTrio, prober: Prober, listener: GatewayConfig, read: Callable[[], Settings]
) -> None:
    """Read the settings (`read` may raise SettingsError) and apply them, under the lock."""
    async with gateway.settings_lock:
        new = await trio.to_thread.run_sync(read)
        apply_settings(gateway, app, prober, listener, new)


def apply_settings(gateway: Gateway, app: QuartTrio, prober: Prober, listener: GatewayConfig, new: Settings) -> None:
    """Make `new` the gateway's settings; requests in flight finish under the old ones."""
    settings, kept = keep_restart_keys(gateway.settings, new)
    if kept:
        log.warning("SIGHUP：以下配置需重启网关才能生效，保持原值 | %s", ", ".join(kept))
    edge = settings.edge
    gateway.settings = settings  # first: the token check and the header limit read it per request
    gateway.dispatcher.reconfigure(
        edge.pool.workers,
        edge.pool.primary_workers,
        thresholds(settings),
        max_inflight=edge.dispatch.max_inflight,
        queue_wait_seconds=edge.dispatch.queue_wait_seconds,
        max_queue_wait_seconds=edge.dispatch.max_queue_wait_seconds,
        policy=scheduling_policy(settings),
    )
    checks = edge.health_check
    prober.reconfigure(
        path=checks.path,
        interval_seconds=checks.interval_seconds,
        timeout_seconds=checks.timeout_seconds,
        request_timeout_seconds=edge.dispatch.request_timeout_seconds,
    )
    gateway.api.reconfigure(
        image_store(settings, gateway.file_threads),
        retry_policy(settings),
        request_timeout_seconds=edge.dispatch.request_timeout_seconds,
        slow_request_timeout_seconds=edge.dispatch.slow_request_timeout_seconds,
        probe_interval_seconds=checks.interval_seconds,
        limits=settings.analysis,
    )
    gateway.upstream.set_token(settings.auth.shared_password)
    gateway.admission.reconfigure(edge.rate_limit)
    gateway.audit.reconfigure(edge.rate_limit)
    gateway.static_cleanup.reconfigure(edge.static_cleanup)
    gateway.features.reconfigure(edge.features, settings.analysis)
    gateway.special_points.reconfigure(settings.analysis)
    configure_limits(app, settings)
    listener.reconfigure(edge)  # the rest reads `gateway.settings` when it needs it
    stats = gateway.pool.statistics()
    log.info(
        "SIGHUP：配置已重新加载 | 总数=%d | 在线=%d | 主worker=%d",
        stats.workers_total,
        stats.workers_healthy,
        stats.workers_primary_total,
    )


def _get(section: BaseModel, dotted: str) -> Any:
    for name in dotted.split("."):
        section = getattr(section, name)
    return section


def _replace(section: Any, dotted: str, value: Any) -> Any:
    name, _, rest = dotted.partition(".")
    inner = _replace(getattr(section, name), rest, value) if rest else value
    return section.model_copy(update={name: inner})
