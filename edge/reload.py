"""SIGHUP: apply re-read settings to a running gateway without failing a request.

What changes live: the worker list and primaries (a new worker is probed before it gets
traffic; a removed one finishes its request and gets nothing new), health-check and
dispatch timings, the shared password, rate limits, body and header limits, the public
URL of images, the static clean-up numbers, endpoint 4's LLM settings. What cannot change while serving — the
listeners, the files and stores opened at start — keeps its old value, with one warning
naming the keys. Invalid new settings never get here: the caller logs one error line and
keeps serving with the old ones.
"""

from __future__ import annotations

import logging

from edge.gateway import Gateway, image_store, retry_policy, router_limits, thresholds
from edge.web.http import Router
from edge.pool.prober import Prober
from edge.admission.rate_limit import ClientKeys, build_rate_limiter
from shared.settings import Settings

log = logging.getLogger("edge.reload")

# `edge` keys that take a restart: listeners, files and stores opened at start.
RESTART_KEYS = (
    "bind", "metrics_bind", "certfile", "keyfile", "static_dir", "request_log", "shared_state", "idempotency", "cpu",
)  # fmt: skip


def keep_restart_keys(current: Settings, new: Settings) -> tuple[Settings, list[str]]:
    """`new` with the restart-only keys of `current`, and the names of those that differed."""
    changed = [key for key in RESTART_KEYS if getattr(current.edge, key) != getattr(new.edge, key)]
    edge = new.edge.model_copy(update={key: getattr(current.edge, key) for key in changed})
    return new.model_copy(update={"edge": edge}), [f"edge.{key}" for key in changed]


def apply_settings(gateway: Gateway, router: Router, prober: Prober, new: Settings) -> None:
    """Make `new` the gateway's settings; requests in flight finish under the old ones."""
    settings, kept = keep_restart_keys(gateway.settings, new)
    if kept:
        log.warning("SIGHUP：以下配置需重启网关才能生效，保持原值 | %s", ", ".join(kept))
    edge = settings.edge
    rate_limit_changed = edge.rate_limit != gateway.settings.edge.rate_limit
    gateway.settings = settings  # first: the router reads the token and routes read limits from it
    gateway.dispatcher.reconfigure(
        edge.pool.workers,
        edge.pool.primary_workers,
        thresholds(settings),
        max_inflight=edge.dispatch.max_inflight,
        queue_wait_seconds=edge.dispatch.queue_wait_seconds,
        max_queue_wait_seconds=edge.dispatch.max_queue_wait_seconds,
    )
    checks = edge.health_check
    prober.reconfigure(path=checks.path, interval_seconds=checks.interval_seconds, timeout_seconds=checks.timeout_seconds)
    gateway.api.reconfigure(
        image_store(settings, gateway.file_threads),
        retry_policy(settings),
        request_timeout_seconds=edge.dispatch.request_timeout_seconds,
        slow_request_timeout_seconds=edge.dispatch.slow_request_timeout_seconds,
        probe_interval_seconds=checks.interval_seconds,
        limits=settings.analysis,
    )
    gateway.upstream.set_token(settings.auth.shared_password)
    if rate_limit_changed:  # a new limiter starts with full buckets: only when asked for
        gateway.admission.limiter = build_rate_limiter(edge.rate_limit, gateway.redis)
        gateway.admission.client_keys = ClientKeys(edge.rate_limit)
    gateway.features.settings = edge.features
    gateway.features.limits = gateway.special_points.limits = settings.analysis
    router.reconfigure(router_limits(settings))  # the routes read everything else through `gateway`
    stats = gateway.pool.statistics()
    log.info("SIGHUP：配置已重新加载 | 总数=%d | 在线=%d | 主worker=%d", stats.workers_total, stats.workers_healthy, stats.workers_primary_total)
