"""Hypercorn as both services run it: HTTP/1.1 only on every listener, and a failure in one
connection's handling ends that connection, never the process.

- HTTP/2 is not served (issue 23: an `Upgrade: h2c` with a bad `HTTP2-Settings`, or an
  HTTP/2 CONNECT without `:path`, raised in Hypercorn's HTTP/2 path and took the process
  down). TLS offers only `http/1.1` by ALPN (`http1_only`); a client that offers only `h2`
  gets no ALPN answer and is spoken to in HTTP/1.1. `HTTP1Protocol` answers the HTTP/2
  prior-knowledge preface (and any HTTP version but 1.x) with 505 and closes, and ignores
  an `Upgrade: h2c` (RFC 9110 §7.8 lets a server ignore Upgrade): the request is answered
  in HTTP/1.1, as to a client that never asked.
- A request with both Content-Length and Transfer-Encoding is refused and its connection
  closed before the app sees it (RFC 9112 §6.1): two parties can read its body two ways,
  which is how a request is smuggled behind another.
- A request h11 refuses (two Content-Lengths, `Transfer-Encoding: gzip`, no Host, a bad
  chunk size, an HTTP/1.0 body with no length, a head past its buffer) is told what was
  malformed, not given Hypercorn's bare 400/501/431 (issue 39). These refusals and the
  WebSocket one have the two faces of the apps' own: under `/api/` HTTP 200 and the
  contract's 1001 envelope (`MSG_HTTP_*`), elsewhere the status and a small JSON error.
- An answer that ends before its request's body was read (a body over the limit, a refusal
  before the body) is followed by the rest of that body, read and dropped, then the
  connection serves on: a client that writes its whole body before reading (one told
  `100 Continue`, a chunked body whose size shows only as it arrives) reads its answer
  instead of a broken pipe. Bounded: `DRAIN_LIMIT_BYTES` read since the request's head,
  `DRAIN_LIMIT_SECONDS` after its answer began; past either the connection is closed. An
  answer that says `Connection: close` is closed on as before. Once an answer has ended
  nothing reads what Hypercorn queues for the app (quart-trio stops receiving when it has
  answered), so the rest is dropped, not queued (`_AppInbox`): a body of many small chunks
  filled the app's queue of 10 and stopped the connection's reading for good. Only the
  `http.disconnect` that follows the answer is still offered, where it fits at once: an app
  that receives after answering is told the request ended (as ASGI says), and quart-trio's
  receiving task ends on it instead of being cancelled.
- A connection is answered one request at a time (Hypercorn reads the next once the last
  is answered), but a client that pipelines always has its next one ready: 300 such
  connections kept 300 requests runnable and another client's `/health` waited ~6 s behind
  them (issue 39). A request read before its previous answer ended waits for one of
  `PIPELINED_AT_ONCE` turns (all connections together; the app not started, nothing more
  read from that socket); a client's first request, or one sent after reading its answer,
  never waits.
- A WebSocket upgrade is refused (neither service has a WebSocket endpoint), with the two
  faces above. Hypercorn's WebSocket path is never entered: in it every app-level error
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
  A close takes the write lock (`_close`): Hypercorn closed from whichever task saw the
  end, and a write begun during its EOF raised BusyResourceError (issue 39).
- Per answer, less work than Hypercorn's (issue 41: the runtime was ~10 % of the gateway's
  cost per request): an answer is one write (`HTTP1Protocol._send_h11_event`: its head
  waits for its body), and a connection's keep-alive timer is one task that moves its
  deadline, not a task started at each answer and cancelled at the next request
  (`KeepAliveTimer`). Nor does an answer or a request's body wait a scheduler round for
  nobody: a free write lock is taken without a checkpoint (`ContainedTCPServer._lock_writes`),
  and a message the app's queue has room for goes in without a cancel scope or a checkpoint
  (`_AppInbox`); a held lock or a full queue is waited on as before.

Hypercorn has no setting or hook for these protocol decisions nor for the task a
connection runs in: `HTTP1Protocol` replaces `H11Protocol._check_protocol`,
`_send_error_response` and `_send_h11_event` (and reads h11's unparsed bytes in place),
`ContainedTCPServer` replaces `TCPServer.idle_task`, and `install()` puts the
two classes where Hypercorn looks them up for each connection
(`hypercorn.protocol.H11Protocol`, `hypercorn.trio.run.TCPServer`). Importing this module
changes nothing: each service's `serve()` calls `install()` before Hypercorn runs, so a
service is HTTP/1.1-only because it says so, not because of what it happens to import.
Hypercorn, h11 and trio are pinned exactly in pyproject.toml; every private name of theirs
used here is listed in tests/test_framework_pins.py, which fails when one moves.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import traceback
from collections import defaultdict
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass
from http import HTTPStatus
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
from hypercorn.typing import H11SendableEvent, TaskGroup
from trio.lowlevel import RunVar

from shared.contract import (
    API_PREFIX,
    HEADER_REQUEST_ID,
    MSG_HEADERS_TOO_LARGE,
    MSG_HTTP_BAD_CHUNK,
    MSG_HTTP_BAD_LENGTH,
    MSG_HTTP_CONFLICTING_LENGTHS,
    MSG_HTTP_LENGTH_AND_CHUNKED,
    MSG_HTTP_MALFORMED,
    MSG_HTTP_NO_HOST,
    MSG_HTTP_REQUEST_LINE,
    MSG_HTTP_TRANSFER_ENCODING,
    MSG_HTTP_TWO_HOSTS,
    MSG_HTTP_UNDECLARED_BODY,
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
# Requests a client sent before reading the answer to its previous one (pipelined), answered
# at once, all connections together; the rest wait their turn, unread. A client's first
# request, or one sent after its previous answer, never waits: 300 connections pipelining
# 2,000 GETs each kept 300 requests runnable and a /health for anyone else took ~6 s.
PIPELINED_AT_ONCE = 16
MSG_HTTP2_REFUSED = "HTTP/2 is not served here: send HTTP/1.1"
MSG_AMBIGUOUS_BODY = "a request may carry Content-Length or Transfer-Encoding, not both (RFC 9112 section 6.1)"
MSG_WEBSOCKET_REFUSED = "WebSocket is not served here: send plain HTTP/1.1 requests"
_REQUEST_ID = HEADER_REQUEST_ID.lower().encode()
REQUEST_LINE_PEEK_BYTES = 8192  # of a head h11 has not parsed yet: where its request line is looked for
# What h11 (pinned exactly) says it refused, and what the client is told instead (the first
# match; h11's own words otherwise): a bare 400/501/431 said nothing a person could act on.
H11_ERROR_MESSAGES: tuple[tuple[str, str], ...] = (
    ("conflicting Content-Length", MSG_HTTP_CONFLICTING_LENGTHS),
    ("bad Content-Length", MSG_HTTP_BAD_LENGTH),
    ("Transfer-Encoding", MSG_HTTP_TRANSFER_ENCODING),  # only chunked, and only once
    ("Missing mandatory Host", MSG_HTTP_NO_HOST),
    ("multiple Host", MSG_HTTP_TWO_HOSTS),
    ("chunk", MSG_HTTP_BAD_CHUNK),  # an illegal chunk header, a malformed chunk footer
    ("Got data when expecting EOF", MSG_HTTP_UNDECLARED_BODY),  # a body after one that declared none
    ("request line", MSG_HTTP_REQUEST_LINE),
)


def http1_only(config: Config) -> Config:
    """`config` with TLS offering HTTP/1.1 alone by ALPN (the protocol refuses HTTP/2 on plain TCP)."""
    config.alpn_protocols = list(ALPN_PROTOCOLS)
    return config


class _Refusal(Exception):
    """A request answered by the protocol itself, its connection closed after the answer."""

    def __init__(
        self,
        status: int,
        body: bytes,
        content_type: bytes = b"text/plain; charset=utf-8",
        headers: tuple[tuple[bytes, bytes], ...] = (),
    ) -> None:
        super().__init__(status, body)
        self.status = status
        self.body = body
        self.content_type = content_type
        self.headers = headers


class _ServerConnection(h11.Connection):
    """h11's server side, keeping what the answer to a request it refuses says: the request
    line of the head being parsed (h11 drops a head it refuses), the head once parsed (a
    body can be refused after it), and h11's error."""

    request_line = b""
    request: h11.Request | None = None
    error: h11.RemoteProtocolError | None = None

    def next_event(self) -> h11.Event | type[h11.NEED_DATA] | type[h11.PAUSED]:
        if self.their_state is h11.IDLE:  # a new request's head, or more of it
            self.request_line, self.request = _unparsed_request_line(self), None
        try:
            event = super().next_event()
        except h11.RemoteProtocolError as error:
            self.error = error
            raise
        if isinstance(event, h11.Request):
            self.request = event
        return event

    @property
    def unparsed_bytes(self) -> int:
        """How much h11 holds that it has not parsed yet (`trailing_data` would copy it)."""
        return len(self._receive_buffer)


