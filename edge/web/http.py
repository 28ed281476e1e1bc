"""The gateway's HTTP layer: one ASGI router over the route table of `edge.routes`.

Every route declares its policy — methods, whether it needs the internal token, how large
a body it takes, whether it goes in the request log — and the router applies it the same
way for all, in this order: header block size, method, token (before any body byte is
read), body (bounded in size and in time), handler, answer, log line. Handlers get a
`Request` with the body already read and return a `Response`; they never see ASGI.

No web framework sits in between: the `/api/` path is the gateway's hot path and its
latency budget is a millisecond (docs/drill_and_bench.md has the measurements).
"""

from __future__ import annotations

import hmac
import json
import logging
import time
from functools import partial
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import trio

from edge.pool.dispatch import ClientWatch
from edge.observe.request_log import RequestRecord
from shared.contract import HEADER_REQUEST_ID, HEADER_TOKEN, request_id_from_header

log = logging.getLogger("edge.http")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
Handler = Callable[["Request"], Awaitable["Response"]]

CLIENT_CLOSED = 499  # request-log status of a client that left before its answer (nginx's)
_DRAIN_LIMIT_BYTES = 64 * 1024 * 1024
_DRAIN_LIMIT_SECONDS = 10.0
_TOKEN = HEADER_TOKEN.lower().encode()
_REQUEST_ID = HEADER_REQUEST_ID.lower().encode()
_JSON = b"application/json"


@dataclass(frozen=True)
class Limits:
    """What the router bounds for every request (`edge` settings)."""

    max_header_bytes: int
    max_api_body_bytes: int  # the body limit of the business endpoints (`Route.max_body_bytes` None)
    body_idle_timeout_seconds: float
    body_timeout_seconds: float


@dataclass
class Request:
    """A request as handlers see it: body read, headers lower-cased, client departure watched."""

    method: str
    path: str
    query: str
    headers: dict[bytes, bytes]
    client_ip: str
    request_id: str
    body: bytes
    watch: ClientWatch
    admission: object | None = None  # what the route's `admit` hook noted for its handler

    def header(self, name: bytes) -> str | None:
        value = self.headers.get(name)
        return None if value is None else value.decode("latin-1")


@dataclass(frozen=True)
class Outcome:
    """What the request log records about an answered `/api/` request, besides HTTP facts."""

    code: int | None
    worker: int | None = None
    attempts: int = 0
    queue_seconds: float = 0.0
    idempotent_replay: bool = False
    rate_limited: bool = False


@dataclass
class Response:
    """An answer: status, body, extra headers; `outcome` feeds the request log."""

    status: int
    body: bytes
    content_type: bytes = _JSON
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    outcome: Outcome | None = None
    storable: bool = True  # may be replayed to a retry with the same Idempotency-Key
    body_unread: bool = False  # refused before its body was read to the end: close after it
    drain_body: bool = False  # … unless the rest is to be read and dropped (a body too large)


@dataclass(frozen=True)
class Refusals:
    """The answers a route gives when the router refuses a request before its handler."""

    headers_too_large: Callable[[str, int], Response]  # (request_id, limit_bytes)
    body_too_large: Callable[[str, int], Response]  # (request_id, limit_bytes)
    body_too_slow: Callable[[str, float], Response]  # (request_id, seconds)
    bad_token: Callable[[str], Response]  # (request_id)


@dataclass(frozen=True)
class Route:
    """One entry of the route table: a path (or a prefix ending in "/") and its policy."""

    path: str
    methods: frozenset[str] | None  # None: any method (the handler answers each)
    handler: Handler
    refusals: Refusals
    max_body_bytes: int | None = 0  # None: `Limits.max_api_body_bytes`, which a reload may change
    token: bool = False
    logged: bool = False  # one request-log line per request (the `/api/` routes)
    drain_refused_body: bool = False  # answer an over-limit body, then read and drop the rest
    watch_departure: bool = False  # a client that leaves ends its request's queue waits (`Request.watch`)
    # Runs after the token check and before the body is read (a rate limit): an answer
    # refuses the request without reading its body, None lets it in.
    admit: Handler | None = None

    @property
    def is_prefix(self) -> bool:
        return self.path.endswith("/")


class _ClientGone(Exception):
    """The client disconnected before its body arrived."""


