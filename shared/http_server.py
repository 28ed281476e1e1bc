"""Hypercorn as both services run it: HTTP/1.1 only on every listener, and a failure in one
connection's handling ends that connection, never the process.

- HTTP/2 is not served (issue 23: an `Upgrade: h2c` with a bad `HTTP2-Settings`, or an
  HTTP/2 CONNECT without `:path`, raised in Hypercorn's HTTP/2 path and took the process
  down). TLS offers only `http/1.1` by ALPN (`http1_only`); a client that offers only `h2`
  gets no ALPN answer and is spoken to in HTTP/1.1. `HTTP1Protocol` answers the HTTP/2
  prior-knowledge preface (and any HTTP version but 1.x) with 505 and closes, and ignores
  an `Upgrade: h2c` (RFC 9110 §7.8 lets a server ignore Upgrade): the request is answered
  in HTTP/1.1, as to a client that never asked.
- A request with both Content-Length and Transfer-Encoding is refused with 400 and its
  connection closed before the app sees it (RFC 9112 §6.1): two parties can read its body
  two ways, which is how a request is smuggled behind another.
- An answer that ends before its request's body was read (a body over the limit, a refusal
  before the body) is followed by the rest of that body, read and dropped, then the
  connection serves on: a client that writes its whole body before reading (one told
  `100 Continue`, a chunked body whose size shows only as it arrives) reads its answer
  instead of a broken pipe. Bounded: `DRAIN_LIMIT_BYTES` read since the request's head,
  `DRAIN_LIMIT_SECONDS` after its answer began; past either the connection is closed. An
  answer that says `Connection: close` is closed on as before. Once an answer has ended
  nothing reads what Hypercorn queues for the app (quart-trio stops receiving when it has
  answered), so the rest is dropped, not queued (`_AppInbox`): a body of many small chunks
  filled the app's queue of 10 and stopped the connection's reading for good.
- A WebSocket upgrade is refused the same way (neither service has a WebSocket endpoint):
  under `/api/` HTTP 200 and the contract's 1001 envelope, like any refusal there,
  elsewhere 400. Hypercorn's WebSocket path is never entered: in it every app-level error
  handler ran outside a request context (a bare 500, 75 ERROR lines), and a handshake
  followed by more bytes made it answer twice (an ERROR traceback).
- `ContainedTCPServer`: an exception that escapes Hypercorn's handling of one connection
  closes that connection and is logged, once per kind a minute; the listener and the
  other connections go on. Its socket writes are bounded: Hypercorn shields each one
  (an app's cancellation must not cut an answer in half) with no deadline, so a client
  that stopped reading held its handler, and a graceful stop, forever (a deadline on a
  shield around it bounds nothing). A write still unfinished after `SEND_LIMIT_SECONDS`
  (or a lower bound an answer set for its own writes, `send_limit_seconds`) closes the
  connection. What the socket took is counted (`ConnectionWrites`, the app
  reads it through `connection_writes()`): a client that left mid-answer is told apart.

Hypercorn has no setting or hook for these protocol decisions nor for the task a
connection runs in: `HTTP1Protocol` replaces `H11Protocol._check_protocol`, and the two
classes are installed (at import) where Hypercorn looks them up for each connection
(`hypercorn.protocol.H11Protocol`, `hypercorn.trio.run.TCPServer`). Hypercorn is pinned
exactly in pyproject.toml; tests/shared/test_http_server.py fails when a name moves.
"""

from __future__ import annotations

import json
import logging
import math
import traceback
from collections import defaultdict
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, ClassVar, cast

import h11
import hypercorn.protocol
import hypercorn.trio.run
import trio
from hypercorn.config import Config
from hypercorn.events import Closed, Event, RawData
from hypercorn.protocol.events import EndBody
from hypercorn.protocol.events import Event as StreamEvent
from hypercorn.protocol.events import Response as StreamResponse
from hypercorn.protocol.h11 import H11Protocol
from hypercorn.protocol.http_stream import HTTPStream
from hypercorn.trio.tcp_server import TCPServer

from shared.contract import (
    API_PREFIX,
    HEADER_REQUEST_ID,
    MSG_WEBSOCKET_NOT_SERVED,
    Code,
    envelope,
    request_id_from_header,
)
from shared.logs import FailureLog

log = logging.getLogger("hypercorn.error")