def _unparsed_request_line(connection: h11.Connection) -> bytes:
    # h11 has no peek at what it holds unparsed (`trailing_data` copies all of it, for each
    # request of a pipeline): its buffer is read in place, up to the first line's end (h11 is
    # pinned exactly; tests/test_framework_pins.py checks these names)
    data: bytearray = connection._receive_buffer._data
    end = data.find(b"\n", 0, REQUEST_LINE_PEEK_BYTES)
    return bytes(data[: end if end >= 0 else REQUEST_LINE_PEEK_BYTES])


class _AppInbox:
    """What Hypercorn hands a request's app (its `app_put`), until the app has answered: after
    that, nothing is queued, and a hand-over waiting on the app's full queue is let go.

    The body's chunks of one socket read go to the app as one message, its end included when
    it came in that read: a small request's body and end are one message, not two (each is a
    wake-up of the app's receiving task, and a scheduler round before the handler sees the
    body whole). What a read left held back is handed over when the protocol has handled that
    read (`flush`), before it reads again."""

    def __init__(self, put: Callable[[Any], Awaitable[None]]) -> None:
        self._put = put
        # Hypercorn's `app_put` is the `send` of the app's memory channel: a message that fits
        # goes in with `send_nowait`, with no cancel scope and no checkpoint (the connection's
        # next read is one); only a full queue is waited on, cancellably (`close`)
        channel = getattr(put, "__self__", None)
        self._put_nowait = channel.send_nowait if isinstance(channel, trio.MemorySendChannel) else None
        self._waiting: set[trio.CancelScope] = set()
        self._closed = False
        self._held: list[bytes] = []  # body chunks of the read being handled, not yet handed over

    async def put(self, message: Any) -> None:
        if self._closed:
            if message["type"] == "http.disconnect":
                self._tell_the_end(message)
            return
        if message["type"] == "http.request":
            self._held.append(message.get("body", b""))
            if message.get("more_body", False):
                return  # its end may follow in the same read
            message = {**message, "body": self._take_held()}
        else:  # a disconnect: after the body that came before it
            await self.flush()
        await self._hand_over(message)

    async def flush(self) -> None:
        """Hand over the body chunks held back (the protocol has handled the read that brought them)."""
        if self._held and not self._closed:
            await self._hand_over({"type": "http.request", "body": self._take_held(), "more_body": True})

    def _take_held(self) -> bytes:
        body = b"".join(self._held)  # one chunk, the usual case: that chunk itself, not a copy
        self._held.clear()
        return body

    async def _hand_over(self, message: Any) -> None:
        if self._put_nowait is not None:
            try:
                self._put_nowait(message)
                return
            except trio.WouldBlock:
                pass  # the app's queue is full: wait for room below
        scope = trio.CancelScope()
        self._waiting.add(scope)
        try:
            with scope:
                await self._put(message)
        finally:
            self._waiting.discard(scope)

    def _tell_the_end(self, message: Any) -> None:
        # Hypercorn's disconnect after the answer, where it fits at once (never waited on):
        # quart-trio's receiving task returns on it instead of being cancelled at the answer's
        # end (an exception through its frames and the nursery's group, for every request)
        if self._put_nowait is not None:
            with contextlib.suppress(trio.WouldBlock, trio.BrokenResourceError, trio.ClosedResourceError):
                self._put_nowait(message)

    def close(self) -> None:
        self._closed = True
        self._held.clear()
        for scope in self._waiting:
            scope.cancel()


