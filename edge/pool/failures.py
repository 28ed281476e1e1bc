"""What a forward's answer, or its absence, means: eject, refuse, wait, or retry elsewhere.

The policy half of forwarding: the transport (`edge.pool.upstream`) reads the raw answer,
`judge` decides what it means, and every way it can fail is one class of the tree in
`edge.pool.errors` (as httpx's transport is kept apart from its policy). `forwarded` is
the two together, the answer judged before its connection is kept.

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

from edge.exchange import MODEL_VERSION_HEADER
from edge.pool.errors import BadStatus, HostFailed, UnusableAnswer, WorkerBusy, WorkerFailure, WorkerRefusal
from edge.pool.upstream import ForwardRequest, RawAnswer, Upstream
from shared.contract import (
    BUSY_KEY,
    ErrorType,
    RetryAdvice,
    error_type_of,
    is_envelope,
    model_version_or_none,
)

# Answers larger than this are parsed in a worker thread: a 12 MB answer holds the event
# loop for ~13 ms, every other request's latency included.
PARSE_IN_THREAD_BYTES = 256 * 1024
# A host's envelope is a few levels deep; bounded so that nothing downstream (the image
# rewrite, the JSON encoder) meets a RecursionError on a broken host's answer.
MAX_ANSWER_DEPTH = 32


@dataclass(frozen=True)
class WorkerAnswer:
    """A usable answer: the raw HTTP-200 body and its parsed envelope, and the model version
    its `X-Model-Version` named (None: a host that names none, or a value not passed on)."""

    raw: bytes
    envelope: dict[str, Any]
    model_version: str | None = None


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

    def allows_retry(self, failure: WorkerFailure, path: str, attempts: int) -> bool:
        if not self.retry_on_failure or attempts > self.max_retries:
            return False
        if isinstance(failure, HostFailed) and not KIND_RULES[failure.kind].retry_elsewhere:
            return False
        # A timed-out generation job is probably still running on its GPU (a host that met
        # its deadline drops the answer but lets the inference finish); replaying it would
        # run it twice.
        return not (failure.may_still_run and path in self.slow_paths)


async def forwarded(upstream: Upstream, base_url: str, request: ForwardRequest, timeout_seconds: float) -> WorkerAnswer:
    """`request` forwarded to `base_url` and its answer judged, before the connection is
    kept: an answer that is not one (a stale one, another request's) closes it."""
    async with upstream.forward(base_url, request, timeout_seconds) as answer:
        return await judge(request.request_id, answer)


async def judge(request_id: str, answer: RawAnswer) -> WorkerAnswer:
    """The answer to the request sent as `request_id`, or the `AnswerError` that says why not.
    Its `X-Model-Version` is kept when it is one (`model_version_or_none`)."""
    status, raw = answer.status, answer.body
    model_version = model_version_or_none(answer.header(MODEL_VERSION_HEADER))
    if status == 200:
        if len(raw) > PARSE_IN_THREAD_BYTES:
            body = await trio.to_thread.run_sync(_parse_envelope, raw)
        else:
            body = _parse_envelope(raw)
        if body["request_id"] != request_id:
            raise UnusableAnswer("the answer is another request's (its request_id)")
        judged = WorkerAnswer(raw, body, model_version)
        _raise_if_acted_on(judged)
        return judged
    refused = _small_json_object(raw)
    if refused is not None and "request_id" in refused and refused["request_id"] != request_id:
        raise UnusableAnswer(f"the HTTP {status} answer is another request's")
    if 400 <= status < 500 and status != 401:
        raise WorkerRefusal(status)
    if status == 503 and refused is not None and refused.get(BUSY_KEY) is True:
        raise WorkerBusy
    if status == 503 and refused is not None and is_envelope(refused):  # not ready: a model (re)loading
        _raise_if_acted_on(WorkerAnswer(raw, refused, model_version))
    raise BadStatus(f"HTTP {status}")


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
        raise UnusableAnswer("answer is not JSON") from None
    if not is_envelope(body):
        raise UnusableAnswer("answer is not an envelope")
    # fewer brackets than levels allowed cannot nest too deep: most answers skip the walk
    could_nest = raw.count(b"{") + raw.count(b"[") > MAX_ANSWER_DEPTH
    if could_nest and not nested_within(body, MAX_ANSWER_DEPTH):
        raise UnusableAnswer(f"answer nested deeper than {MAX_ANSWER_DEPTH} levels")
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
