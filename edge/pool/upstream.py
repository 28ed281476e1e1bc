"""The gateway's HTTP/1.1 client to the workers: connections and bytes, nothing more.

`Upstream` carries every forward and every probe on kept-alive HTTP/1.1 connections
(h11 on trio streams, TLS by `ssl`; see the class for why not httpcore). It returns the
raw answer (`RawAnswer`: status, headers, body) or raises a `TransportError`
(`edge.pool.errors`) when none could be read; what an answer that did arrive means
(refused, busy, not an envelope, another request's) is judged in `edge.pool.failures`,
which also holds the retry policy — the way httpcore's transport is kept apart from
httpx's policy. Its numbers come whole, as `UpstreamLimits` and `Timeouts`.

A connection is kept only when nothing is left unread on it: bytes after the answer (a
second, unsolicited response, a Content-Length shorter than what followed) close it, and
an idle one with bytes waiting is closed when next taken. HTTP/1.1 cannot tell a stale
answer that arrives just after a request was sent from the answer to it, so a forward
also has its envelope's `request_id` checked (`failures.judge`) inside `forward`'s block,
before its connection is kept.
"""

from __future__ import annotations

import functools
import math
import ssl
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import NamedTuple
from urllib.parse import urlsplit

import h11
import trio

from edge.pool.errors import (
    AmbiguousFraming,
    AnswerTooLarge,
    ConnectError,
    ConnectionClosed,
    RequestNotSent,
    UpstreamTimeout,
)
from shared.contract import (
    HEADER_EXECUTION_ID,
    HEADER_FORWARDED_FOR,
    HEADER_HOST_WANTED,
    HEADER_REQUEST_ID,
    HEADER_REQUEST_TIMEOUT_MS,
    HEADER_TOKEN,
    Code,
)
from shared.errors import reason

RECEIVE_BYTES = 64 * 1024
_CLIENT_PARTS_REFUSED = "the client's query or headers are not valid HTTP"
_TOKEN, _REQUEST_ID, _EXECUTION_ID = HEADER_TOKEN.encode(), HEADER_REQUEST_ID.encode(), HEADER_EXECUTION_ID.encode()
_WANTED = HEADER_HOST_WANTED.encode()
_FORWARDED_FOR, _REQUEST_TIMEOUT_MS = HEADER_FORWARDED_FOR.encode(), HEADER_REQUEST_TIMEOUT_MS.encode()
_NO_HEADERS: Sequence[tuple[bytes, bytes]] = ()


@dataclass(frozen=True)
class UpstreamLimits:
    """How much the client to the workers keeps and holds (built once from the settings)."""

    keepalive_connections: int  # idle connections kept, all workers together
    # An idle connection is dropped after this, below the workers' own keep-alive timeout
    # (Hypercorn's default is 5 s): a connection the worker is closing right now would fail
    # a request and eject a healthy worker.
    keepalive_expiry_seconds: float = 4.0
    # A worker's answer is held whole (its images are rewritten into files): a broken worker
    # must not be able to exhaust the gateway's memory. Grow answers at 52 MP are ~200 MB.
    max_answer_bytes: int = 512 * 1024 * 1024


@dataclass(frozen=True)
class Timeouts:
    """How long a forward may take, connecting included (`edge.dispatch`): a generation
    endpoint (`slow_paths`) has its own."""

    request_seconds: float
    slow_request_seconds: float

    def for_class(self, *, slow: bool) -> float:
        return self.slow_request_seconds if slow else self.request_seconds


class RawAnswer(NamedTuple):  # a tuple: built on every forward, at the gateway's ceiling
    """An answer as the transport read it, not yet judged: its status, its headers (names
    lower-cased, as h11 gives them), its body."""

    status: int
    headers: Sequence[tuple[bytes, bytes]]
    body: bytes

    def header(self, name: bytes) -> str | None:
        """The last value of header `name` (lower-case), None when the answer has none."""
        values = [value for key, value in self.headers if key == name]
        return values[-1].decode("latin-1") if values else None