class HTTP1Protocol(H11Protocol):
    """Hypercorn's HTTP/1.1 protocol that never switches protocols (HTTP/2, WebSocket),
    refuses an ambiguous body and drains a body its answer left unread."""

    _request_bytes = 0  # read since this request's head (a pipelined next one's bytes too)
    _answered_at = 0.0  # when this request's answer began (trio clock)
    _drain: trio.CancelScope | None = None  # the drain's deadline task, while one runs
    _inbox: _AppInbox | None = None  # the current request's app's queue
    _reads = 0  # socket reads handed to this connection's protocol
    _reads_when_answered = -1  # `_reads` when its last answer ended
    _turn: trio.CapacityLimiter | None = None  # the pipelined request's turn it holds
    _held_head = b""  # an answer's head, not yet written: it goes out with the bytes after it

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # h11's connection as Hypercorn made it, keeping what a refusal of a malformed request says
        self.connection = _ServerConnection(h11.SERVER, max_incomplete_event_size=self.config.h11_max_incomplete_size)

    async def handle(self, event: Event) -> None:
        try:
            if isinstance(event, RawData):
                self._request_bytes += len(event.data)
                self._reads += 1
            else:  # closed: a turn held for a request whose answer will not end is given back
                self._end_turn()
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
            if self._inbox is not None:  # this read is handled: the body it brought goes to the app
                await self._inbox.flush()
        except _Refusal as refusal:
            await self._refuse(refusal)

    async def _create_stream(self, request: h11.Request) -> None:
        self._request_bytes = 0
        if self._reads == self._reads_when_answered:  # read before the last answer ended: pipelined
            await self._take_turn()
        await super()._create_stream(request)
        if isinstance(self.stream, HTTPStream) and self.stream.app_put is not None:
            self._inbox = _AppInbox(self.stream.app_put)
            self.stream.app_put = self._inbox.put

    async def stream_send(self, event: StreamEvent) -> None:
        if isinstance(event, StreamResponse) and event.status_code >= 200:
            self._answered_at = trio.current_time()
        await super().stream_send(event)
        if isinstance(event, EndBody):
            self._reads_when_answered = self._reads
            self._end_turn()
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

    async def _send_h11_event(self, event: H11SendableEvent) -> None:
        # Replaces Hypercorn's, which writes each h11 event by itself: an answer's head is held
        # and written with the bytes that follow it (its body, or its end), and an event of no
        # bytes (the end of a Content-Length body) writes nothing. An answer is then one write
        # (one loopback delivery, one wake-up of its client), where it was three.
        try:
            data = self.connection.send(event)
        except h11.LocalProtocolError:
            if self.connection.their_state != h11.ERROR:
                raise
            return
        if isinstance(event, h11.Response):
            self._held_head = data
            return
        data, self._held_head = self._held_head + (data or b""), b""
        if data:
            await self.send(RawData(data=data))

    async def _take_turn(self) -> None:
        # the app is not started, nothing more is read: this connection waits, not runnable
        turns = _pipeline_turns()
        await turns.acquire_on_behalf_of(self)
        self._turn = turns

    def _end_turn(self) -> None:
        if self._turn is not None:
            self._turn.release_on_behalf_of(self)
            self._turn = None

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
            raise _Refusal(505, MSG_HTTP2_REFUSED.encode() + b"\n")
        headers = dict(event.headers)  # h11 lower-cases the names
        if b"content-length" in headers and b"transfer-encoding" in headers:
            raise _refusal(400, event, MSG_HTTP_LENGTH_AND_CHUNKED, MSG_AMBIGUOUS_BODY)
        framed = b"content-length" in headers or b"transfer-encoding" in headers
        if event.http_version == b"1.0" and not framed and cast(_ServerConnection, self.connection).unparsed_bytes:
            # h11 reads no body here and ends the connection after it: the bytes after the head
            # are a body with no length. h11 refuses them too, but only once the app has the
            # request: an app quick to answer raced that refusal and its answer was cut off
            raise _refusal(400, event, MSG_HTTP_UNDECLARED_BODY, "Got data when expecting EOF")
        if b"websocket" in headers.get(b"upgrade", b"").lower():
            raise _refusal(400, event, MSG_WEBSOCKET_NOT_SERVED, MSG_WEBSOCKET_REFUSED)

    async def _send_error_response(self, status_code: int) -> None:
        # Replaces Hypercorn's answer to a request h11 refused (it closes after): a bare
        # 400/501/431 with no body. This one says what was malformed, faced as any refusal.
        connection = cast(_ServerConnection, self.connection)  # never a WebSocket's: those are refused
        await self._write_refusal(_protocol_error(status_code, connection, self.head_limit_bytes()))

    def head_limit_bytes(self) -> int:
        """The request head size a client is told it went past when h11 stops buffering one."""
        return self.config.h11_max_incomplete_size

    async def _refuse(self, refusal: _Refusal) -> None:
        await self._write_refusal(refusal)
        await self.send(Closed())

    async def _write_refusal(self, refusal: _Refusal) -> None:
        headers = [
            (b"content-type", refusal.content_type),
            (b"content-length", str(len(refusal.body)).encode()),
            *refusal.headers,
            (b"connection", b"close"),
            *self.config.response_headers("h11"),
        ]
        connection = cast(h11.Connection, self.connection)  # never a WebSocket's: those are refused here
        reason = HTTPStatus(refusal.status).phrase.encode()
        answer = h11.Response(status_code=refusal.status, reason=reason, headers=headers)
        data = connection.send(answer) + (connection.send(h11.Data(data=refusal.body)) or b"")
        await self.send(RawData(data=data + (connection.send(h11.EndOfMessage()) or b"")))


