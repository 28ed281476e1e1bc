"""The `/api/` blueprint: the business endpoints, each a Quart route taking POST only.

The GPU endpoints (`GPU_ENDPOINT_PATHS`) are checked, queued and forwarded by
`ApiService` (`edge.forwarding.service`); endpoints 4 and 99 are answered by the gateway itself
(`edge.local`). Around every one: the rate limit before the body (`before_the_body` in
`edge.web.refusals`), the body limit and timeouts (`GatewayRequest`), the Idempotency-Key
(`Admission.around`), the request-log line (`edge.web.request_logging`). A wrong method or an
unknown path gets its envelope from the app's error handlers (`edge.web.refusals`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import partial
from typing import TYPE_CHECKING

from quart import Blueprint
from quart import Response as QuartResponse

from edge.exchange import ApiResponse, Exchange, encode
from edge.local.local_answer import LocalAnswer
from edge.pool.upstream import ForwardRequest
from edge.web.http import JSON, GatewayRequest, current_gateway_request, exchange_of
from shared.contract import GPU_ENDPOINT_PATHS, Code

if TYPE_CHECKING:
    from edge.gateway import Gateway

SPECIAL_POINTS_PATH = "/api/v1/face/special-points"  # endpoint 99
FEATURES_PATH = "/api/v1/face/features"  # endpoint 4
API_PATHS = (*GPU_ENDPOINT_PATHS, SPECIAL_POINTS_PATH, FEATURES_PATH)  # every business route: the metric labels

Handle = Callable[["Gateway", Exchange], Awaitable[ApiResponse]]
LocalEndpoint = Callable[[bytes, "str | None", str], Awaitable[LocalAnswer]]


def api_blueprint(gateway: Gateway) -> Blueprint:
    api = Blueprint("api", __name__)
    for path, endpoint in GPU_ENDPOINT_PATHS.items():
        api.add_url_rule(path, endpoint, partial(_business, gateway, _forwarded), methods=["POST"])
    answered_here = {
        SPECIAL_POINTS_PATH: ("special_points", lambda: gateway.special_points.answer),
        FEATURES_PATH: ("features", lambda: gateway.features.answer),
    }
    for path, (endpoint, local) in answered_here.items():
        api.add_url_rule(path, endpoint, partial(_business, gateway, partial(_answered_here, local)), methods=["POST"])
    return api


async def _business(gateway: Gateway, handle: Handle) -> QuartResponse:
    request = current_gateway_request()
    exchange = request.notes.exchange or exchange_of(request)  # built by the rate limit, if it ran
    exchange.body = await request.read_body()
    response = await gateway.admission.around(exchange, lambda: handle(gateway, exchange))
    return as_quart_response(request, response)


def as_quart_response(request: GatewayRequest, response: ApiResponse) -> QuartResponse:
    """An `/api/` answer as Quart's response (the last step of every one); notes its
    log facts for the request log."""
    request.notes.log_facts = response.log_facts
    answer = QuartResponse(response.body, status=response.status, content_type=JSON)
    for name, value in response.headers:  # a replay's include the X-Request-ID it was stored with
        answer.headers[name.decode("latin-1")] = value.decode("latin-1")
    return answer


async def _forwarded(gateway: Gateway, exchange: Exchange) -> ApiResponse:
    """A GPU endpoint: checked, queued, forwarded, its images rewritten (`edge.forwarding.service`).
    The forward's one call site is `ApiService`; a client that leaves cancels it here."""
    forward = ForwardRequest(
        method=exchange.method,
        path=exchange.path,
        query=exchange.query,
        body=exchange.body,
        content_type=exchange.header(b"content-type"),
        request_id=exchange.request_id,
        forwarded_for=_forwarded_for(exchange.headers.get(b"x-forwarded-for"), exchange.client_ip),
        execution_id=exchange.execution_id,
    )
    return await gateway.api.handle(forward)


async def _answered_here(endpoint: Callable[[], LocalEndpoint], gateway: Gateway, exchange: Exchange) -> ApiResponse:
    """Endpoints 4 and 99, run by the gateway itself (never a GPU host, never a pool slot),
    with the gateway's own model version."""
    gateway.audit.executing(exchange.execution_id)
    answer = await endpoint()(exchange.body, exchange.header(b"content-type"), exchange.request_id)
    return ApiResponse.of_envelope(
        encode(answer.envelope),
        answer.code,
        retry_after_seconds=answer.retry_after,
        storable=answer.code != Code.SYSTEM_ERROR,  # its 1007 says to retry: never replayed
        model_version=gateway.model_version,
    )


def _forwarded_for(existing: bytes | None, client_ip: str) -> str:
    return f"{existing.decode('latin-1')}, {client_ip}" if existing else client_ip
