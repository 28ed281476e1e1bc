"""Forwarding one request to one worker, and the policy for retrying on another.

One shared keep-alive `httpcore` connection pool carries every forward and every probe
(httpcore directly: the gateway needs none of httpx's conveniences, and skipping them is
measurably cheaper; see docs/drill_and_bench.md). Outcomes are split the way a retry
policy needs them, as in httpx's exception tree:

    WorkerFailure       the worker is broken: eject it, maybe retry elsewhere
      never answered    connect, closed, timeout
      bad answer        HTTP >= 500, 401, or a body that is not an envelope
    WorkerRefusal       the worker refused *this request* (another 4xx, e.g. 431 for a
                        header block too large): the client's problem, nobody is ejected
    WorkerBusy          503 `"busy": true`: another gateway's job runs there; wait for a
                        worker, eject nobody, spend no retry
"""

from __future__ import annotations

import json
import ssl
from dataclasses import dataclass
from enum import Enum
from typing import Any

import httpcore
import trio

from shared.contract import BUSY_KEY, HEADER_FORWARDED_FOR, HEADER_REQUEST_ID, HEADER_TOKEN, is_envelope
from shared.errors import reason

KEEPALIVE_EXPIRY_SECONDS = 4.0
# Answers larger than this are parsed in a worker thread: a 12 MB answer holds the event
# loop for ~13 ms, every other request's latency included.
PARSE_IN_THREAD_BYTES = 256 * 1024


class FailureKind(Enum):
    CONNECT = "connect"  # refused, unreachable, TLS handshake: the request never arrived
    CLOSED = "closed"  # connection closed or reset before a complete answer
    TIMEOUT = "timeout"  # no complete answer in time: the job may still be running
    BAD_STATUS = "bad_status"  # 5xx, 401 or any other non-200: nothing is running there
    UNUSABLE_BODY = "unusable_body"  # HTTP 200 but not an envelope, or a broken image


class WorkerFailure(Exception):
    """A forward that did not give a usable answer; the worker gets ejected."""

    def __init__(self, kind: FailureKind, detail: str) -> None:
        super().__init__(f"{kind.value}: {detail}")
        self.kind = kind


class WorkerBusy(Exception):
    """The worker runs another job (another gateway's): HTTP 503 with `"busy": true`.

    Not a failure: nothing is ejected and no retry is spent; the request waits for a worker."""


class WorkerRefusal(Exception):
    """The worker answered a 4xx other than 401: it refused this request, it is not broken."""

    def __init__(self, status: int) -> None:
        super().__init__(f"HTTP {status}")
        self.status = status


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

    @property
    def target(self) -> str:
        """The path plus "?query" when there is one, as the client sent them."""
        return f"{self.path}?{self.query}" if self.query else self.path


@dataclass(frozen=True)
class HealthAnswer:
    """What a probe got back: an HTTP status and the raw body."""

    status: int
    body: bytes


@dataclass(frozen=True)
class WorkerAnswer:
    """A usable answer: the raw HTTP-200 body and its parsed envelope."""

    raw: bytes
    envelope: dict[str, Any]


@dataclass(frozen=True)
class RetryPolicy:
    """`edge.dispatch` retry settings: may a failed forward be replayed elsewhere?"""

    retry_on_failure: bool
    max_retries: int
    slow_paths: frozenset[str]

    def allows_retry(self, failure: WorkerFailure, path: str, attempts: int) -> bool:
        if not self.retry_on_failure or attempts > self.max_retries:
            return False
        # A timed-out generation job is probably still running on its GPU; replaying it
        # would run it twice.
        return not (failure.kind is FailureKind.TIMEOUT and path in self.slow_paths)


