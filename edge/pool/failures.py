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
    HostFailed          the host's own 1007 (or 503) naming a kind the gateway acts on
                        (`data.error_type`): what happens to the host, whether the request
                        goes elsewhere and what the client is told follow `KIND_RULES`

The kinds' table (gateway.md § Failure kinds), one place for what each kind does:

    kind                 the host                          elsewhere  client's X-Retry-Policy
    cuda_error           ejected now, for the cooldown     yes        fixed
    cuda_oom             stays online, no job for b·2ⁿ s   yes        exponential_backoff
    model_load_failed    out for a fixed time (10 s)       yes        fixed
    model_not_loaded     out for a fixed time (10 s)       yes        fixed
    timeout              stays online, no job for b·2ⁿ s   yes*       exponential_backoff
    input_rejected       untouched                         no         none
    internal, unknown    untouched (as before kinds)       no         fixed

n is the host's failures of that kind in a row (since its last good answer); b is the
kind's base (`FailureNumbers`); * a slow path is not retried after a timeout (the job may
still run on its GPU: `RetryPolicy`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

import trio

from shared.contract import (
    BUSY_KEY,
    DEFAULT_MESSAGES,
    Code,
    ErrorType,
    RetryAdvice,
    error_type_of,
    is_envelope,
    model_version_or_none,
)

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
    """A usable answer: the raw HTTP-200 body and its parsed envelope, and the model version
    its `X-Model-Version` named (None: a host that names none, or a value not passed on)."""

    raw: bytes
    envelope: dict[str, Any]
    model_version: str | None = None


class HostFailed(Exception):
    """The host answered a 1007 naming a kind the gateway acts on (`KIND_RULES`); `answer`
    is that envelope, what the client gets when no retry is left."""

    def __init__(self, kind: ErrorType, answer: WorkerAnswer) -> None:
        super().__init__(f"error_type={kind.value}")
        self.kind = kind
        self.answer = answer

    @property
    def may_still_run(self) -> bool:
        """A host past its deadline dropped the answer, but its model child finishes the
        inference (gpu_host.md § Deadlines): the host is busy a while after it answered."""
        return self.kind is ErrorType.TIMEOUT


class HostAction(Enum):
    """What a kind does to the host that named it."""

    EJECT = "eject"  # offline now, for the health check's cooldown; back after a good probe
    OUT_FIXED = "out_fixed"  # offline now, for `model_load_out_seconds`; back after a ready probe
    BACK_OFF = "back_off"  # stays online, gets no job for base·2ⁿ s
    NONE = "none"  # untouched


@dataclass(frozen=True)
class KindRule:
    action: HostAction
    retry_elsewhere: bool
    advice: RetryAdvice  # the client's X-Retry-Policy when the answer reaches it


KIND_RULES: Mapping[ErrorType, KindRule] = {
    ErrorType.CUDA_ERROR: KindRule(HostAction.EJECT, True, RetryAdvice.FIXED),
    ErrorType.CUDA_OOM: KindRule(HostAction.BACK_OFF, True, RetryAdvice.EXPONENTIAL_BACKOFF),
    ErrorType.MODEL_LOAD_FAILED: KindRule(HostAction.OUT_FIXED, True, RetryAdvice.FIXED),
    ErrorType.MODEL_NOT_LOADED: KindRule(HostAction.OUT_FIXED, True, RetryAdvice.FIXED),
    ErrorType.TIMEOUT: KindRule(HostAction.BACK_OFF, True, RetryAdvice.EXPONENTIAL_BACKOFF),
    ErrorType.INPUT_REJECTED: KindRule(HostAction.NONE, False, RetryAdvice.NONE),
    ErrorType.INTERNAL: KindRule(HostAction.NONE, False, RetryAdvice.FIXED),
}
# The kinds whose answer is not passed on at once: the host is acted on, the request may go elsewhere.
ACTED_ON = frozenset(kind for kind, rule in KIND_RULES.items() if rule.action is not HostAction.NONE)


