"""Malformed and hostile HTTP requests, and a raw-socket client that reads what a server made of them.

Both services serve through `shared.http_server`; their tests send the same `ATTACKS`
(a table of cases that took a service down, or were answered wrongly, before issue 23)
and, in the slow suite, `fuzz_requests` (a few hundred mutations of them).
`{token}` in a request stands for the service's token (the GPU host checks it first).
"""

from __future__ import annotations

import contextlib
import random
import ssl
from dataclasses import dataclass

import h11
import hypercorn.protocol
import hypercorn.trio.run
import pytest
import trio
from hypercorn.protocol.h11 import H11Protocol
from hypercorn.trio.tcp_server import TCPServer

from shared import http_server

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
SETTINGS_FRAME = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
# An HTTP/2 CONNECT without :path (valid per RFC 9113 §8.5): a HEADERS frame, HPACK literal
# `:method CONNECT`, `:authority x` (Hypercorn's UnboundLocalError `raw_path` before issue 23)
CONNECT_HEADERS = b"\x00\x00\x12\x01\x05\x00\x00\x00\x01" + b"\x42\x07CONNECT" + b"\x41\x07x.y:443"
WEBSOCKET = (
    "Connection: Upgrade\r\nUpgrade: websocket\r\n"
    "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
)
H2C = "Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: {settings}\r\n"
API = "/api/v1/hair/measure"


@dataclass(frozen=True)
class Attack:
    """One request and what a service must answer to it: a status from `answers` (None:
    no answer, the connection dropped) and whether the connection is closed after it."""

    name: str
    request: bytes
    answers: frozenset[int | None]
    closes: bool


def _head(line: str, *headers: str, body: bytes = b"") -> bytes:
    return (line + "\r\nHost: svc\r\nX-Internal-Token: {token}\r\n" + "".join(headers) + "\r\n").encode() + body


ATTACKS = (
    # issue 23: Hypercorn switched to HTTP/2, then raised outside any handler (binascii.Error)
    Attack(
        "h2c upgrade, bad settings", _head("GET /health HTTP/1.1", H2C.format(settings="A")), frozenset({200}), False
    ),
    Attack(
        "h2c upgrade, good settings",
        _head("GET /health HTTP/1.1", H2C.format(settings="AAMAAABkAAQAoAAAAAIAAAAA")),
        frozenset({200}),
        False,
    ),
    Attack("HTTP/2 preface", PREFACE + SETTINGS_FRAME, frozenset({505}), True),
    Attack("HTTP/2 CONNECT without :path", PREFACE + SETTINGS_FRAME + CONNECT_HEADERS, frozenset({505}), True),
    Attack("HTTP/2.0 request line", _head("GET /health HTTP/2.0"), frozenset({505}), True),
    Attack("HTTP/3.0 request line", _head("GET /health HTTP/3.0"), frozenset({505}), True),
    # smuggling (RFC 9112 §6.1): refused and closed, or refused by h11 itself; under /api/ with
    # the 1001 envelope saying what was malformed (issue 39: a bare 400/501)
    Attack(
        "CL+TE",
        _head(f"POST {API} HTTP/1.1", "Content-Length: 4\r\nTransfer-Encoding: chunked\r\n", body=b"0\r\n\r\n"),
        frozenset({200}),
        True,
    ),
    Attack(
        "TE+CL",
        _head(f"POST {API} HTTP/1.1", "Transfer-Encoding: chunked\r\nContent-Length: 40\r\n", body=b"0\r\n\r\n"),
        frozenset({200}),
        True,
    ),
    Attack(
        "two different CLs",
        _head(f"POST {API} HTTP/1.1", "Content-Length: 2\r\nContent-Length: 3\r\n", body=b"{}"),
        frozenset({200}),
        True,
    ),
    Attack(
        "TE chunked twice",
        _head(f"POST {API} HTTP/1.1", "Transfer-Encoding: chunked, chunked\r\n", body=b"0\r\n\r\n"),
        frozenset({200}),
        True,
    ),
    Attack(
        "TE gzip",
        _head(f"POST {API} HTTP/1.1", "Transfer-Encoding: gzip\r\n", body=b"0\r\n\r\n"),
        frozenset({200}),
        True,
    ),
    Attack("negative CL", _head(f"POST {API} HTTP/1.1", "Content-Length: -1\r\n"), frozenset({200}), True),
    # the fuzz's find: a 200 envelope to a CONNECT opened a tunnel in h11 (a contained failure)
    Attack(
        "CONNECT, CL+TE",
        _head(f"CONNECT {API} HTTP/1.1", "Content-Length: 4\r\nTransfer-Encoding: chunked\r\n", body=b"0\r\n\r\n"),
        frozenset({400}),
        True,
    ),
    # upgrades the services do not serve: a WebSocket is answered before the app (issue 23: a bare 500)
    Attack("WebSocket on /api/", _head(f"GET {API} HTTP/1.1", WEBSOCKET), frozenset({200}), True),
    Attack("WebSocket on /health", _head("GET /health HTTP/1.1", WEBSOCKET), frozenset({400}), True),
    # the fuzz's find: a handshake with bytes after it made Hypercorn answer twice (a traceback)
    Attack("WebSocket and more bytes", _head(f"GET {API} HTTP/1.1", WEBSOCKET) + b"\r\n\r\n", frozenset({200}), True),
    # request lines and headers h11 refuses
    Attack("garbage request line", b"GARBAGE\r\n\r\n", frozenset({400}), True),
    Attack("NUL in a header", _head("GET /health HTTP/1.1", "X-Nul: a\x00b\r\n"), frozenset({400}), True),
    Attack("NUL in the target", _head("GET /hea\x00lth HTTP/1.1"), frozenset({400}), True),
    Attack("no Host", b"GET /health HTTP/1.1\r\n\r\n", frozenset({400}), True),
    Attack("space before colon", _head("GET /health HTTP/1.1", "X-Bad : 1\r\n"), frozenset({400}), True),
    # a head past h11's buffer: 431, though the unread rest may reset the connection first
    Attack("200 KB header", _head("GET /health HTTP/1.1", f"X-Big: {'a' * 200_000}\r\n"), frozenset({431, None}), True),
)


