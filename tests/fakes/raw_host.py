"""A GPU host written byte by byte on a trio socket server, for framing a real host never
gets wrong: a second, unsolicited response, a Content-Length shorter than the body sent,
both Content-Length and Transfer-Encoding, a stale answer before the real one.

Every request is answered with an envelope carrying the `X-Request-ID` it arrived with
(`/health`: a health body), so a test can tell which answer each client got. It counts
connections and records every request it read; `misbehaviour` may be changed between
requests.
"""

from __future__ import annotations

import contextlib
import json
import ssl
from enum import Enum
from functools import partial

import trio

from shared.contract import HEADER_REQUEST_ID, Code, envelope

HEALTH_BODY = b'{"status": "ok", "busy": false}'


class Misbehaviour(Enum):
    NONE = "none"
    SECOND_RESPONSE_SAME_WRITE = "second response in the same write"
    SECOND_RESPONSE_LATER = "second response in a later write"
    SHORT_CONTENT_LENGTH = "Content-Length 3 bytes short of the body sent"
    LENGTH_AND_CHUNKED = "Content-Length and Transfer-Encoding: chunked"
    STALE_FIRST = "a stale answer, then the real one"
    NESTED_DEEP = "its own answer, nested 500 levels deep with an image key at the bottom"


def response(body: bytes, *, declared_length: int | None = None, status: bytes = b"200 OK") -> bytes:
    length = len(body) if declared_length is None else declared_length
    head = b"HTTP/1.1 %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % (status, length)
    return head + body


def answer_body(request_id: str) -> bytes:
    return json.dumps(envelope(Code.OK, request_id, {"answered": request_id})).encode()


class RawHost:
    def __init__(self, misbehaviour: Misbehaviour = Misbehaviour.NONE, *, tls: ssl.SSLContext | None = None) -> None:
        self.misbehaviour = misbehaviour
        self._tls = tls  # a server context: https
        self.connections = 0
        self.requests: list[str] = []  # the X-Request-ID of each request read ("health" for /health)
        self.stale_sent = 0  # unsolicited or stale answers written
        self.later_write_done = trio.Event()  # set after each SECOND_RESPONSE_LATER write
        self.url = ""

    async def start(self, nursery: trio.Nursery) -> str:
        listeners = await nursery.start(partial(trio.serve_tcp, self.serve, 0, host="127.0.0.1"))
        scheme = "https" if self._tls else "http"
        self.url = f"{scheme}://127.0.0.1:{listeners[0].socket.getsockname()[1]}"
        return self.url

    async def serve(self, socket_stream: trio.SocketStream) -> None:
        self.connections += 1
        stream: trio.abc.Stream = socket_stream
        if self._tls is not None:
            stream = trio.SSLStream(socket_stream, self._tls, server_side=True)
        # BrokenResourceError: the gateway dropped a connection with bytes unread, a reset
        with contextlib.suppress(trio.BrokenResourceError):
            await self._serve(stream)

    async def _serve(self, stream: trio.abc.Stream) -> None:
        buffered = b""
        while True:
            while b"\r\n\r\n" not in buffered:
                if not (data := await stream.receive_some(65536)):
                    return
                buffered += data
            head, _, buffered = buffered.partition(b"\r\n\r\n")
            target, headers = _parse_head(head)
            length = int(headers.get("content-length", "0"))
            while len(buffered) < length:
                if not (data := await stream.receive_some(65536)):
                    return
                buffered += data
            buffered = buffered[length:]
            request_id = "health" if target.startswith("/health") else headers.get(HEADER_REQUEST_ID.lower(), "")
            self.requests.append(request_id)
            await self._answer(stream, request_id)

    async def _answer(self, stream: trio.abc.Stream, request_id: str) -> None:
        body = HEALTH_BODY if request_id == "health" else answer_body(request_id)
        stale = response(answer_body(f"stale-{self.stale_sent}"))
        misbehaviour = self.misbehaviour
        if misbehaviour is Misbehaviour.NONE:
            await stream.send_all(response(body))
        elif misbehaviour is Misbehaviour.SECOND_RESPONSE_SAME_WRITE:
            self.stale_sent += 1
            await stream.send_all(response(body) + stale)
        elif misbehaviour is Misbehaviour.SECOND_RESPONSE_LATER:
            await stream.send_all(response(body))
            self.stale_sent += 1
            await stream.send_all(stale)
            self.later_write_done.set()
            self.later_write_done = trio.Event()
        elif misbehaviour is Misbehaviour.SHORT_CONTENT_LENGTH:
            # a body that parses without its last 3 bytes: whitespace after the JSON
            await stream.send_all(response(body + b"   ", declared_length=len(body)))
        elif misbehaviour is Misbehaviour.LENGTH_AND_CHUNKED:
            chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
            head = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nTransfer-Encoding: chunked\r\n\r\n" % len(body)
            await stream.send_all(head + chunked)
        elif misbehaviour is Misbehaviour.NESTED_DEEP:
            data = b'{"a":' * 500 + b'{"mask_image_base64":null}' + b"}" * 500
            deep = b'{"code":0,"message":"ok","request_id":%s,"data":%s}' % (json.dumps(request_id).encode(), data)
            await stream.send_all(response(deep))
        elif misbehaviour is Misbehaviour.STALE_FIRST:
            self.stale_sent += 1
            await stream.send_all(stale + response(body))


def _parse_head(head: bytes) -> tuple[str, dict[str, str]]:
    request_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return request_line.split(" ")[1], headers
