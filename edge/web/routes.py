"""Every route the gateway serves, in one table: add a route here and nowhere else.

`routes(gateway)` lists them with their policy (methods, token, body limit, request log);
`edge.http.Router` applies that policy. Handlers reach the gateway's objects through
the `Gateway` passed in, never module globals.

| path                          | methods   | token | body    | what                           |
|-------------------------------|-----------|-------|---------|--------------------------------|
| /api/…                        | any       | no    | max_body_bytes | forwarded to a GPU host |
| /api/v1/face/special-points   | POST      | no    | max_body_bytes | endpoint 99, answered here |
| /api/v1/face/features         | POST      | no    | max_body_bytes | endpoint 4, answered here  |
| /health, /gateway-health      | GET, HEAD | no    | none    | liveness, pool counts          |
| /monitor                      | GET, HEAD | no    | none    | external alerting (seed 001)   |
| /monitor/fault                | POST      | yes   | 64 KiB  | the alert drill switch         |
| /static/annotations/<uuid>.png| GET, HEAD | no    | none    | annotation PNGs                |
| /admin/stats                  | GET       | yes   | none    | request aggregates             |
| /admin/workers                | GET, HEAD | yes   | none    | the pool, with addresses       |
| /admin/token                  | POST      | yes   | 4 KiB   | switch the shared token        |

Every `/api/` route is a business endpoint (`_api_route`): rate-limited before its body is
read, `Idempotency-Key` honoured (`edge.admission`), refused with envelopes, logged.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from edge.web import monitor
from edge.web.admin import ADMIN_BODY_LIMIT_BYTES, TokenAdmin
from edge.web.api import ApiAnswer
from edge.pool.forward import ForwardRequest
from edge.web.http import CLIENT_CLOSED, Outcome, Refusals, Request, Response, Route, encode, json_response
from edge.local.local_answer import LocalAnswer
from edge.annotations.static_files import read_annotation
from shared.contract import (
    API_PREFIX,
    DEFAULT_MESSAGES,
    HEADER_RETRY_AFTER,
    MSG_BODY_TOO_LARGE,
    MSG_BODY_TOO_SLOW,
    MSG_HEADERS_TOO_LARGE,
    MSG_UNKNOWN_ENDPOINT,
    Code,
    envelope,
)

if TYPE_CHECKING:
    from edge.gateway import Gateway

log = logging.getLogger("edge.routes")

FAULT_BODY_LIMIT_BYTES = 64 * 1024
_READ_ONLY = frozenset({"GET", "HEAD"})
SPECIAL_POINTS_PATH = "/api/v1/face/special-points"  # endpoint 99
FEATURES_PATH = "/api/v1/face/features"  # endpoint 4
_RETRY_AFTER = HEADER_RETRY_AFTER.lower().encode()
# Annotation names are random and the files never change; they are someone's face.
_PNG_HEADERS = [(b"cache-control", b"private, max-age=86400"), (b"x-content-type-options", b"nosniff")]


def routes(gateway: Gateway) -> list[Route]:
    pool = gateway.pool
    admin = TokenAdmin(gateway, gateway.secrets)
    return [
        _api_route(gateway, API_PREFIX, _api),  # forwarded to a GPU host
        _api_route(gateway, SPECIAL_POINTS_PATH, _answered_here(lambda g: g.special_points.answer)),
        _api_route(gateway, FEATURES_PATH, _answered_here(lambda g: g.features.answer)),
        _status_page("/health", lambda: (200, monitor.health())),
        _status_page("/gateway-health", lambda: (200, monitor.gateway_health(pool.statistics()))),
        _status_page("/monitor", lambda: monitor.monitor(pool.statistics())),
        Route(
            "/monitor/fault",
            frozenset({"POST"}),
            lambda request: _monitor_fault(gateway, request),
            _STATUS_REFUSALS,
            max_body_bytes=FAULT_BODY_LIMIT_BYTES,
            token=True,
        ),
        Route("/static/", _READ_ONLY, lambda request: _static(gateway, request), _STATUS_REFUSALS),
        Route(
            "/admin/stats",
            frozenset({"GET"}),
            lambda request: _admin_stats(gateway),
            _STATUS_REFUSALS,
            token=True,
        ),
        Route("/admin/workers", _READ_ONLY, admin.workers, _STATUS_REFUSALS, token=True),
        Route(
            "/admin/token",
            frozenset({"POST"}),
            admin.set_token,
            _STATUS_REFUSALS,
            max_body_bytes=ADMIN_BODY_LIMIT_BYTES,
            token=True,
        ),
    ]


async def not_found(request: Request) -> Response:
    """A path no route serves; under `/api/` there is always a route (the envelope says why)."""
    return json_response(404, {"status": "not_found"})


# --- /api/ -----------------------------------------------------------------------------


def _api_route(gateway: Gateway, path: str, handle: Callable[[Gateway, Request], Awaitable[Response]]) -> Route:
    """A business endpoint: rate limit and Idempotency-Key, envelope refusals, the request log."""
    return Route(
        path,
        None,  # a wrong method gets the contract's envelope from the handler, not a 405
        lambda request: gateway.admission.around(request, lambda: handle(gateway, request)),
        _ENVELOPE_REFUSALS,
        max_body_bytes=None,  # edge.max_body_bytes, as the router's limits have it (reloadable)
        logged=True,
        drain_refused_body=True,
        watch_departure=True,
        admit=gateway.admission.before_body,
    )


LocalEndpoint = Callable[[bytes, "str | None", str], Awaitable[LocalAnswer]]


def _answered_here(endpoint: Callable[[Gateway], LocalEndpoint]) -> Callable[[Gateway, Request], Awaitable[Response]]:
    """Endpoints 4 and 99, run by the gateway itself (never a GPU host, never a pool slot)."""

    async def handle(gateway: Gateway, request: Request) -> Response:
        if request.method != "POST":
            message = MSG_UNKNOWN_ENDPOINT.format(method=request.method, path=request.path)
            return _api_response(gateway.api.gateway_failure(request.request_id, Code.INVALID_PARAMETER, message))
        answer = await endpoint(gateway)(request.body, request.header(b"content-type"), request.request_id)
        body = encode(answer.envelope)
        return _api_response(ApiAnswer(body, answer.code, answer.retry_after, gateway_made=True))

    return handle


async def _api(gateway: Gateway, request: Request) -> Response:
    """A GPU endpoint: checked, queued, forwarded, its images rewritten (`edge.api`)."""
    forward = ForwardRequest(
        method=request.method,
        path=request.path,
        query=request.query,
        body=request.body,
        content_type=request.header(b"content-type"),
        request_id=request.request_id,
        forwarded_for=_forwarded_for(request.headers.get(b"x-forwarded-for"), request.client_ip),
    )
    try:
        answer = await gateway.api.handle(forward, request.watch)
    except Exception:  # a bug must still reach the client as an envelope, not a 500 page
        log.exception("请求处理异常 | request_id=%s", request.request_id)
        answer = gateway.api.gateway_failure(request.request_id, Code.SYSTEM_ERROR, DEFAULT_MESSAGES[Code.SYSTEM_ERROR])
    return _api_response(answer)


def _api_response(answer: ApiAnswer) -> Response:
    outcome = Outcome(answer.code, answer.worker, answer.attempts, answer.queue_seconds)
    if answer.client_left:
        return Response(CLIENT_CLOSED, b"", outcome=outcome)
    headers = [] if answer.retry_after is None else [(_RETRY_AFTER, str(answer.retry_after).encode())]
    return Response(200, answer.body, headers=headers, outcome=outcome, storable=answer.storable)


def _refused_envelope(request_id: str, code: Code, message: str) -> Response:
    return Response(200, encode(envelope(code, request_id, None, message)), outcome=Outcome(int(code)))


_ENVELOPE_REFUSALS = Refusals(
    headers_too_large=lambda rid, limit: _refused_envelope(
        rid, Code.INVALID_PARAMETER, MSG_HEADERS_TOO_LARGE.format(limit_bytes=limit)
    ),
    body_too_large=lambda rid, limit: _refused_envelope(rid, Code.TOO_LARGE, MSG_BODY_TOO_LARGE.format(limit_bytes=limit)),
    body_too_slow=lambda rid, seconds: _refused_envelope(
        rid, Code.INVALID_PARAMETER, MSG_BODY_TOO_SLOW.format(seconds=seconds)
    ),
    bad_token=lambda rid: _refused_envelope(rid, Code.INVALID_PARAMETER, monitor.MSG_BAD_TOKEN),
)


def _forwarded_for(existing: bytes | None, client_ip: str) -> str:
    return f"{existing.decode('latin-1')}, {client_ip}" if existing else client_ip


# --- status pages and the drill switch -------------------------------------------------


def _status_page(path: str, page: Any) -> Route:
    """A page read from memory only; GET or HEAD, no auth, never a worker call."""

    async def handler(request: Request) -> Response:
        status, document = page()
        return json_response(status, document)

    return Route(path, _READ_ONLY, handler, _STATUS_REFUSALS)


_STATUS_REFUSALS = Refusals(
    headers_too_large=lambda rid, limit: json_response(431, monitor.error_answer(f"request header block over {limit} bytes")),
    body_too_large=lambda rid, limit: json_response(413, monitor.error_answer(f"request body over {limit} bytes")),
    body_too_slow=lambda rid, seconds: json_response(408, monitor.error_answer(f"request body not received within {seconds:g}s")),
    bad_token=lambda rid: json_response(401, monitor.error_answer(monitor.MSG_BAD_TOKEN)),
)


async def _monitor_fault(gateway: Gateway, request: Request) -> Response:
    try:
        enabled = monitor.parse_fault_request(request.body)
    except monitor.FaultRequestError:
        return json_response(400, monitor.error_answer(monitor.MSG_BAD_FAULT_BODY))
    if gateway.pool.set_drill(enabled):
        logging.getLogger("edge.monitor").warning(
            "模拟故障%s | 来源=%s", "已开启" if enabled else "已关闭", request.client_ip
        )
    return json_response(200, monitor.fault_answer(enabled))


async def _admin_stats(gateway: Gateway) -> Response:
    return json_response(200, gateway.stats.snapshot())


# --- annotation files ------------------------------------------------------------------


async def _static(gateway: Gateway, request: Request) -> Response:
    subpath = request.path.removeprefix("/static/")
    data = await read_annotation(gateway.settings.edge.static_dir, subpath, gateway.file_threads)
    if data is None:
        return Response(404, b"not found", content_type=b"text/plain")
    return Response(200, data, content_type=b"image/png", headers=list(_PNG_HEADERS))