class Upstream:
    """The shared keep-alive client to the workers; one per gateway process."""

    def __init__(self, token: str, *, keepalive_connections: int, ca_file: str = "") -> None:
        self._token = token.encode()
        context = ssl.create_default_context(cafile=ca_file or None)
        self._pool = httpcore.AsyncConnectionPool(
            ssl_context=context,
            max_connections=None,  # dispatch bounds concurrency, not the client
            max_keepalive_connections=keepalive_connections,
            # Below the workers' own keep-alive timeout (Hypercorn's default is 5 s): a
            # connection the worker is closing right now would fail a request and eject a
            # healthy worker.
            keepalive_expiry=KEEPALIVE_EXPIRY_SECONDS,
        )

    async def aclose(self) -> None:
        await self._pool.aclose()

    def set_token(self, token: str) -> None:
        """Send `token` from the next request on; requests already sent keep theirs."""
        self._token = token.encode()

    async def forward(self, base_url: str, request: ForwardRequest, timeout_seconds: float) -> WorkerAnswer:
        headers = [
            (HEADER_TOKEN.encode(), self._token),
            (HEADER_REQUEST_ID.encode(), request.request_id.encode()),
            (HEADER_FORWARDED_FOR.encode(), request.forwarded_for.encode("latin-1")),
        ]
        if request.content_type is not None:
            headers.append((b"Content-Type", request.content_type.encode("latin-1")))
        url = base_url.encode() + request.target.encode("latin-1")  # the client's bytes, as sent
        status, raw = await self._send(request.method, url, headers, request.body, timeout_seconds)
        if 400 <= status < 500 and status != 401:
            raise WorkerRefusal(status)
        if status == 503 and _says_busy(raw):
            raise WorkerBusy
        if status != 200:
            raise WorkerFailure(FailureKind.BAD_STATUS, f"HTTP {status}")
        if len(raw) > PARSE_IN_THREAD_BYTES:
            body = await trio.to_thread.run_sync(_parse_envelope, raw)
        else:
            body = _parse_envelope(raw)
        return WorkerAnswer(raw, body)

    async def probe(self, url: str, timeout_seconds: float) -> HealthAnswer:
        status, body = await self._send("GET", url.encode(), [(HEADER_TOKEN.encode(), self._token)], None, timeout_seconds)
        return HealthAnswer(status, body)

    async def _send(
        self,
        method: str,
        url: bytes,
        headers: list[tuple[bytes, bytes]],
        body: bytes | None,
        timeout_seconds: float,
    ) -> tuple[int, bytes]:
        timeouts = dict.fromkeys(("connect", "read", "write", "pool"), timeout_seconds)
        # httpcore's timeouts are per read or write; the deadline bounds the whole exchange.
        with trio.move_on_after(timeout_seconds):
            try:
                response = await self._pool.request(
                    method, url, headers=headers, content=body, extensions={"timeout": timeouts}
                )
            except httpcore.ConnectTimeout as error:
                raise WorkerFailure(FailureKind.CONNECT, f"connect timeout: {reason(error)}") from None
            except httpcore.TimeoutException as error:
                raise WorkerFailure(FailureKind.TIMEOUT, f"{type(error).__name__}: {error}") from None
            except (httpcore.ConnectError, httpcore.UnsupportedProtocol, httpcore.LocalProtocolError) as error:
                # the request never left: refused, unreachable, TLS, or a URL we cannot send to
                raise WorkerFailure(FailureKind.CONNECT, reason(error)) from None
            except (httpcore.NetworkError, httpcore.RemoteProtocolError) as error:
                raise WorkerFailure(FailureKind.CLOSED, f"{type(error).__name__}: {error}") from None
            return response.status, response.content
        raise WorkerFailure(FailureKind.TIMEOUT, f"no complete answer in {timeout_seconds:g}s")


def _says_busy(raw: bytes) -> bool:
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError):
        return False
    return isinstance(body, dict) and body.get(BUSY_KEY) is True


def _parse_envelope(raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError):
        raise WorkerFailure(FailureKind.UNUSABLE_BODY, "answer is not JSON") from None
    if not is_envelope(body):
        raise WorkerFailure(FailureKind.UNUSABLE_BODY, "answer is not an envelope")
    return body
