"""What the gateway refuses before or instead of a view, registered on the app as Quart's
`before_request` functions and error handlers.

Order for every request: the header block (over `edge.max_header_bytes`), the rate limit
(`/api/` POSTs), routing (404, 405), the token (`requires_token`, on the routes that
need it), the body (413 over the route's limit, 408 too slow), the view; a view that
raises is a logged 500. Each refusal has two faces: under `/api/` the contract's envelope
(HTTP 200 with a code, and the request-log line says which), elsewhere a small JSON error
with the HTTP status. A refusal that leaves the body unread closes the connection after
its answer, except an over-limit `/api/` body, whose rest is read and dropped (bounded)
so that a client that writes its whole body before reading still gets its 1003 (also
one told `100 Continue`: a chunked body's size is known only as it arrives). A WebSocket
upgrade never reaches Quart, nor does a request h11 cannot parse (two Content-Lengths, no
Host, a bad chunk size...): the server refuses them with the same two faces, the envelope
saying what was malformed under `/api/` (`shared.http_server`).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import wraps
from typing import TYPE_CHECKING, Any

from quart import Quart
from quart import Response as QuartResponse
from quart import request as current_request
from werkzeug.exceptions import HTTPException, MethodNotAllowed, NotFound, RequestEntityTooLarge, RequestTimeout

from edge.exchange import ApiResponse, LogFacts, encode
from edge.web import monitor
from edge.web.api_routes import as_quart_response
from edge.web.http import (
    BODY_IDLE_TIMEOUT,
    JSON,
    BodyTimeout,
    GatewayRequest,
    close_after,
    current_gateway_request,
    exchange_of,
    header_block_bytes,
    json_page,
    token_ok,
)
from edge.web.server import withholds_continue
from shared.contract import (
    API_PREFIX,
    DEFAULT_MESSAGES,
    HEADER_EXECUTION_ID,
    HEADER_TOKEN,
    MSG_BODY_TOO_LARGE,
    MSG_BODY_TOO_SLOW,
    MSG_HEADERS_TOO_LARGE,
    MSG_METHOD_NOT_ALLOWED,
    MSG_UNKNOWN_ENDPOINT,
    Code,
    envelope,
)

if TYPE_CHECKING:
    from edge.gateway import Gateway

log = logging.getLogger("edge.refusals")

DRAIN_LIMIT_BYTES = 64 * 1024 * 1024
DRAIN_LIMIT_SECONDS = 10.0

View = Callable[..., Awaitable[Any]]


def register_refusals(app: Quart, gateway: Gateway) -> None:
    @app.before_request
    async def before_the_body() -> QuartResponse | None:
        request = current_gateway_request()
        limit = gateway.entrance.max_header_bytes
        api = _is_api(request)
        if header_block_bytes(request.scope) > limit:
            if api:
                return _refused(
                    request, Code.INVALID_PARAMETER, MSG_HEADERS_TOO_LARGE.format(limit_bytes=limit), close=True
                )
            return json_page(431, monitor.error_answer(f"request header block over {limit} bytes"), close=True)
        if api and request.method == "POST" and gateway.admission.limiter is not None:
            refused = await gateway.admission.before_body(exchange_of(request))
            if refused is not None:
                return close_after(as_quart_response(request, refused))
        return None

    @app.errorhandler(RequestEntityTooLarge)
    async def body_too_large(error: RequestEntityTooLarge) -> QuartResponse:
        request = current_gateway_request()
        limit = request.max_content_length
        if not _is_api(request):
            return json_page(413, monitor.error_answer(f"request body over {limit} bytes"), close=True)
        message = MSG_BODY_TOO_LARGE.format(limit_bytes=limit)
        expecting = request.headers.get("Expect", "").lower() == "100-continue"
        # the server decided on the gateway-wide limit (`configure_limits`), not the view's own
        if expecting and withholds_continue(request.scope["headers"], app.config["MAX_CONTENT_LENGTH"]):
            return _refused(request, Code.TOO_LARGE, message, close=True)  # refused before its body was sent
        request.notes.log_facts = LogFacts(int(Code.TOO_LARGE))
        return _answer_then_drain(request, encode(envelope(Code.TOO_LARGE, request.request_id, None, message)))

    @app.errorhandler(RequestTimeout)
    async def body_too_slow(error: RequestTimeout) -> QuartResponse:
        request = current_gateway_request()
        seconds = error.seconds if isinstance(error, BodyTimeout) else app.config[BODY_IDLE_TIMEOUT]
        if _is_api(request):
            return _refused(request, Code.INVALID_PARAMETER, MSG_BODY_TOO_SLOW.format(seconds=seconds), close=True)
        return json_page(408, monitor.error_answer(f"request body not received within {seconds:g}s"), close=True)

    @app.errorhandler(NotFound)
    async def not_found(error: NotFound) -> QuartResponse:
        request = current_gateway_request()
        if _is_api(request):
            message = MSG_UNKNOWN_ENDPOINT.format(method=request.method, path=request.path)
            return _refused(request, Code.INVALID_PARAMETER, message)
        return json_page(404, {"status": "not_found"})

    @app.errorhandler(MethodNotAllowed)
    async def method_not_allowed(error: MethodNotAllowed) -> QuartResponse:
        request = current_gateway_request()
        allow = ", ".join(sorted(error.valid_methods or ()))
        if _is_api(request):
            message = MSG_METHOD_NOT_ALLOWED.format(path=request.path, method=request.method, allowed=allow)
            answer = _refused(request, Code.INVALID_PARAMETER, message)
        else:
            answer = QuartResponse(b"", status=405, content_type="text/plain")
        answer.headers["Allow"] = allow
        return answer

    @app.errorhandler(HTTPException)
    async def other_http_error(error: HTTPException) -> QuartResponse:
        request = current_gateway_request()
        if _is_api(request):
            return _refused(request, Code.INVALID_PARAMETER, DEFAULT_MESSAGES[Code.INVALID_PARAMETER], close=True)
        return json_page(error.code or 400, monitor.error_answer(error.name), close=True)

    @app.errorhandler(Exception)
    async def unexpected_error(error: Exception) -> QuartResponse:
        # A bug in a view: logged with its request id, answered like any internal error.
        failed = current_gateway_request()
        log.error("请求处理异常 | request_id=%s | %s %s", failed.request_id, failed.method, failed.path, exc_info=error)
        return await internal_error(error)

    @app.errorhandler(500)
    async def internal_error(error: Exception) -> QuartResponse:
        # A bug still reaches an `/api/` client as the 1007 envelope with Retry-After,
        # never as a 500 page.
        request = current_gateway_request()
        if not _is_api(request):
            return json_page(500, monitor.error_answer("internal error"))
        answer = gateway.api.gateway_failure(request.request_id, Code.SYSTEM_ERROR, DEFAULT_MESSAGES[Code.SYSTEM_ERROR])
        return as_quart_response(request, answer)

    @app.after_request
    async def name_the_request(response: QuartResponse) -> QuartResponse:
        request = current_gateway_request()
        response.headers.setdefault("X-Request-ID", request.request_id)
        if request.execution_id:  # every `/api/` answer: a refusal's, a replay's own
            response.headers[HEADER_EXECUTION_ID] = request.execution_id
        return response


def requires_token(gateway: Gateway) -> Callable[[View], View]:
    """The view runs only with `X-Internal-Token` = the current shared password; checked
    before its body is read, and a refusal closes the connection (the body stays unread)."""

    def decorate(view: View) -> View:
        @wraps(view)
        async def checked(*args: Any, **kwargs: Any) -> Any:
            if not token_ok(current_request.headers.get(HEADER_TOKEN), gateway.entrance.token):
                return json_page(401, monitor.error_answer(monitor.MSG_BAD_TOKEN), close=True)
            return await view(*args, **kwargs)

        return checked

    return decorate


def _refused(request: GatewayRequest, code: Code, message: str, *, close: bool = False) -> QuartResponse:
    body = encode(envelope(code, request.request_id, None, message))
    answer = as_quart_response(request, ApiResponse.of_envelope(body, int(code)))
    return close_after(answer) if close else answer


def _answer_then_drain(request: GatewayRequest, data: bytes) -> QuartResponse:
    """`data` (HTTP 200), then the rest of the refused body read and dropped before the answer ends."""
    body = request.body

    async def then_drain() -> AsyncIterator[bytes]:
        yield data
        await body.drain(DRAIN_LIMIT_BYTES, DRAIN_LIMIT_SECONDS)

    answer = QuartResponse(then_drain(), status=200, content_type=JSON)
    answer.headers["Content-Length"] = str(len(data))
    return answer


def _is_api(request: GatewayRequest) -> bool:
    return request.path.startswith(API_PREFIX)
