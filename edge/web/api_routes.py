"""The `/api/` blueprint: the business endpoints, each a Quart route taking POST only.

Built from the endpoint registry (`shared.contract.endpoints`): the GPU hosts' endpoints are
checked, queued and forwarded by `ApiService` (`edge.forwarding.service`); those the gateway
answers itself (endpoints 4 and 99, `edge.local`) by their handler in `LOCAL_ANSWERS`.
Around every one: the rate limit before the body (`before_the_body` in `edge.web.refusals`),
the body limit and timeouts (`GatewayRequest`), the Idempotency-Key (`Admission.around`), the
request-log line (`edge.web.request_logging`). A wrong method or an unknown path gets its
envelope from the app's error handlers (`edge.web.refusals`).
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
from shared.contract import Code
from shared.contract.endpoints import AnsweredBy, Endpoint, answered_by

if TYPE_CHECKING:
    from edge.gateway import Gateway

Handle = Callable[["Gateway", Exchange], Awaitable[ApiResponse]]
LocalEndpoint = Callable[[bytes, "str | None", str], Awaitable[LocalAnswer]]

# endpoint -> the gateway's own answer to it, for each endpoint the registry says the gateway answers
LOCAL_ANSWERS: dict[str, Callable[[Gateway], LocalEndpoint]] = {
    "special-points": lambda gateway: gateway.special_points.answer,
    "features": lambda gateway: gateway.features.answer,
}


def api_blueprint(gateway: Gateway) -> Blueprint:
    """A POST route per endpoint of the registry: the GPU hosts' first, then the gateway's."""
    api = Blueprint("api", __name__)
    for endpoint in answered_by(AnsweredBy.GPU_HOST):
        _route(api, endpoint, partial(_business, gateway, _forwarded))
    for endpoint in answered_by(AnsweredBy.GATEWAY):
        local = partial(LOCAL_ANSWERS[endpoint.name], gateway)
        _route(api, endpoint, partial(_business, gateway, partial(_answered_here, local)))
    return api


def _route(api: Blueprint, endpoint: Endpoint, view: Callable[[], Awaitable[QuartResponse]]) -> None:
    api.add_url_rule(endpoint.path, endpoint.operation_id, view, methods=["POST"])


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
    """An endpoint the gateway answers itself (4 and 99): never a GPU host, never a pool
    slot; with the gateway's own model version."""
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