ALPN_PROTOCOLS = ["http/1.1"]
SEND_LIMIT_SECONDS = 300.0  # one write: a whole 15 MB answer to a 0.5 Mbit/s reader takes 240 s
SEND_PIECE_BYTES = 64 * 1024  # what the socket took is counted in pieces this size
# A refused body is drained to this (the gateway's own drain, edge.web.refusals, has the
# same bounds): past its whole 21 MB limit at the default settings, 3x the GPU host's.
DRAIN_LIMIT_BYTES = 64 * 1024 * 1024
DRAIN_LIMIT_SECONDS = 10.0
HTTP1_VERSIONS = frozenset({b"1.0", b"1.1"})
MSG_HTTP2_REFUSED = "HTTP/2 is not served here: send HTTP/1.1"
MSG_AMBIGUOUS_BODY = "a request may carry Content-Length or Transfer-Encoding, not both (RFC 9112 section 6.1)"
MSG_WEBSOCKET_REFUSED = "WebSocket is not served here: send plain HTTP/1.1 requests"
_REQUEST_ID = HEADER_REQUEST_ID.lower().encode()


def http1_only(config: Config) -> Config:
    """`config` with TLS offering HTTP/1.1 alone by ALPN (the protocol refuses HTTP/2 on plain TCP)."""
    config.alpn_protocols = list(ALPN_PROTOCOLS)
    return config


class _Refusal(Exception):
    """A request answered by the protocol itself, its connection closed after the answer."""

    def __init__(
        self,
        status: int,
        reason: bytes,
        body: bytes,
        content_type: bytes = b"text/plain; charset=utf-8",
        headers: tuple[tuple[bytes, bytes], ...] = (),
    ) -> None:
        super().__init__(status, body)
        self.status = status
        self.reason = reason
        self.body = body
        self.content_type = content_type
        self.headers = headers


class _AppInbox:
    """What Hypercorn hands a request's app (its `app_put`), until the app has answered: after
    that, nothing is queued, and a hand-over waiting on the app's full queue is let go."""

    def __init__(self, put: Callable[[Any], Awaitable[None]]) -> None:
        self._put = put
        self._waiting: set[trio.CancelScope] = set()
        self._closed = False

    async def put(self, message: Any) -> None:
        if self._closed:
            return
        scope = trio.CancelScope()
        self._waiting.add(scope)
        try:
            with scope:
                await self._put(message)
        finally:
            self._waiting.discard(scope)

    def close(self) -> None:
        self._closed = True
        for scope in self._waiting:
            scope.cancel()


