"""SIGHUP: apply re-read settings to a running gateway without failing a request.

`EDGE_SETTINGS` says for every `edge` setting whether a reload applies it (`LIVE`) or it
takes a restart (`RESTART`: the listeners, the files and stores opened at start, the
upstream client's CA); a test walks `EdgeSettings` against it, so a new setting cannot
be left undecided. A restart-only setting that changed keeps its old value, with one
warning naming it. Invalid new settings never get here: the caller logs one error line
and keeps serving with the old ones.

One idiom applies a reload, and `apply_settings` is the one place: it replaces
`Gateway.settings` (the record the next reload starts from; no request reads it), then
tells each component its part through the component's `reconfigure()` (the HTTP layer's
token, header limit, alternative entrance and document facts: `Gateway.entrance`; the
upstream client's token: `set_token`; the app's body bounds: `configure_limits`).
Requests in flight finish with what they started with. No component is handed a reader of
the live settings (a lambda over `gateway.settings`); `tests/edge/test_reload_idiom.py`
fails on one, `tests/edge/test_layout.py` on a read of `.settings` where a request runs,
and a test in `test_reload.py` fails if a component that has `reconfigure()` is missing
from the list below. The arguments the pool's and the forward service's
components take are computed by `edge.gateway`'s `*_options` functions, once for their
construction and for a reload.

Why the settings are pushed and not read when used: part of a reload is work, not a value
to read. The dispatcher retires removed workers, adds new ones, resizes its slots and
wakes or fails the requests waiting (`Dispatcher.reconfigure`); the rate limiter is rebuilt
only when its limits changed, because a new one starts with full buckets. A reader cannot
do either, so reading at use could only ever be the second idiom beside this one. Pushed,
each component holds exactly what the reload decided (restart-only keys kept as they were),
and the list of what a reload reaches is the body of `apply_settings`.

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
from edge.gateway import (
    Gateway,
    dispatch_options,
    forward_options,
    image_store,
    probe_options,
    retry_policy,
    thresholds,
    timeouts,
)
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
    "static_downloads": LIVE,  # for downloads that start after the reload
    "features": LIVE,
    "failures": LIVE,  # the forward service's backoffs from the next failure on; the alternative per answer
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
    """Make `new` the gateway's settings: the record, then each component told its part."""
    settings, kept = keep_restart_keys(gateway.settings, new)
    if kept:
        log.warning("SIGHUP：以下配置需重启网关才能生效，保持原值 | %s", ", ".join(kept))
    edge = settings.edge
    gateway.settings = settings  # the record the next reload and token switch start from
    gateway.entrance.reconfigure(settings)
    gateway.dispatcher.reconfigure(
        edge.pool.workers, edge.pool.primary_workers, thresholds(settings), **dispatch_options(settings)
    )
    prober.reconfigure(**probe_options(settings))
    images = image_store(settings, gateway.file_threads)
    gateway.api.reconfigure(images, retry_policy(settings), timeouts(settings), **forward_options(settings))
    gateway.upstream.set_token(settings.auth.shared_password)
    gateway.admission.reconfigure(edge.rate_limit)
    gateway.audit.reconfigure(edge.rate_limit)
    gateway.static_cleanup.reconfigure(edge.static_cleanup)
    gateway.features.reconfigure(edge.features, settings.analysis)
    gateway.static_downloads.reconfigure(edge.static_downloads)
    gateway.special_points.reconfigure(settings.analysis)
    configure_limits(app, settings)
    listener.reconfigure(edge)
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
