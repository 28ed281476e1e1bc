"""Every way a forward can end without an answer the client gets as it is, in one tree.

As httpx's `_exceptions.py` splits `TransportError` from `HTTPStatusError`, the branches
say who raised it: the transport (`edge.pool.upstream`) when no answer could be read, the
policy (`edge.pool.failures.judge`) when an answer was read and will not be passed on.

    UpstreamError
    ├── TransportError      no answer was read (the transport)
    │   ├── RequestNotSent      h11 refused to build the head: nothing was sent
    │   ├── ConnectError      * refused, unreachable, TLS handshake, another scheme
    │   ├── ConnectionClosed  * closed or reset before a complete answer
    │   ├── UpstreamTimeout   * no complete answer in time: the job may still run
    │   ├── AnswerTooLarge    * over `UpstreamLimits.max_answer_bytes`
    │   └── AmbiguousFraming  * both Content-Length and Transfer-Encoding
    └── AnswerError         an answer was read and judged (the policy)
        ├── BadStatus         * 5xx, 401 or another status that is no answer
        ├── UnusableAnswer    * not an envelope, nested too deep, another request's
        ├── WorkerRefusal       another 4xx: the worker refused this request
        ├── WorkerBusy          503 "busy": true: another gateway's job runs there
        │   └── HostLeased      (edge.pool.host_leases) another gateway's lease: nothing sent
        └── HostFailed        * the host's 1007 naming a kind the gateway acts on (seed 002)

The starred ones are also `WorkerFailure`s: the worker failed the request, so the host
pays for it (ejected, or as its kind says: `KIND_RULES`) and the request may be retried
elsewhere (`RetryPolicy`). The others eject nobody: a refusal answers the client at once,
a busy worker sends the request back to wait for another.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from shared.contract import DEFAULT_MESSAGES, MSG_REFUSED_BY_HOST, Code, ErrorType

if TYPE_CHECKING:  # the judged answer is the policy's; a failure only carries it
    from edge.pool.failures import WorkerAnswer

MSG_NOT_FORWARDABLE = "请求的查询字符串或请求头含有无法转发的字符，请检查后重试"  # 1001


class UpstreamError(Exception):
    """A forward that gave no answer the client gets as it is."""


class WorkerFailure(UpstreamError):
    """The worker failed the request: eject it (or act on its kind), maybe retry elsewhere.
    A marker beside the two branches: every subclass is also under exactly one of them."""

    reason: str  # the log's and the metrics' `reason` label (ejections, retries)

    def __str__(self) -> str:  # the log line and the pool's ejection reason name the kind
        return f"{self.reason}: {super().__str__()}"

    @property
    def may_still_run(self) -> bool:
        """Is the job probably still running on the host? Then a slow one is not run twice."""
        return False


class TransportError(UpstreamError):
    """No answer was read from the worker."""


class AnswerError(UpstreamError):
    """An answer was read, and the policy will not pass it on."""


class RequestNotSent(TransportError):
    """h11 refused to build the request head: nothing left the gateway, the worker is fine.

    INVALID_PARAMETER when the client's own parts (the query, Content-Type,
    X-Forwarded-For) cannot be sent; SYSTEM_ERROR when the gateway's cannot (its token,
    a worker URL). `message` is the client's; the exception's text (for the log) never
    quotes a header, which may be the shared password."""

    log_title = "请求无法发往后端"

    def __init__(self, code: Code, detail: str) -> None:
        super().__init__(detail)
        self.code = code
        self.message = MSG_NOT_FORWARDABLE if code is Code.INVALID_PARAMETER else DEFAULT_MESSAGES[code]


class ConnectError(TransportError, WorkerFailure):
    """Refused, unreachable, a TLS handshake that failed: the request never arrived."""

    reason = "connect"


class ConnectionClosed(TransportError, WorkerFailure):
    """The connection was closed or reset before a complete answer (the worker died)."""

    reason = "closed"


class UpstreamTimeout(TransportError, WorkerFailure):
    """No complete answer within the attempt's timeout."""

    reason = "timeout"

    @property
    def may_still_run(self) -> bool:
        return True


# The two below are the transport's (it stops reading), but the worker answered something:
# labelled as an unusable answer, as the operator sees it.


class AnswerTooLarge(TransportError, WorkerFailure):
    """A worker's answer exceeded `UpstreamLimits.max_answer_bytes`: the connection is dropped."""

    reason = "unusable_body"


class AmbiguousFraming(TransportError, WorkerFailure):
    """An answer with both Content-Length and Transfer-Encoding (RFC 9112 § 6.3: it may be
    smuggling; its end cannot be trusted, so neither can what follows it)."""

    reason = "unusable_body"


class BadStatus(AnswerError, WorkerFailure):
    """HTTP >= 500, 401 or another status that is no answer: nothing is running there."""

    reason = "bad_status"


class UnusableAnswer(AnswerError, WorkerFailure):
    """HTTP 200 but not an envelope (or nested too deep), a broken image, or an answer that
    is another request's (a stale one left on the connection)."""

    reason = "unusable_body"


class WorkerRefusal(AnswerError):
    """The worker answered a 4xx other than 401: it refused this request, it is not broken."""

    log_title = "后端拒绝请求"

    def __init__(self, status: int) -> None:
        super().__init__(f"HTTP {status}")
        self.status = status
        self.code = Code.TOO_LARGE if status == 413 else Code.INVALID_PARAMETER
        self.message = MSG_REFUSED_BY_HOST.format(status=status)


class WorkerBusy(AnswerError):
    """The worker runs another job (another gateway's): HTTP 503 with `"busy": true`.

    Not a failure: nothing is ejected and no retry is spent; the request waits for a worker."""


class HostFailed(AnswerError, WorkerFailure):
    """The host answered a 1007 naming a kind the gateway acts on (`KIND_RULES`); `answer`
    is that envelope, what the client gets when no retry is left."""

    def __init__(self, kind: ErrorType, answer: WorkerAnswer) -> None:
        super().__init__("the host named its failure")
        self.kind = kind
        self.answer = answer
        self.reason = kind.value

    @property
    def may_still_run(self) -> bool:
        """A host past its deadline dropped the answer, but its model child finishes the
        inference (gpu_host.md § Deadlines): the host is busy a while after it answered."""
        return self.kind is ErrorType.TIMEOUT