class HTTP1Protocol(H11Protocol):
    """Hypercorn's HTTP/1.1 protocol that never switches protocols (HTTP/2, WebSocket),
    refuses an ambiguous body and drains a body its answer left unread."""

    _request_bytes = 0  # read since this request's head (a pipelined next one's bytes too)
    _answered_at = 0.0  # when this request's answer began (trio clock)
    _drain: trio.CancelScope | None = None  # the drain's deadline task, while one runs
    _inbox: _AppInbox | None = None  # the current request's app's queue

    async def handle(self, event: Event) -> None:
        try:
            if isinstance(event, RawData):
                self._request_bytes += len(event.data)
            if self._drain is None:
                await super().handle(event)
                if self._drain is not None and self.stream is None:
                    # a drain began while Hypercorn's own reading handed the body over; that
                    # reading stops at the app's end and leaves the rest buffered (the body's
                    # end and a next request among it): drained from there
                    await self._drain_buffered()
            elif isinstance(event, RawData):
                await self._drain_body(event.data)
            else:  # closed: by the client, the drain's deadline, the server's stop
                self._end_drain()
                await super().handle(event)
        except _Refusal as refusal:
            await self._refuse(refusal)

    async def _create_stream(self, request: h11.Request) -> None:
        self._request_bytes = 0
        await super()._create_stream(request)
        if isinstance(self.stream, HTTPStream) and self.stream.app_put is not None:
            self._inbox = _AppInbox(self.stream.app_put)
            self.stream.app_put = self._inbox.put

    async def stream_send(self, event: StreamEvent) -> None:
        if isinstance(event, StreamResponse) and event.status_code >= 200:
            self._answered_at = trio.current_time()
        await super().stream_send(event)
        if isinstance(event, EndBody) and self._inbox is not None:
            self._inbox.close()
        if isinstance(event, EndBody) and self._drain is None and self._body_left_unread():
            # From here the app gets no more of its body (it has answered): drained, dropped
            deadline = self._answered_at + DRAIN_LIMIT_SECONDS
            if self._request_bytes > DRAIN_LIMIT_BYTES or trio.current_time() >= deadline:
                # closed now, not when the app is done: by then the app reads no more of the
                # body, and Hypercorn, still handing it over, would wait on it forever
                await self.send(Closed())
                return
            self._drain = trio.CancelScope(deadline=deadline)
            self.task_group.spawn(self._close_when_drain_overdue, self._drain)

    def _body_left_unread(self) -> bool:
        connection = self.connection
        return (
            isinstance(connection, h11.Connection)
            and connection.our_state is h11.DONE
            and connection.their_state is h11.SEND_BODY
            and not self.context.terminated.is_set()
        )

    async def _maybe_recycle(self) -> None:
        if self._drain is not None and self._body_left_unread():
            await self._close_stream()
            if self._body_left_unread():
                return  # the app is done, its body not yet: the connection waits for it
        # The drain may have begun while Hypercorn's own reading was handing the body over: that
        # reading took the body's end (and may wait, paused, on a next request): cycle now
        self._end_drain()
        await super()._maybe_recycle()

    async def _drain_body(self, data: bytes) -> None:
        connection = cast(h11.Connection, self.connection)
        if self._request_bytes > DRAIN_LIMIT_BYTES:
            await self.send(Closed())
            return
        connection.receive_data(data)
        await self._drain_buffered()

    async def _drain_buffered(self) -> None:
        connection = cast(h11.Connection, self.connection)
        while connection.their_state is h11.SEND_BODY:  # already DONE if Hypercorn read the end
            try:
                event = connection.next_event()
            except h11.RemoteProtocolError:  # a broken body: nothing to answer, its answer went
                await self.send(Closed())
                return
            if event is h11.NEED_DATA or isinstance(event, h11.ConnectionClosed):
                return  # more to come, or the client's close (`Closed` follows)
        await self._finish_drain()

    async def _finish_drain(self) -> None:
        self._end_drain()
        if self.stream is None:  # the app finished first: the next request may follow at once
            await super()._maybe_recycle()
        # a next request already here is served now, or (h11 pauses) once this answer is done
        await self._handle_events()

    def _end_drain(self) -> None:
        if self._drain is not None:
            self._drain.cancel()
            self._drain = None

    async def _close_when_drain_overdue(self, drain: trio.CancelScope) -> None:
        with drain:
            await trio.sleep_forever()
        if self._drain is drain:  # the deadline fired, not the body's end
            await self.send(Closed())

    async def _check_protocol(self, event: h11.Request) -> None:
        # Replaces Hypercorn's, which answers `Upgrade: h2c` with 101 and the preface with
        # HTTP/2; an `Upgrade: h2c` is left unread here: the request is served as HTTP/1.1.
        if event.http_version not in HTTP1_VERSIONS:  # `PRI * HTTP/2.0`, the HTTP/2 preface, among them
            raise _Refusal(505, b"HTTP Version Not Supported", MSG_HTTP2_REFUSED.encode() + b"\n")
        headers = dict(event.headers)  # h11 lower-cases the names
        if b"content-length" in headers and b"transfer-encoding" in headers:
            raise _Refusal(400, b"Bad Request", MSG_AMBIGUOUS_BODY.encode() + b"\n")
        if b"websocket" in headers.get(b"upgrade", b"").lower():
            raise _websocket_refusal(event.target, headers.get(_REQUEST_ID))

    async def _refuse(self, refusal: _Refusal) -> None:
        headers = [
            (b"content-type", refusal.content_type),
            (b"content-length", str(len(refusal.body)).encode()),
            *refusal.headers,
            (b"connection", b"close"),
            *self.config.response_headers("h11"),
        ]
        connection = cast(h11.Connection, self.connection)  # never a WebSocket's: those are refused here
        answer = h11.Response(status_code=refusal.status, reason=refusal.reason, headers=headers)
        data = connection.send(answer) + (connection.send(h11.Data(data=refusal.body)) or b"")
        await self.send(RawData(data=data + (connection.send(h11.EndOfMessage()) or b"")))
        await self.send(Closed())