@dataclass(frozen=True)
class FailureNumbers:
    """`edge.failures` (and the health check's cooldown): how long each kind keeps a host."""

    cooldown_seconds: float = 60.0  # cuda_error: `edge.health_check.cooldown_seconds`
    oom_backoff_base_seconds: float = 1.0  # cuda_oom: 2, 4, 8 … s
    timeout_backoff_base_seconds: float = 0.5  # timeout: 1, 2, 4 … s
    backoff_max_seconds: float = 60.0
    model_load_out_seconds: float = 10.0

    def hold_seconds(self, kind: ErrorType, in_a_row: int) -> float:
        """How long a host that named `kind` for the `in_a_row`-th time running is kept
        from jobs (0: not at all)."""
        action = KIND_RULES[kind].action
        if action is HostAction.EJECT:
            return self.cooldown_seconds
        if action is HostAction.OUT_FIXED:
            return self.model_load_out_seconds
        if action is HostAction.BACK_OFF:
            base = self.oom_backoff_base_seconds if kind is ErrorType.CUDA_OOM else self.timeout_backoff_base_seconds
            # 2ⁿ grows past any float for a host that fails for days: capped before it is computed
            return min(base * 2 ** min(in_a_row, 64), self.backoff_max_seconds)
        return 0.0


def retry_after_seconds(seconds_until_free: float) -> int:
    """Retry-After for an answer that asks the client to retry: whole seconds, at least 1."""
    return max(1, math.ceil(seconds_until_free))


@dataclass(frozen=True)
class RetryPolicy:
    """`edge.dispatch` retry settings: may a failed forward be replayed elsewhere?"""

    retry_on_failure: bool
    max_retries: int
    slow_paths: frozenset[str]

    def allows_retry(self, failure: WorkerFailure | HostFailed, path: str, attempts: int) -> bool:
        if not self.retry_on_failure or attempts > self.max_retries:
            return False
        if isinstance(failure, HostFailed):
            if not KIND_RULES[failure.kind].retry_elsewhere:
                return False
            timed_out = failure.kind is ErrorType.TIMEOUT
        else:
            timed_out = failure.kind is FailureKind.TIMEOUT
        # A timed-out generation job is probably still running on its GPU (a host that met
        # its deadline drops the answer but lets the inference finish); replaying it would
        # run it twice.
        return not (timed_out and path in self.slow_paths)


async def judge(request_id: str, status: int, raw: bytes, model_version: str | None = None) -> WorkerAnswer:
    """The answer to the request sent as `request_id`, or the exception that says why not.
    `model_version`: the answer's `X-Model-Version`, kept when it is one (`model_version_or_none`)."""
    model_version = model_version_or_none(model_version)
    if status == 200:
        if len(raw) > PARSE_IN_THREAD_BYTES:
            body = await trio.to_thread.run_sync(_parse_envelope, raw)
        else:
            body = _parse_envelope(raw)
        if body["request_id"] != request_id:
            raise WorkerFailure(FailureKind.UNUSABLE_BODY, "the answer is another request's (its request_id)")
        answer = WorkerAnswer(raw, body, model_version)
        _raise_if_acted_on(answer)
        return answer
    refused = _small_json_object(raw)
    if refused is not None and "request_id" in refused and refused["request_id"] != request_id:
        raise WorkerFailure(FailureKind.UNUSABLE_BODY, f"the HTTP {status} answer is another request's")
    if 400 <= status < 500 and status != 401:
        raise WorkerRefusal(status)
    if status == 503 and refused is not None and refused.get(BUSY_KEY) is True:
        raise WorkerBusy
    if status == 503 and refused is not None and is_envelope(refused):  # not ready: a model (re)loading
        _raise_if_acted_on(WorkerAnswer(raw, refused, model_version))
    raise WorkerFailure(FailureKind.BAD_STATUS, f"HTTP {status}")


def _raise_if_acted_on(answer: WorkerAnswer) -> None:
    """HostFailed when the answer names a kind the gateway acts on (`ACTED_ON`)."""
    kind = error_type_of(answer.envelope)
    if kind in ACTED_ON:
        assert kind is not None
        raise HostFailed(kind, answer)


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