@dataclass(frozen=True)
class ForwardRequest:
    """A client's `/api/` request, body buffered (retries replay it), as the gateway sends it on.

    Only these fields travel: everything else the client sent is dropped (hop-by-hop
    headers, a client's own X-Internal-Token, cookies, …).
    """

    method: str
    path: str
    query: str
    body: bytes
    content_type: str | None
    request_id: str
    forwarded_for: str
    execution_id: str = ""  # the audit trail's, logged by the host too

    @property
    def target(self) -> str:
        """The path plus "?query" when there is one, as the client sent them."""
        return f"{self.path}?{self.query}" if self.query else self.path


@dataclass(frozen=True)
class HealthAnswer:
    """What a probe got back: an HTTP status and the raw body."""

    status: int
    body: bytes


class Upstream:
    """The gateway's HTTP/1.1 client to the workers; one per gateway process.

    Keep-alive connections are kept per worker and taken one exchange at a time: a worker
    runs one job at a time, so its forwards reuse one connection and its probes (which may
    run beside a forward) another. Written on h11 rather than httpcore's pool: the pool's
    bookkeeping, its request and response objects and its two writes per request (head,
    then body) were half the gateway's CPU per forward at its ceiling, this is a third of
    that (docs/drill_and_bench.md § gateway bench).
    """

    def __init__(self, token: str, limits: UpstreamLimits, *, ca_file: str = "") -> None:
        self._token = token.encode()
        self._ssl_context = ssl.create_default_context(cafile=ca_file or None)
        self._limits = limits
        self._idle: dict[_Origin, list[_Connection]] = {}

    async def aclose(self) -> None:
        idle, self._idle = self._idle, {}
        for connections in idle.values():
            for connection in connections:
                connection.close()

    def set_token(self, token: str) -> None:
        """Send `token` from the next request on; requests already sent keep theirs."""
        self._token = token.encode()

    @asynccontextmanager
    async def forward(self, base_url: str, request: ForwardRequest, timeout_seconds: float) -> AsyncIterator[RawAnswer]:
        """`request` sent to the worker at `base_url`, its raw answer; the connection is kept
        only when the block exits normally (the caller judges the answer inside it)."""
        try:
            target, client_headers = _client_parts(request)
        except UnicodeEncodeError:
            raise RequestNotSent(Code.INVALID_PARAMETER, _CLIENT_PARTS_REFUSED) from None
        headers = [
            (_TOKEN, self._token),
            (_REQUEST_ID, request.request_id.encode()),
            (_EXECUTION_ID, request.execution_id.encode()),
            *client_headers,
            (b"Content-Length", str(len(request.body)).encode()),
        ]
        try:
            async with self._exchange(base_url, request.method, target, headers, request.body, timeout_seconds,
                                      send_deadline=True) as answer:  # fmt: skip
                yield answer
        except RequestNotSent:
            if _sendable(request.method, target, client_headers):
                raise
            raise RequestNotSent(Code.INVALID_PARAMETER, _CLIENT_PARTS_REFUSED) from None

    async def probe(self, url: str, timeout_seconds: float, wanted: bool = False) -> HealthAnswer:
        """`wanted`: tell the host a request here has waited long for it (gateway.md § Several gateways)."""
        base_url, target = _split_target(url)
        headers = [(_TOKEN, self._token), *([(_WANTED, b"1")] if wanted else [])]
        async with self._exchange(base_url, "GET", target, headers, b"", timeout_seconds) as answer:
            return HealthAnswer(answer.status, answer.body)

    @asynccontextmanager
    async def _exchange(
        self,
        base_url: str,
        method: str,
        target: bytes,
        headers: list[tuple[bytes, bytes]],
        body: bytes,
        timeout_seconds: float,
        *,
        send_deadline: bool = False,
    ) -> AsyncIterator[RawAnswer]:
        """One exchange, its answer; `timeout_seconds` bounds all of it, connecting
        included. The connection is kept when the block exits normally, closed otherwise.
        `send_deadline`: tell the host what remains of the timeout once connected."""
        origin = _origin(base_url)
        deadline = trio.current_time() + timeout_seconds
        connection = await self._take_idle(origin)
        if connection is None:
            with trio.move_on_at(deadline):
                connection = await self._connect(origin)
            if connection is None:
                raise ConnectError(f"connect timeout after {timeout_seconds:g}s")
        if send_deadline:  # what is left of it after connecting (a TLS handshake takes some)
            remaining = deadline_milliseconds(max(deadline - trio.current_time(), 0.0))
            headers = [*headers, (_REQUEST_TIMEOUT_MS, str(remaining).encode())]
        try:
            head = h11.Request(method=method, target=origin.path + target, headers=[(b"Host", origin.host), *headers])
        except h11.LocalProtocolError:  # nothing was sent; not the worker's fault
            connection.close()
            # h11's message quotes the offending header, which may be the shared password
            raise RequestNotSent(Code.SYSTEM_ERROR, "a request header of the gateway's is not valid HTTP") from None
        answer = None
        try:
            with trio.move_on_at(deadline):
                answer = await connection.exchange(head, body)
        except (h11.ProtocolError, trio.BrokenResourceError, trio.ClosedResourceError, OSError) as error:
            connection.close()
            raise ConnectionClosed(reason(error)) from None
        except BaseException:  # too large, framed twice, cancelled (the client left): the host must see the close
            connection.close()
            raise
        if answer is None:
            connection.close()
            raise UpstreamTimeout(f"no complete answer in {timeout_seconds:g}s")
        try:
            yield answer
        except BaseException:
            connection.close()
            raise
        self._keep(origin, connection)

    async def _take_idle(self, origin: _Origin) -> _Connection | None:
        """The most recently used idle connection to `origin` still fit to send on."""
        connections = self._idle.get(origin, [])
        while connections:
            connection = connections.pop()
            if await connection.reusable():
                return connection
            connection.close()  # closed or expired: nothing to say on it
        return None

    def _keep(self, origin: _Origin, connection: _Connection) -> None:
        if (
            not connection.start_next_cycle()
            or sum(map(len, self._idle.values())) >= self._limits.keepalive_connections
        ):
            connection.close()
            return
        self._idle.setdefault(origin, []).append(connection)

    async def _connect(self, origin: _Origin) -> _Connection:
        if origin.scheme not in ("http", "https"):
            raise ConnectError(f"unsupported scheme {origin.scheme!r}")
        try:
            socket_stream = await trio.open_tcp_stream(origin.hostname, origin.port)
        except OSError as error:  # refused, unreachable, no such host
            raise ConnectError(reason(error)) from None
        if origin.scheme == "http":
            return _Connection(socket_stream, socket_stream, self._limits)
        tls = trio.SSLStream(socket_stream, self._ssl_context, server_hostname=origin.hostname)
        try:
            await tls.do_handshake()
        except BaseException as error:
            socket_stream.socket.close()
            if isinstance(error, (trio.BrokenResourceError, ssl.SSLError, OSError)):
                raise ConnectError(reason(error)) from None
            raise
        return _Connection(tls, socket_stream, self._limits)