class _BodyTooLarge(Exception):
    pass


class _BodyTooSlow(Exception):
    pass


class Router:
    """The gateway's ASGI callable: matches a `Route`, applies its policy, runs its handler."""

    def __init__(
        self,
        routes: Sequence[Route],
        not_found: Handler,
        record: Callable[[RequestRecord], None],  # the request log
        limits: Limits,
        token: Callable[[], str],
    ) -> None:
        self._exact = {route.path: route for route in routes if not route.is_prefix}
        self._prefixes = [route for route in routes if route.is_prefix]
        self._not_found = not_found
        self._record = record
        self._limits = limits
        self._token = token  # read per request: the shared password can change while serving

    def reconfigure(self, limits: Limits) -> None:
        """Reloaded limits (body, head, timeouts): requests that start from now on see them."""
        self._limits = limits

    def match(self, path: str) -> Route | None:
        route = self._exact.get(path)
        if route is None:
            route = next((r for r in self._prefixes if path.startswith(r.path)), None)
        return route

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _refuse_lifespan(receive, send)
            return
        if scope["type"] != "http":
            return  # websockets: nothing here speaks them; the server closes the connection
        started = time.perf_counter()
        route = self.match(scope["path"])
        headers = _headers(scope)
        request_id = request_id_from_header(_text(headers.get(_REQUEST_ID)))
        request = Request(
            method=scope["method"],
            path=scope["path"],
            query=scope["query_string"].decode("latin-1"),
            headers=headers,
            client_ip=scope["client"][0] if scope.get("client") else "",
            request_id=request_id,
            body=b"",
            watch=ClientWatch(partial(_departure, receive) if route is not None and route.watch_departure else None),
        )
        response: Response | None = None
        try:
            if route is None:
                response = await self._not_found(request)
            else:
                response = await self._respond(route, scope, request, receive)
            await _send(send, response, request_id, receive if response.drain_body else None)
        finally:
            if route is not None and route.logged:
                self._log(request, response, started)

    async def _respond(self, route: Route, scope: Scope, request: Request, receive: Receive) -> Response:
        refusals = route.refusals
        if _header_bytes(scope) > self._limits.max_header_bytes:
            return _unread(refusals.headers_too_large(request.request_id, self._limits.max_header_bytes))
        if route.methods is not None and request.method not in route.methods:
            return _method_not_allowed(route.methods)
        if route.token and not _token_ok(request.headers.get(_TOKEN), self._token()):
            return _unread(refusals.bad_token(request.request_id))
        if route.admit is not None and (refused := await route.admit(request)) is not None:
            return _unread(refused)
        limit = self._limits.max_api_body_bytes if route.max_body_bytes is None else route.max_body_bytes
        try:
            body = await self._read_body(request.headers, receive, limit)
        except _BodyTooLarge:
            refused = _unread(refusals.body_too_large(request.request_id, limit))
            # a client that writes its whole body before reading must still get the answer
            refused.drain_body = route.drain_refused_body
            return refused
        except _BodyTooSlow:
            return _unread(refusals.body_too_slow(request.request_id, self._limits.body_idle_timeout_seconds))
        except _ClientGone:
            request.watch.mark_left()
            return Response(CLIENT_CLOSED, b"")
        request.body = body
        return await route.handler(request)

    async def _read_body(self, headers: dict[bytes, bytes], receive: Receive, limit: int) -> bytes:
        """The whole body within the limits; raises as soon as one is exceeded."""
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise _BodyTooLarge
        chunks: list[bytes] = []
        size = 0
        limits = self._limits
        # A body that trickles holds a connection and a descriptor: bound both the gaps
        # between chunks and the whole read (one cancel scope per chunk: the nearer deadline).
        whole_deadline = trio.current_time() + limits.body_timeout_seconds
        while True:
            with trio.move_on_at(min(whole_deadline, trio.current_time() + limits.body_idle_timeout_seconds)) as wait:
                message = await receive()
            if wait.cancelled_caught:
                raise _BodyTooSlow
            if message["type"] == "http.disconnect":
                raise _ClientGone
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise _BodyTooLarge
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)

    def _log(self, request: Request, response: Response | None, started: float) -> None:
        outcome = response.outcome if response else None
        left = response is None or response.status == CLIENT_CLOSED or request.watch.left
        status = CLIENT_CLOSED if left else response.status  # type: ignore[union-attr]
        self._record(
            RequestRecord(
                ts=datetime.now(timezone.utc).isoformat(timespec="milliseconds"),
                request_id=request.request_id,
                method=request.method,
                path=request.path,
                client_ip=request.client_ip,
                worker=outcome.worker if outcome else None,
                attempts=outcome.attempts if outcome else 0,
                queue_ms=round(outcome.queue_seconds * 1000, 3) if outcome else 0.0,
                duration_ms=round((time.perf_counter() - started) * 1000, 3),
                http_status=status,
                code=outcome.code if outcome else None,
                bytes_in=len(request.body),
                bytes_out=0 if left or response is None else len(response.body),
                idempotent_replay=outcome.idempotent_replay if outcome else False,
                rate_limited=outcome.rate_limited if outcome else False,
            )
        )