def _protocol_error(status: int, connection: _ServerConnection, head_limit_bytes: int) -> _Refusal:
    """The answer to a request h11 refused with `status`: under `/api/` what was malformed in
    the contract's words, elsewhere in h11's own."""
    words = str(connection.error) if connection.error is not None else HTTPStatus(status).phrase
    if status == HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE:
        message = MSG_HEADERS_TOO_LARGE.format(limit_bytes=head_limit_bytes)
    else:
        known = (ours for theirs, ours in H11_ERROR_MESSAGES if theirs in words)
        message = next(known, MSG_HTTP_MALFORMED.format(detail=words[:200]))
    request = connection.request
    if request is None:  # its head was refused: its target is read from the request line h11 dropped
        return _refusal(status, connection.request_line.partition(b" ")[2].partition(b" ")[0], message, words)
    return _refusal(status, request, message, words)


def _refusal(status: int, request: h11.Request | bytes, api_message: str, other_message: str) -> _Refusal:
    """A refusal by the server itself, faced as the app faces its own: under `/api/` HTTP 200
    and the contract's 1001 envelope saying `api_message` (with the client's request id where
    its head was read), elsewhere `status` and a small JSON error saying `other_message`."""
    target, headers = (request, {}) if isinstance(request, bytes) else (request.target, dict(request.headers))
    # a 2xx answer to a CONNECT that h11 has read opens a tunnel (h11 switches protocols, and
    # the body after it was refused: a contained failure): CONNECT gets its status
    tunnel = isinstance(request, h11.Request) and request.method == b"CONNECT"
    if tunnel or not target.startswith(API_PREFIX.encode()):
        return _Refusal(status, _json({"status": "error", "message": other_message}), b"application/json")
    given = headers.get(_REQUEST_ID)
    request_id = request_id_from_header(None if given is None else given.decode("latin-1"))
    document = envelope(Code.INVALID_PARAMETER, request_id, message=api_message)
    return _Refusal(200, _json(document), b"application/json", ((_REQUEST_ID, request_id.encode()),))


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
_PIPELINE_TURNS: RunVar[trio.CapacityLimiter] = RunVar("pipeline_turns")


