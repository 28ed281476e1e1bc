"""What a forward's answer, or its absence, means: eject, refuse, wait, or retry elsewhere.

The policy half of forwarding (`edge.pool.upstream` is the transport: connections and
bytes). Outcomes are split the way a retry policy needs them, as in httpx's exception
tree, "never got an answer" apart from "got a bad answer":

    WorkerFailure       the worker is broken: eject it, maybe retry elsewhere (`RetryPolicy`)
      never answered    connect, closed, timeout (raised by the transport)
      bad answer        HTTP >= 500, 401, a body that is not an envelope (or nested
                        deeper than `MAX_ANSWER_DEPTH`), an envelope for another request
                        (a stale answer left on the connection), a response framed by both
                        Content-Length and Transfer-Encoding or larger than the transport
                        holds (`judge`, or the transport for the framing and the size)
    WorkerRefusal       the worker refused *this request* (another 4xx, e.g. 431 for a
                        header block too large): the client's problem, nobody is ejected
    WorkerBusy          503 `"busy": true`: another gateway's job runs there; wait for a
                        worker, eject nobody, spend no retry
    RequestNotSent      h11 refused to build the request head: the gateway's fault (its
                        settings) or the client's (a header or query it sent); nothing was
                        sent, nobody is ejected
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import Enum
from typing import Any

import trio

from shared.contract import BUSY_KEY, DEFAULT_MESSAGES, Code, is_envelope

# Answers larger than this are parsed in a worker thread: a 12 MB answer holds the event
# loop for ~13 ms, every other request's latency included.
PARSE_IN_THREAD_BYTES = 256 * 1024
MSG_NOT_FORWARDABLE = "请求的查询字符串或请求头含有无法转发的字符，请检查后重试"  # 1001
# A host's envelope is a few levels deep; bounded so that nothing downstream (the image
# rewrite, the JSON encoder) meets a RecursionError on a broken host's answer.
MAX_ANSWER_DEPTH = 32


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


class RequestNotSent(Exception):
    """h11 refused to build the request head: nothing left the gateway, the worker is fine.

    INVALID_PARAMETER when the client's own parts (the query, Content-Type,
    X-Forwarded-For) cannot be sent; SYSTEM_ERROR when the gateway's cannot (its token,
    a worker URL). `message` is the client's; the exception's text (for the log) never
    quotes a header, which may be the shared password."""

    def __init__(self, code: Code, detail: str) -> None:
        super().__init__(detail)
        self.code = code
        self.message = MSG_NOT_FORWARDABLE if code is Code.INVALID_PARAMETER else DEFAULT_MESSAGES[code]


class WorkerBusy(Exception):
    """The worker runs another job (another gateway's): HTTP 503 with `"busy": true`.

    Not a failure: nothing is ejected and no retry is spent; the request waits for a worker."""


class WorkerRefusal(Exception):
    """The worker answered a 4xx other than 401: it refused this request, it is not broken."""

    def __init__(self, status: int) -> None:
        super().__init__(f"HTTP {status}")
        self.status = status


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


async def judge(request_id: str, status: int, raw: bytes) -> WorkerAnswer:
    """The answer to the request sent as `request_id`, or the exception that says why not."""
    if status == 200:
        if len(raw) > PARSE_IN_THREAD_BYTES:
            body = await trio.to_thread.run_sync(_parse_envelope, raw)
        else:
            body = _parse_envelope(raw)
        if body["request_id"] != request_id:
            raise WorkerFailure(FailureKind.UNUSABLE_BODY, "the answer is another request's (its request_id)")
        return WorkerAnswer(raw, body)
    refused = _small_json_object(raw)
    if refused is not None and "request_id" in refused and refused["request_id"] != request_id:
        raise WorkerFailure(FailureKind.UNUSABLE_BODY, f"the HTTP {status} answer is another request's")
    if 400 <= status < 500 and status != 401:
        raise WorkerRefusal(status)
    if status == 503 and refused is not None and refused.get(BUSY_KEY) is True:
        raise WorkerBusy
    raise WorkerFailure(FailureKind.BAD_STATUS, f"HTTP {status}")


def _small_json_object(raw: bytes) -> dict[str, Any] | None:
    """A refusal's JSON object (busy, a 4xx envelope), None for anything else."""
    if len(raw) > PARSE_IN_THREAD_BYTES:
        return None
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    return body if isinstance(body, dict) else None


def _parse_envelope(raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError):
        raise WorkerFailure(FailureKind.UNUSABLE_BODY, "answer is not JSON") from None
    if not is_envelope(body):
        raise WorkerFailure(FailureKind.UNUSABLE_BODY, "answer is not an envelope")
    # fewer brackets than levels allowed cannot nest too deep: most answers skip the walk
    could_nest = raw.count(b"{") + raw.count(b"[") > MAX_ANSWER_DEPTH
    if could_nest and not nested_within(body, MAX_ANSWER_DEPTH):
        raise WorkerFailure(FailureKind.UNUSABLE_BODY, f"answer nested deeper than {MAX_ANSWER_DEPTH} levels")
    return body


def nested_within(document: Any, max_depth: int) -> bool:
    """Are `document`'s objects and arrays at most `max_depth` levels deep? Without
    recursion, whatever the depth."""
    stack: list[tuple[Any, int]] = [(document, 1)]
    while stack:
        node, depth = stack.pop()
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else None
        if children is None:
            continue
        if depth > max_depth:
            return False
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return True