def encode(document: Any) -> bytes:
    """JSON as the gateway sends it: UTF-8, no spaces (an envelope's bytes are part of the contract)."""
    return json.dumps(document, ensure_ascii=False, separators=(",", ":")).encode()


def json_response(status: int, document: Any) -> Response:
    """A status page, admin or error answer: JSON plus a newline, as curl users like it."""
    return Response(status, encode(document) + b"\n")


def _unread(response: Response) -> Response:
    response.body_unread = True
    return response


def _method_not_allowed(methods: frozenset[str]) -> Response:
    allow = ", ".join(sorted(methods)).encode()
    return Response(405, b"", content_type=b"text/plain", headers=[(b"allow", allow)])


async def _departure(receive: Receive) -> None:
    """Return when the client disconnects: after the body, the only message left to receive."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def _send(send: Send, response: Response, request_id: str, drain: Receive | None) -> None:
    """Send `response`; with `drain`, read and drop the unread body before ending it."""
    if response.status == CLIENT_CLOSED:
        return  # nobody to answer
    headers = [
        (b"content-type", response.content_type),
        (b"content-length", str(len(response.body)).encode()),
        (_REQUEST_ID, request_id.encode()),
        *response.headers,
    ]
    if response.body_unread and drain is None:
        headers.append((b"connection", b"close"))  # the unread body makes the connection unusable
    await send({"type": "http.response.start", "status": response.status, "headers": headers})
    await send({"type": "http.response.body", "body": response.body, "more_body": drain is not None})
    if drain is not None:
        # The answer is on the wire; reading the rest (bounded) keeps the connection from
        # being reset under a client still writing, so that it can read the answer.
        await _discard_body(drain)
        await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _discard_body(receive: Receive) -> None:
    """Read and drop what a refused client still sends (bounded), so it can read its answer."""
    discarded = 0
    with trio.move_on_after(_DRAIN_LIMIT_SECONDS):
        while discarded <= _DRAIN_LIMIT_BYTES:
            message = await receive()
            discarded += len(message.get("body", b""))
            if message["type"] == "http.disconnect" or not message.get("more_body", False):
                return


async def _refuse_lifespan(receive: Receive, send: Send) -> None:
    # The gateway's lifecycle lives in `edge.main.serve`, not in ASGI lifespan events.
    while (message := await receive())["type"] != "lifespan.shutdown":
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
    await send({"type": "lifespan.shutdown.complete"})


def _headers(scope: Scope) -> dict[bytes, bytes]:
    # ASGI servers lower-case header names; a repeated header keeps its last value,
    # except X-Forwarded-For whose hops are joined as proxies do.
    headers: dict[bytes, bytes] = {}
    for name, value in scope["headers"]:
        if name == b"x-forwarded-for" and name in headers:
            value = headers[name] + b", " + value
        headers[name] = value
    return headers


def _header_bytes(scope: Scope) -> int:
    """The request line's target and every header, as they count against a worker's read limit."""
    return len(scope.get("raw_path") or b"") + len(scope["query_string"]) + sum(
        len(name) + len(value) + 4 for name, value in scope["headers"]
    )


def _token_ok(given: bytes | None, expected: str) -> bool:
    return given is not None and hmac.compare_digest(given, expected.encode())


def _text(value: bytes | None) -> str | None:
    return None if value is None else value.decode("latin-1")