def _pipeline_turns() -> trio.CapacityLimiter:
    """The turns of pipelined requests in this trio run (the process's server, or a test's)."""
    try:
        return _PIPELINE_TURNS.get()
    except LookupError:
        turns = trio.CapacityLimiter(PIPELINED_AT_ONCE)
        _PIPELINE_TURNS.set(turns)
        return turns


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
    _closing = False  # the stream is being (or was) closed: nothing more is written to it
    _writing: trio.CancelScope | None = None  # the write in flight, cut by a close

    async def run(self) -> None:
        self.writes = ConnectionWrites()
        _WRITES.set(self.writes)  # the app's tasks start from this one: they see it
        self.idle_task = KeepAliveTimer(self)  # type: ignore[assignment]  # Hypercorn's SingleTask, cheaper
        try:
            await super().run()  # which closes the stream on every way out
        except* Exception as group:  # a cancellation (the graceful deadline) goes on up
            error = _first_leaf(group)
            kind = failure_kind(error)
            self.failures[kind].report(f"{kind} | {ascii(str(error))[:200]}")  # the client may write the message

    async def protocol_send(self, event: Event) -> None:
        if not isinstance(event, RawData):
            await super().protocol_send(event)  # a `Closed` comes to `_close`
            return
        await self._lock_writes()
        try:
            # once the stream is closing, a write is one to a closed stream: it failed, as
            # Hypercorn's did after its close (the app's further messages go nowhere)
            written = not self._closing and await self._write_bounded(event.data)
        finally:
            self.send_lock.release()
        if not written:
            self.writes.failed = True
            await self.protocol.handle(Closed())

    async def _lock_writes(self) -> None:
        # A free lock is taken without a checkpoint: `acquire()` yields even then, and the
        # answer's bytes would wait a whole scheduler round for no other writer. Held (a
        # write or a close under way), it is waited for in turn, as before.
        try:
            self.send_lock.acquire_nowait()
        except trio.WouldBlock:
            await self.send_lock.acquire()

    async def _write_bounded(self, data: bytes) -> bool:
        """`data` written, shielded like Hypercorn's write and bounded by its own deadline;
        False where it failed (the client left, stopped reading, or a close cut it)."""
        deadline = trio.current_time() + min(SEND_LIMIT_SECONDS, self.writes.send_limit_seconds)
        with trio.CancelScope(shield=True, deadline=deadline) as bounded:
            self._writing = bounded
            try:
                await self._send_counted(data)
                return True
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass
            finally:
                self._writing = None
        if bounded.cancelled_caught and not self._closing:  # the client stopped reading: its reader is ended too
            self.writes.stalled = True
            await trio.aclose_forcefully(self.stream)  # no TLS goodbye to a client that reads none
        return False

    async def _close(self) -> None:
        # Hypercorn closes the stream from whichever task saw the end: the reader (a client
        # gone mid-body), the app's task (its answer said close), a drain's deadline, the
        # connection's own end. trio lets no task write while another sends EOF: a write that
        # began during `send_eof`'s checkpoint raised BusyResourceError in the app's task
        # (an ERROR "Error in ASGI Framework", issue 39). One owner at a time: the close takes
        # the write lock, after cutting the write in flight (Hypercorn's close cut it too),
        # and a write queued behind it finds the stream closing. Shielded: a close that began
        # is finished, and it waits on nothing longer than a cut write's end.
        self._closing = True
        if self._writing is not None:
            self._writing.cancel()
        with trio.CancelScope(shield=True):
            async with self.send_lock:
                await super()._close()

    async def _send_counted(self, data: bytes) -> None:
        with memoryview(data) as view:
            for start in range(0, len(view), SEND_PIECE_BYTES):
                piece = view[start : start + SEND_PIECE_BYTES]
                await self.stream.send_all(piece)
                self.writes.sent_bytes += len(piece)