def _websocket_refusal(target: bytes, given_request_id: bytes | None) -> _Refusal:
    if not target.startswith(API_PREFIX.encode()):
        document: dict = {"status": "error", "message": MSG_WEBSOCKET_REFUSED}
        return _Refusal(400, b"Bad Request", _json(document), b"application/json")
    request_id = request_id_from_header(None if given_request_id is None else given_request_id.decode("latin-1"))
    document = envelope(Code.INVALID_PARAMETER, request_id, message=MSG_WEBSOCKET_NOT_SERVED)
    return _Refusal(200, b"OK", _json(document), b"application/json", ((_REQUEST_ID, request_id.encode()),))


def _json(document: dict) -> bytes:
    return json.dumps(document, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"


@dataclass
class ConnectionWrites:
    """What one connection's socket took: bytes, and whether a write failed (the client
    left, or stopped reading: `stalled`): nothing more reaches it then. A write is bounded
    by `SEND_LIMIT_SECONDS`, or by `send_limit_seconds` where an answer sent in small pieces
    lowered it while it is sent (a static download: no piece taken for that long is a
    stalled client)."""

    sent_bytes: int = 0
    failed: bool = False
    stalled: bool = False
    send_limit_seconds: float = math.inf


_WRITES: ContextVar[ConnectionWrites] = ContextVar("connection_writes")


def connection_writes() -> ConnectionWrites | None:
    """The writes of the connection the calling task serves (None outside a served connection)."""
    return _WRITES.get(None)


class ContainedTCPServer(TCPServer):
    """Hypercorn's handling of one TCP connection; an exception ends only this connection,
    a write ends within `SEND_LIMIT_SECONDS`."""

    failures: ClassVar[defaultdict[str, FailureLog]] = defaultdict(
        lambda: FailureLog(log, "连接处理异常，已关闭该连接（服务继续）")
    )
    writes: ConnectionWrites

    async def run(self) -> None:
        self.writes = ConnectionWrites()
        _WRITES.set(self.writes)  # the app's tasks start from this one: they see it
        try:
            await super().run()  # which closes the stream on every way out
        except* Exception as group:  # a cancellation (the graceful deadline) goes on up
            error = _first_leaf(group)
            kind = failure_kind(error)
            self.failures[kind].report(f"{kind} | {ascii(str(error))[:200]}")  # the client may write the message

    async def protocol_send(self, event: Event) -> None:
        if not isinstance(event, RawData):
            await super().protocol_send(event)
            return
        async with self.send_lock:
            # shielded like Hypercorn's, bounded by its own deadline
            deadline = trio.current_time() + min(SEND_LIMIT_SECONDS, self.writes.send_limit_seconds)
            with trio.CancelScope(shield=True, deadline=deadline) as bounded:
                try:
                    await self._send_counted(event.data)
                    return
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    pass
            self.writes.failed = True
            if bounded.cancelled_caught:  # the client stopped reading: its reader is ended too
                self.writes.stalled = True
                await trio.aclose_forcefully(self.stream)  # no TLS goodbye to a client that reads none
        await self.protocol.handle(Closed())

    async def _send_counted(self, data: bytes) -> None:
        with memoryview(data) as view:
            for start in range(0, len(view), SEND_PIECE_BYTES):
                piece = view[start : start + SEND_PIECE_BYTES]
                await self.stream.send_all(piece)
                self.writes.sent_bytes += len(piece)


def failure_kind(error: BaseException) -> str:
    """The exception's type and the line that raised it: what is logged once a minute."""
    frames = traceback.extract_tb(error.__traceback__)
    where = f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
    return f"{type(error).__module__}.{type(error).__qualname__}{where}"


def _first_leaf(error: BaseException) -> BaseException:
    while isinstance(error, BaseExceptionGroup):
        error = error.exceptions[0]
    return error


# Where Hypercorn looks the classes up: `ProtocolWrapper` for each HTTP/1.1 connection,
# `worker_serve` for each accepted one. The gateway installs its own subclass of
# `HTTP1Protocol` after this (`edge.web.server`).
hypercorn.protocol.H11Protocol = HTTP1Protocol  # type: ignore[misc]
hypercorn.trio.run.TCPServer = ContainedTCPServer  # type: ignore[misc]
