"""The gateway's HTTP layer on Quart: what it adds to quart-trio's request, in the slot
Quart provides for it (`app.request_class`, which `edge.app` fills). `GatewayRequest` is
Quart's request with a body limit that a view can lower (`request.max_content_length = n`
bounds the body itself, not only form parsing) and an idle bound between two body chunks
beside Quart's `BODY_TIMEOUT` for the whole body (Hypercorn's `read_timeout` cannot be
that bound: it also cuts off a client that is quietly waiting for a 20 s answer). The
request log is ASGI middleware around the app (`edge.web.request_logging`).

The `/api/` handlers work on an `Exchange` (request id, headers, body) and answer an
`ApiResponse`; those types live below every sub-package, in `edge.exchange` (admission
and idempotency see only them); `exchange_of` builds the one from Quart's request here.
"""

from __future__ import annotations

import hmac
import logging
import math
from collections.abc import Mapping
from typing import Any, cast

import trio
from quart import Response as QuartResponse
from quart import current_app, request
from quart_trio.wrappers.request import TrioBody, TrioRequest
from werkzeug.exceptions import RequestEntityTooLarge, RequestTimeout

from edge.exchange import Exchange, encode
from edge.web.request_logging import RequestNotes, request_notes

log = logging.getLogger("edge.http")

BODY_IDLE_TIMEOUT = "HAIRGATE_BODY_IDLE_TIMEOUT"  # app.config key: longest gap between two body chunks
JSON = "application/json"
Scope = Mapping[str, Any]  # an ASGI HTTP scope


# --- the body and the request ------------------------------------------------------------


class BodyTimeout(RequestTimeout):
    """The body did not arrive in time: `seconds` is the bound that fired (the whole body's,
    or the longest gap between two chunks)."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds


class GatewayBody(TrioBody):
    """Quart's body buffer, which also knows when the client sent its last byte and when
    its last chunk came (for the idle bound), and whose limit a view can lower."""

    def __init__(self, expected_content_length: int | None, max_content_length: int | None) -> None:
        super().__init__(expected_content_length, max_content_length)
        self._expected = expected_content_length
        self.received_bytes = 0  # counted past the limit too: what a drain has to read
        self.ended = trio.Event()  # the client's last byte arrived
        self.last_arrival = trio.current_time()
        self._arrival: trio.Event | None = None  # set at the next chunk, while a drain waits for one
        self._waiting: trio.CancelScope | None = None  # a `read` waiting for the whole body
        self._bounds = (math.inf, math.inf)  # that read's deadline for the whole body, and idle bound

    def limit(self, max_content_length: int | None) -> None:
        self._max_content_length = max_content_length
        if max_content_length is None or self._must_raise is not None:
            return
        if (self._expected or 0) > max_content_length or len(self._data) > max_content_length:
            self._refuse()

    def append(self, data: bytes) -> None:
        # Quart's own, except that an over-limit body is not marked as received in full
        self.received_bytes += len(data)
        self._arrived()
        if data == b"" or self._must_raise is not None:
            return
        self._data.extend(data)
        self._has_data.set()
        if self._max_content_length is not None and len(self._data) > self._max_content_length:
            self._refuse()

    def set_complete(self) -> None:  # Quart calls it on the request's last message
        super().set_complete()
        self.ended.set()
        self._arrived()

    async def read(self, whole_seconds: float | None, idle_seconds: float | None) -> bytes:
        """The whole body; BodyTimeout past either bound, RequestEntityTooLarge over the limit.
        The reader is woken once, when the body is whole or refused: a chunk that arrives
        meanwhile only moves its wait's deadline (`_arrived`), it does not wake it."""
        deadline = trio.current_time() + (whole_seconds if whole_seconds is not None else math.inf)
        idle = idle_seconds if idle_seconds is not None else math.inf
        self._bounds = (deadline, idle)
        while self._must_raise is None and not self._complete.is_set():
            if trio.current_time() >= self._next_bound():
                whole = trio.current_time() >= deadline
                raise BodyTimeout(cast(float, whole_seconds) if whole else idle)
            with trio.CancelScope(deadline=self._next_bound()) as self._waiting:
                try:
                    await self._complete.wait()
                finally:
                    self._waiting = None
        if self._must_raise is not None:
            raise self._must_raise
        return bytes(self._data)

    async def drain(self, max_bytes: int, max_seconds: float) -> None:
        """Let the rest of a refused body arrive (bounded), so that a client that writes
        its whole body before reading is not reset before it reads its answer."""
        with trio.move_on_after(max_seconds):
            while not self.ended.is_set() and self.received_bytes <= max_bytes:
                arrival = self._arrival = self._arrival or trio.Event()
                await arrival.wait()

    def _refuse(self) -> None:
        self._must_raise = RequestEntityTooLarge()
        self._complete.set()
        self._has_data.set()
        self._arrived()

    def _next_bound(self) -> float:
        """When a waiting `read` gives up: the whole body's deadline, or the idle bound after the last chunk."""
        deadline, idle = self._bounds
        return min(deadline, self.last_arrival + idle)

    def _arrived(self) -> None:
        self.last_arrival = trio.current_time()
        if self._waiting is not None:
            self._waiting.deadline = self._next_bound()
        if self._arrival is not None:
            arrival, self._arrival = self._arrival, None
            arrival.set()