class KeepAliveTimer:
    """Hypercorn's keep-alive timer of one connection (its `TCPServer.idle_task`), one task per
    connection instead of one per answer.

    Hypercorn restarts it when the connection goes idle (after each answer) and stops it when a
    request comes; idle for `keep_alive_timeout`, or idle while the server stops, the
    connection is closed (`TCPServer._idle_timeout`). Its own starts a task at each answer and
    cancels it at the next request: ~5 % of the gateway's CPU at its ceiling. This one moves
    the deadline of the task it has; a stop only marks the connection busy, and the task, woken
    busy (its deadline, or the server stopping), ends without closing — the next restart starts
    another."""

    def __init__(self, server: TCPServer) -> None:
        self._server = server
        self._deadline: trio.CancelScope | None = None  # the running task's; None: no task runs
        self._idle = False

    async def restart(self, task_group: TaskGroup, action: Callable[[], Awaitable[None]]) -> None:
        """Idle from now (`action`, Hypercorn's `_idle_timeout`, is what the task does instead)."""
        self._idle = True
        deadline = trio.current_time() + self._server.config.keep_alive_timeout
        if self._deadline is None or self._deadline.cancel_called:  # none, or one that has fired (busy)
            self._deadline = trio.CancelScope(deadline=deadline)
            task_group.spawn(self._close_when_idle, self._deadline)
        else:
            self._deadline.deadline = deadline

    async def stop(self) -> None:
        self._idle = False

    async def _close_when_idle(self, deadline: trio.CancelScope) -> None:
        with deadline:
            await self._server.context.terminated.wait()
        if self._deadline is not deadline:  # it fired busy, and a restart since started another
            return
        self._deadline = None
        if self._idle:
            with trio.CancelScope(shield=True):
                await self._server._initiate_server_close()


