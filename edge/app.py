"""The app factory: the `Gateway` object graph, the Quart routes, and the ASGI front.

`build_gateway(settings)` wires pool, dispatcher, upstream client, image store, request
log and API service; `create_app(gateway)` returns the ASGI callable Hypercorn serves:
`/api/` and the status pages (`/health`, `/gateway-health`, `/monitor`) are answered by
the thin front (`edge.asgi`), every other path by a QuartTrio app whose handlers reach
the gateway through `current_app.extensions`, never module globals.
"""

from __future__ import annotations

import hmac
import logging
from dataclasses import dataclass

import trio
from quart import Response, current_app, request
from quart_trio import QuartTrio

from edge import monitor
from edge.api import ApiService
from edge.asgi import EdgeASGI, StatusPage
from edge.dispatch import Dispatcher
from edge.forward import RetryPolicy, Upstream
from edge.pool import Pool, Thresholds
from edge.request_log import RequestLog
from edge.rewrite import ImageStore
from edge.static_files import read_annotation
from shared.contract import HEADER_TOKEN
from shared.settings import Settings

log = logging.getLogger("edge.monitor")

_EXTENSION = "hairgate"
FAULT_BODY_LIMIT_BYTES = 64 * 1024
FILE_THREADS = 4  # concurrent file reads/writes; PNGs are small, the disk is the limit


@dataclass
class Gateway:
    """Everything the handlers and background tasks of one gateway process share."""

    settings: Settings
    dispatcher: Dispatcher
    upstream: Upstream
    request_log: RequestLog
    api: ApiService
    file_threads: trio.CapacityLimiter

    @property
    def pool(self) -> Pool:
        return self.dispatcher.pool


def build_gateway(settings: Settings, upstream: Upstream | None = None) -> Gateway:
    """The object graph of one gateway; tests pass a fake `upstream` (as httpx takes a transport)."""
    edge = settings.edge
    checks = edge.health_check
    pool = Pool(
        edge.pool.workers,
        edge.pool.primary_workers,
        Thresholds(checks.unhealthy_threshold, checks.healthy_threshold, checks.cooldown_seconds),
    )
    dispatcher = Dispatcher(
        pool,
        max_inflight=edge.dispatch.max_inflight,
        queue_wait_seconds=edge.dispatch.queue_wait_seconds,
        max_queue_wait_seconds=edge.dispatch.max_queue_wait_seconds,
    )
    upstream = upstream or Upstream(
        settings.auth.shared_password,
        keepalive_connections=2 * len(edge.pool.workers) + 8,
        ca_file=edge.pool.ca_file,
    )
    file_threads = trio.CapacityLimiter(FILE_THREADS)
    policy = RetryPolicy(edge.dispatch.retry_on_failure, edge.dispatch.max_retries, frozenset(edge.dispatch.slow_paths))
    api = ApiService(
        dispatcher,
        upstream,
        ImageStore(edge.static_dir, edge.public_base_url, file_threads),
        policy,
        request_timeout_seconds=edge.dispatch.request_timeout_seconds,
        slow_request_timeout_seconds=edge.dispatch.slow_request_timeout_seconds,
        probe_interval_seconds=checks.interval_seconds,
    )
    request_log = RequestLog(edge.request_log, edge.request_log_max_bytes)
    return Gateway(settings, dispatcher, upstream, request_log, api, file_threads)


def create_app(gateway: Gateway) -> EdgeASGI:
    return EdgeASGI(
        gateway.api,
        create_quart_app(gateway),
        gateway.request_log,
        gateway.settings.edge.max_body_bytes,
        status_pages(gateway.pool),
    )


def status_pages(pool: Pool) -> dict[str, StatusPage]:
    """The answers read from memory only; GET or HEAD, no auth, never a worker call."""
    return {
        "/health": lambda: (200, monitor.health()),
        "/gateway-health": lambda: (200, monitor.gateway_health(pool.statistics())),
        "/monitor": lambda: monitor.monitor(pool.statistics()),
    }


def create_quart_app(gateway: Gateway) -> QuartTrio:
    """The routes that need a request object or files: the drill switch and static PNGs."""
    app = QuartTrio(__name__, static_folder=None)
    app.json.sort_keys = False  # keep the documented field order of seed 001 §4
    app.json.ensure_ascii = False  # messages readable as the seed shows them
    app.config["MAX_CONTENT_LENGTH"] = FAULT_BODY_LIMIT_BYTES  # no route here needs more
    app.extensions[_EXTENSION] = gateway
    app.add_url_rule("/monitor/fault", view_func=_monitor_fault, methods=["POST"])
    app.add_url_rule("/static/<path:subpath>", view_func=_static, methods=["GET"])
    return app


def _gateway() -> Gateway:
    return current_app.extensions[_EXTENSION]


async def _monitor_fault() -> tuple[dict, int]:
    gateway = _gateway()
    # Read the (small) body even when refusing: a keep-alive connection whose request body
    # is left unread hangs in Hypercorn instead of serving the client's next request.
    raw = await request.get_data(as_text=False)
    if not _token_ok(request.headers.get(HEADER_TOKEN), gateway.settings.auth.shared_password):
        return monitor.error_answer(monitor.MSG_BAD_TOKEN), 401
    try:
        enabled = monitor.parse_fault_request(raw)
    except monitor.FaultRequestError:
        return monitor.error_answer(monitor.MSG_BAD_FAULT_BODY), 400
    if gateway.pool.set_drill(enabled):
        log.warning("模拟故障%s | 来源=%s", "已开启" if enabled else "已关闭", request.remote_addr)
    return monitor.fault_answer(enabled), 200


def _token_ok(given: str | None, expected: str) -> bool:
    return given is not None and hmac.compare_digest(given.encode(), expected.encode())


async def _static(subpath: str) -> Response | tuple[str, int]:
    gateway = _gateway()
    data = await read_annotation(gateway.settings.edge.static_dir, subpath, gateway.file_threads)
    if data is None:
        return "not found", 404
    return Response(data, mimetype="image/png")