@dataclass(frozen=True)
class Answer:
    """What came back: the final status (None: none), the 1xx statuses before it, whether
    the server closed the connection after it (within the wait), and the final body."""

    status: int | None
    informational: tuple[int, ...]
    closed: bool
    body: bytes = b""


async def exchange(port: int, data: bytes, *, ssl_context: ssl.SSLContext | None = None, wait_s: float = 5.0) -> Answer:
    """Send `data` raw to 127.0.0.1:`port` and read one answer (through h11, as a client)."""
    stream: trio.abc.Stream = await trio.open_tcp_stream("127.0.0.1", port)
    if ssl_context is not None:
        stream = trio.SSLStream(stream, ssl_context, server_hostname="127.0.0.1")
    async with stream:
        with contextlib.suppress(trio.BrokenResourceError):  # the server may refuse and close before all of it went
            await stream.send_all(data)
        return await read_answer(stream, wait_s)


async def read_answer(stream: trio.abc.Stream, wait_s: float = 5.0) -> Answer:
    """One answer from `stream`; `closed` when the server ended the connection after it."""
    return (await read_answers(stream, 1, wait_s))[0]


async def read_answers(stream: trio.abc.Stream, count: int, wait_s: float = 5.0) -> list[Answer]:
    """`count` answers in a row from `stream` (pipelined requests' answers: one read may bring
    several), fewer where the connection ends first."""
    client = h11.Connection(h11.CLIENT)
    answers: list[Answer] = []
    while len(answers) < count:
        if answers:
            if not (client.our_state is client.their_state is h11.DONE):
                break
            client.start_next_cycle()
        client.send(h11.Request(method="GET", target="/", headers=[("Host", "svc")]))  # h11 parses answers to a request
        client.send(h11.EndOfMessage())
        answers.append(await _read_one(stream, client, wait_s))
    return answers


async def _read_one(stream: trio.abc.Stream, client: h11.Connection, wait_s: float) -> Answer:
    status, body = None, b""
    informational: list[int] = []
    with trio.move_on_after(wait_s):
        while True:
            try:
                event = client.next_event()
            except h11.RemoteProtocolError:  # closed before or within an answer, or not HTTP/1.1
                return Answer(status, tuple(informational), True, body)
            if event is h11.NEED_DATA:
                client.receive_data(await _receive(stream))
            elif isinstance(event, h11.InformationalResponse):
                informational.append(event.status_code)
            elif isinstance(event, h11.Response):
                status = event.status_code
            elif isinstance(event, h11.Data):
                body += event.data
            else:  # the answer's end, or the connection's
                break
    closed = client.their_state is h11.CLOSED
    if status is not None and client.their_state is h11.MUST_CLOSE:
        with trio.move_on_after(wait_s):
            closed = await _receive(stream) == b""
    return Answer(status, tuple(informational), closed, body)


async def _receive(stream: trio.abc.Stream) -> bytes:
    try:
        return bytes(await stream.receive_some(65536))
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        return b""  # a reset: the connection is gone