class GatewayRequest(TrioRequest):
    """Quart's request plus the gateway's per-request facts (`notes`, shared with the
    request log: its ids, and what the log records about an `/api/` answer)."""

    body_class = GatewayBody
    body: GatewayBody

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.notes: RequestNotes = request_notes(self.scope)
        self.request_id = self.notes.request_id
        self.execution_id = self.notes.execution_id  # an `/api/` request's, given on arrival

    @property
    def max_content_length(self) -> int | None:
        return super().max_content_length

    @max_content_length.setter
    def max_content_length(self, value: int | None) -> None:
        self._max_content_length = value
        self.body.limit(value)

    async def read_body(self) -> bytes:
        """The whole body, within its limit and both timeouts."""
        return await self.body.read(self.body_timeout, current_app.config[BODY_IDLE_TIMEOUT])

    async def get_data(self, cache: bool = True, as_text: bool = False, parse_form_data: bool = False) -> Any:
        if parse_form_data or not cache:
            raise NotImplementedError("the gateway reads bodies whole, as bytes")
        data = await self.read_body()
        return data.decode() if as_text else data


def current_gateway_request() -> GatewayRequest:
    """Quart's `request`, as the gateway's app makes it."""
    return cast(GatewayRequest, request)


# --- the /api/ handlers' view of the request (the types: `edge.exchange`) -------------


def exchange_of(request: GatewayRequest) -> Exchange:
    scope = request.scope
    client = scope.get("client")
    exchange = Exchange(
        method=request.method,
        path=request.path,
        query=scope["query_string"].decode("latin-1"),
        headers=_headers(scope),
        client_ip=client[0] if client else "",
        request_id=request.request_id,
        execution_id=request.execution_id,
    )
    request.notes.exchange = exchange
    return exchange


# --- the app ---------------------------------------------------------------------------


# --- small shared pieces -----------------------------------------------------------------


def json_page(status: int, document: Any, *, close: bool = False) -> QuartResponse:
    """A status page, admin or error answer: JSON plus a newline, as curl users like it."""
    response = QuartResponse(encode(document) + b"\n", status=status, content_type=JSON)
    if close:
        close_after(response)
    return response


def close_after(response: QuartResponse) -> QuartResponse:
    """The request's body is left unread: the connection cannot carry another request."""
    response.headers["Connection"] = "close"
    return response


def header_block_bytes(scope: Scope) -> int:
    """The request line's target and every header, as they count against a worker's read limit."""
    return (
        len(scope.get("raw_path") or b"")
        + len(scope["query_string"])
        + sum(len(name) + len(value) + 4 for name, value in scope["headers"])
    )


def token_ok(given: str | None, expected: str) -> bool:
    return given is not None and hmac.compare_digest(given.encode("latin-1"), expected.encode())


def _headers(scope: Scope) -> dict[bytes, bytes]:
    # ASGI servers lower-case header names; a repeated header keeps its last value,
    # except X-Forwarded-For whose hops are joined as proxies do.
    headers: dict[bytes, bytes] = {}
    for name, value in scope["headers"]:
        if name == b"x-forwarded-for" and name in headers:
            value = headers[name] + b", " + value
        headers[name] = value
    return headers