@dataclass(frozen=True)
class _Origin:
    scheme: str
    hostname: str
    port: int
    host: bytes  # the Host header
    path: bytes  # a path prefix of the worker's URL, usually none


@functools.lru_cache(maxsize=256)
def _origin(base_url: str) -> _Origin:
    parts = urlsplit(base_url)
    default_port = 443 if parts.scheme == "https" else 80
    try:
        port = parts.port or default_port
    except ValueError:
        port = default_port  # refused when connecting: no such port
    return _Origin(parts.scheme, parts.hostname or "", port, parts.netloc.encode(), parts.path.rstrip("/").encode())


def _split_target(url: str) -> tuple[str, bytes]:
    """ "http://host:port/health?x" -> ("http://host:port", b"/health?x")."""
    parts = urlsplit(url)
    target = parts.path + (f"?{parts.query}" if parts.query else "")
    return f"{parts.scheme}://{parts.netloc}", target.encode("latin-1")


class _Connection:
    """One HTTP/1.1 connection to a worker: one exchange at a time, request in one write."""

    def __init__(self, stream: trio.abc.Stream, socket_stream: trio.SocketStream, limits: UpstreamLimits) -> None:
        self.stream = stream
        self._limits = limits
        self.socket_stream = socket_stream
        self._protocol = h11.Connection(h11.CLIENT)
        self._idle_since = trio.current_time()
        self._write_failed = False

    async def exchange(self, head: h11.Request, body: bytes) -> RawAnswer:
        events = (head, h11.Data(data=body), h11.EndOfMessage())
        try:
            await self.stream.send_all(b"".join(self._protocol.send(event) or b"" for event in events))  # one write
        except trio.BrokenResourceError:
            self._write_failed = True  # it may have answered before reading it all (a 413) and closed: read that
        status, headers, chunks, received = 0, _NO_HEADERS, [], 0
        while True:
            event = self._protocol.next_event()
            if event is h11.NEED_DATA:
                self._protocol.receive_data(bytes(await self.stream.receive_some(RECEIVE_BYTES)))  # bytes: no copy
            elif isinstance(event, h11.Response):
                if _framed_twice(event):
                    raise AmbiguousFraming("the answer has both Content-Length and Transfer-Encoding")
                status, headers = event.status_code, event.headers
            elif isinstance(event, h11.Data):
                chunks.append(event.data)
                received += len(event.data)
                if received > self._limits.max_answer_bytes:
                    raise AnswerTooLarge(f"answer over {self._limits.max_answer_bytes} bytes")
            elif isinstance(event, h11.EndOfMessage):
                return RawAnswer(status, headers, b"".join(chunks))
            elif isinstance(event, h11.ConnectionClosed):
                raise h11.RemoteProtocolError("the worker closed the connection before its answer")

    def start_next_cycle(self) -> bool:
        """Ready the connection for the next exchange; False when it must be closed instead:
        also when bytes followed the answer, which h11 would read as the next one's."""
        protocol = self._protocol
        if self._write_failed or protocol.our_state is not h11.DONE or protocol.their_state is not h11.DONE:
            return False
        if protocol.trailing_data[0]:
            return False
        self._protocol.start_next_cycle()
        self._idle_since = trio.current_time()
        return True

    def close(self) -> None:
        """At once, also when cancelled: the worker sees the connection end."""
        self.socket_stream.socket.close()

    async def reusable(self) -> bool:
        """Idle for less than the keep-alive expiry, nothing unread on it and the worker has
        not closed it (a closed socket reads as readable; so do bytes it sent unasked)."""
        if trio.current_time() - self._idle_since >= self._limits.keepalive_expiry_seconds:
            return False
        if self.socket_stream.socket.is_readable():
            return False
        if self.stream is self.socket_stream:
            return True
        return not tls_holds_bytes(self.stream)