def hypercorns_own_classes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Hypercorn's own classes where it looks them up, as in a process where no service's
    `serve()` has run (`shared.http_server.install`); what was there is put back after the test."""
    monkeypatch.setattr(hypercorn.protocol, "H11Protocol", H11Protocol)
    monkeypatch.setattr(hypercorn.trio.run, "TCPServer", TCPServer)


def installed_by_serve() -> bool:
    """Whether this project's Hypercorn classes serve (`shared.http_server.install`): a test of
    a service's `serve()` checks it before it speaks HTTP/2, because Hypercorn's own server,
    cancelled with an HTTP/2 connection open, hangs the test instead of failing it."""
    return hypercorn.trio.run.TCPServer is http_server.ContainedTCPServer and issubclass(
        hypercorn.protocol.H11Protocol, http_server.HTTP1Protocol
    )


def with_token(request: bytes, token: str) -> bytes:
    return request.replace(b"{token}", token.encode())


# --- the fuzz ----------------------------------------------------------------------------------


def fuzz_requests(count: int, seed: int = 23) -> list[bytes]:
    """`count` malformed requests: the attacks mutated (bytes flipped, cut, doubled, framing
    headers mixed, versions, methods, upgrades and prefaces, NULs, long lines), reproducible by seed."""
    rng = random.Random(seed)
    seeds = [attack.request for attack in ATTACKS if len(attack.request) < 10_000]
    seeds += [_head("GET /health HTTP/1.1"), _head(f"POST {API} HTTP/1.1", "Content-Length: 2\r\n", body=b"{}")]
    mutations = (_flip, _cut, _double, _framing, _version, _method, _upgrade, _preface, _nul, _long_line, _pipeline)
    return [rng.choice(mutations)(rng, rng.choice(seeds)) for _ in range(count)]


def _flip(rng: random.Random, data: bytes) -> bytes:
    mutated = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        mutated[rng.randrange(len(mutated))] = rng.randrange(256)
    return bytes(mutated)


def _cut(rng: random.Random, data: bytes) -> bytes:
    return data[: rng.randrange(1, len(data))]


def _double(rng: random.Random, data: bytes) -> bytes:
    lines = data.split(b"\r\n")
    line = rng.randrange(len(lines))
    return b"\r\n".join([*lines[: line + 1], lines[line], *lines[line + 1 :]])


def _framing(rng: random.Random, data: bytes) -> bytes:
    headers = rng.sample(
        [
            b"Content-Length: 5",
            b"Content-Length: 0",
            b"Content-Length: 99999999999999999999",
            b"Content-Length: +5",
            b"Transfer-Encoding: chunked",
            b"Transfer-Encoding: chunked, identity",
            b"Transfer-Encoding:\tchunked",
            b"Transfer-Encoding: xchunked",
            b"Content-Length: 5, 6",
            b"Expect: 100-continue",
        ],
        rng.randint(2, 4),
    )
    line, _, _ = data.partition(b"\r\n")
    body = rng.choice(
        [
            b"5\r\nhello\r\n0\r\n\r\n",
            b"hello",
            b"0\r\n\r\nGET /health HTTP/1.1\r\nHost: svc\r\n\r\n",
            b"ffffffffffffffff\r\n",
        ]
    )
    return line + b"\r\nHost: svc\r\n" + b"\r\n".join(headers) + b"\r\n\r\n" + body


def _version(rng: random.Random, data: bytes) -> bytes:
    version = rng.choice(
        [b"HTTP/2.0", b"HTTP/0.9", b"HTTP/1.2", b"HTTP/9.9", b"HTTP/1", b"http/1.1", b"HTTP/1.1 x", b""]
    )
    return data.replace(b"HTTP/1.1", version, 1)


def _method(rng: random.Random, data: bytes) -> bytes:
    method = rng.choice([b"CONNECT", b"PRI", b"TRACE", b"OPTIONS", b"G\x00T", b"", b"GET GET", b"X" * 5000])
    return method + data[data.find(b" ") :]


def _upgrade(rng: random.Random, data: bytes) -> bytes:
    upgrade = rng.choice(
        [
            H2C.format(settings=rng.choice(["A", "", "!!!!", "AAAA" * 100, "=" * 3])),
            WEBSOCKET,
            "Connection: Upgrade\r\nUpgrade: websocket\r\n",
            "Connection: upgrade\r\nUpgrade: h2c, websocket\r\n",
            "Upgrade: TLS/1.0\r\nConnection: Upgrade\r\n",
            WEBSOCKET.replace("13", "8"),
        ]
    ).encode()
    line, _, rest = data.partition(b"\r\n")
    return line + b"\r\n" + upgrade + rest


def _preface(rng: random.Random, data: bytes) -> bytes:
    frame = bytes(rng.randrange(256) for _ in range(rng.randint(0, 64)))
    return rng.choice(
        [
            PREFACE + frame,
            PREFACE + SETTINGS_FRAME + CONNECT_HEADERS + frame,
            PREFACE[: rng.randint(3, 20)],
            frame + PREFACE,
        ]
    )


def _nul(rng: random.Random, data: bytes) -> bytes:
    at = rng.randrange(len(data))
    return data[:at] + b"\x00" * rng.randint(1, 3) + data[at:]


def _long_line(rng: random.Random, data: bytes) -> bytes:
    line, _, rest = data.partition(b"\r\n")
    return line + b"\r\nX-Long: " + b"b" * rng.choice([8_000, 17_000, 40_000]) + b"\r\n" + rest


def _pipeline(rng: random.Random, data: bytes) -> bytes:
    return data + rng.choice([b"\r\n\r\n", b"GET /health HTTP/1.1\r\n\r\n", data, b"\x16\x03\x01\x00\xa5"])