def failure_kind(error: BaseException) -> str:
    """The exception's type and the line that raised it: what is logged once a minute."""
    frames = traceback.extract_tb(error.__traceback__)
    where = f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
    return f"{type(error).__module__}.{type(error).__qualname__}{where}"


def _first_leaf(error: BaseException) -> BaseException:
    while isinstance(error, BaseExceptionGroup):
        error = error.exceptions[0]
    return error


def install(protocol: type[HTTP1Protocol] = HTTP1Protocol) -> None:
    """Hypercorn serves with this module's classes from now on, in this process: `protocol`
    for each HTTP/1.1 connection, `ContainedTCPServer` for each accepted one. Each service's
    `serve()` calls it before Hypercorn runs; calling it again changes nothing.

    Hypercorn has no setting for either class: `ProtocolWrapper` and `worker_serve` look them
    up in their modules' globals for each connection, so this is process-wide. The gateway
    installs its subclass (`edge.web.server.GatewayH11Protocol`), which behaves as its base
    on any other listener; one process that serves both (the tests) keeps it whatever the
    order of the calls."""
    hypercorn.protocol.H11Protocol = _protocol_to_install(hypercorn.protocol.H11Protocol, protocol)  # type: ignore[misc]
    hypercorn.trio.run.TCPServer = ContainedTCPServer  # type: ignore[misc]


def _protocol_to_install(installed: type[H11Protocol], wanted: type[HTTP1Protocol]) -> type[H11Protocol]:
    """The more derived of the two; two unrelated ones are a conflict nothing could serve both."""
    if issubclass(installed, wanted):
        return installed
    if issubclass(installed, HTTP1Protocol) and not issubclass(wanted, installed):
        raise RuntimeError(f"{installed.__qualname__} is installed already: {wanted.__qualname__} cannot be too")
    return wanted