def tls_holds_bytes(stream: trio.abc.Stream) -> bool:
    """Whether a TLS stream already holds bytes read off the socket: decrypted ones the last
    receive left in the TLS object, or a whole record that came in the same socket read.
    trio has no public way to ask (a receive in a cancelled scope is cancelled before it looks
    at either buffer), so this reads SSLStream's two buffers; tests/test_framework_pins.py
    fails when their names change."""
    if not isinstance(stream, trio.SSLStream):
        return False
    return bool(stream._ssl_object.pending() or stream._incoming.pending)


def deadline_milliseconds(timeout_seconds: float) -> int:
    """`X-Request-Timeout-Ms`: the whole milliseconds the gateway waits (rounded down, so
    the host never works past the gateway's deadline; 1.001 s is 1001 ms, not the 1000 its
    binary fraction would floor to)."""
    return math.floor(round(timeout_seconds * 1000, 6))


def _client_parts(request: ForwardRequest) -> tuple[bytes, list[tuple[bytes, bytes]]]:
    """The target and headers that carry what the client sent; UnicodeEncodeError when a
    part is not Latin-1."""
    headers = [(_FORWARDED_FOR, request.forwarded_for.encode("latin-1"))]
    if request.content_type is not None:
        headers.append((b"Content-Type", request.content_type.encode("latin-1")))
    return request.target.encode("latin-1"), headers  # the client's bytes, as sent


def _sendable(method: str, target: bytes, headers: list[tuple[bytes, bytes]]) -> bool:
    """Would h11 build a head from the client's parts alone? (Only asked after a refusal.)"""
    try:
        h11.Request(method=method, target=target, headers=[(b"Host", b"worker"), *headers])
    except h11.LocalProtocolError:
        return False
    return True


def _framed_twice(response: h11.Response) -> bool:
    names = {name for name, _ in response.headers}
    return b"content-length" in names and b"transfer-encoding" in names
