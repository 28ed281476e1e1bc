"""One `/api/` request from buffered body to final envelope: slot, lease, forward, retry, rewrite.

This is the gateway's request policy with no HTTP server in it (so it lives in
`edge.forwarding`, above `edge.pool` and below `edge.web`): `ApiService.handle()` takes a
`ForwardRequest` and returns an `ApiResponse` (`edge.exchange`) holding an envelope, so every failure
the client sees is an envelope (never a bare disconnect or a 5xx page). A client that
leaves cancels `handle()` (quart-trio cancels the handler): a queued request gives back
its place and never reaches a worker; a forward under way is abandoned, its upstream
connection closed and its worker left draining (`edge.pool.dispatch`).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field, replace

import trio

from edge.annotations.rewrite import BadImage, DecodedImages, ImageStore, ImageWriteError, has_images
from edge.audit.trail import AuditTrail
from edge.exchange import ApiResponse, encode
from edge.observe.metrics import GatewayMetrics
from edge.pool.dispatch import Busy, Dispatcher, EarlyRefusal, Unavailable
from edge.pool.errors import HostFailed, RequestNotSent, UnusableAnswer, WorkerBusy, WorkerFailure, WorkerRefusal
from edge.pool.failures import (
    KIND_RULES,
    FailureNumbers,
    HostAction,
    RetryPolicy,
    WorkerAnswer,
    forwarded,
    retry_after_seconds,
)
from edge.pool.host_leases import NO_HOST_LEASES, HostLeasing
from edge.pool.upstream import ForwardRequest, Timeouts, Upstream
from shared.contract import (
    DEFAULT_MESSAGES,
    MSG_BACKEND_BUSY,
    MSG_BACKEND_UNAVAILABLE,
    Code,
    ContractError,
    ErrorType,
    answer_error_type,
    envelope,
)
from shared.contract import failure as failure_envelope
from shared.contract.uploads import check_request
from shared.settings import AnalysisSettings

log = logging.getLogger("edge.api")

BUSY_RETRY_AFTER_SECONDS = 2
DEFAULT_FAILURE_NUMBERS = FailureNumbers()  # the settings' defaults
CHECK_INLINE_BYTES = 64 * 1024  # larger bodies are checked in a worker thread


class ApiService:
    """Runs one request through dispatch and forwarding, retrying per `RetryPolicy`."""

    def __init__(
        self,
        dispatcher: Dispatcher,
        upstream: Upstream,
        images: ImageStore,
        policy: RetryPolicy,
        timeouts: Timeouts,
        *,
        probe_interval_seconds: float,
        metrics: GatewayMetrics,
        limits: AnalysisSettings,
        audit: AuditTrail,
        failures: FailureNumbers = DEFAULT_FAILURE_NUMBERS,
        host_leases: HostLeasing = NO_HOST_LEASES,
    ) -> None:
        """`host_leases`: the shared Redis's leases on hosts, when several gateways share them;
        `failures`: how long a host that named its failure is kept from jobs."""
        self._dispatcher = dispatcher
        self._audit = audit
        self._host_leases = host_leases
        self._metrics = metrics
        self._limits = limits
        self._upstream = upstream
        self._images = images
        self._policy = policy
        self._timeouts = timeouts
        self._probe_interval_seconds = probe_interval_seconds
        self._failures = failures

    def reconfigure(
        self,
        images: ImageStore,
        policy: RetryPolicy,
        timeouts: Timeouts,
        *,
        probe_interval_seconds: float,
        limits: AnalysisSettings,
        failures: FailureNumbers,
    ) -> None:
        """Reloaded settings, for requests that start from now on."""
        self._images, self._policy, self._timeouts = images, policy, timeouts
        self._limits, self._failures = limits, failures
        self._probe_interval_seconds = probe_interval_seconds

    def gateway_failure(
        self, request_id: str, code: Code, message: str, *, retry_after_seconds: int | None = None
    ) -> ApiResponse:
        """An envelope made by the gateway; a 1007 carries Retry-After (`retry_after_seconds`,
        else when a worker may be free) and is never replayed to a retry with the same
        Idempotency-Key (no worker, busy, retries exhausted): the client should try again."""
        if code is Code.SYSTEM_ERROR and retry_after_seconds is None:
            pool = self._dispatcher.pool
            retry_after_seconds = BUSY_RETRY_AFTER_SECONDS
            if not pool.any_online():  # after ejections: not before their cooldown ends
                retry_after_seconds = math.ceil(
                    pool.seconds_until_one_may_return(trio.current_time(), self._probe_interval_seconds)
                )
        body = encode(envelope(code, request_id, None, message))
        storable = code is not Code.SYSTEM_ERROR
        return ApiResponse.of_envelope(body, int(code), retry_after_seconds=retry_after_seconds, storable=storable)

    def _passed_on(self, answer: WorkerAnswer) -> ApiResponse:
        """A host's envelope as the client gets it (`raw`, byte for byte), with the retry
        guidance its kind calls for (gateway.md § Failure kinds) and the host's model version.
        A 1007 (a kind not sent elsewhere) gets Retry-After from when the pool may next take a
        job (the kind set that for this host) and is never replayed (it says to retry)."""
        raw, body, version = answer.raw, answer.envelope, answer.model_version
        code, kind = body["code"], answer_error_type(body)
        if code != Code.SYSTEM_ERROR:  # a success, or the photo refused: no guidance but the kind
            if kind is None:
                return ApiResponse.of_envelope(raw, code, model_version=version)
            advice = KIND_RULES[kind].advice
            return ApiResponse.of_envelope(raw, code, retry_policy=advice, error_type=kind.value, model_version=version)
        seconds = self._dispatcher.pool.seconds_until_free(
            trio.current_time(), self._probe_interval_seconds, BUSY_RETRY_AFTER_SECONDS
        )
        return ApiResponse.of_envelope(
            raw,
            code,
            retry_after_seconds=retry_after_seconds(seconds),
            retry_policy=KIND_RULES[kind or ErrorType.INTERNAL].advice,
            error_type=None if kind is None else kind.value,
            storable=False,
            model_version=version,
        )

    async def handle(self, request: ForwardRequest) -> ApiResponse:
        # only the GPU endpoints' POST routes get here (`edge.web.api_routes`)
        try:
            await self._check(request)
        except ContractError as error:  # refused before taking a slot or a worker
            return ApiResponse.of_envelope(encode(failure_envelope(error, request.request_id)), int(error.code))
        self._audit.queued(request.execution_id)
        progress = _Progress()
        progress.wait_began()
        try:
            async with self._dispatcher.slot(slow=self.is_slow(request.path)):
                progress.wait_ended()
                answer = await self._forward_with_retries(request, progress)
        except EarlyRefusal as refusal:
            answer = self.gateway_failure(
                request.request_id, Code.SYSTEM_ERROR, MSG_BACKEND_BUSY, retry_after_seconds=refusal.retry_after_seconds
            )
            answer.log_facts = replace(answer.log_facts, early_refusal=True)
            progress.waiting_since, progress.queue_seconds = None, 0.0  # it did not wait (gateway.md)
        except Busy:
            answer = self.gateway_failure(request.request_id, Code.SYSTEM_ERROR, MSG_BACKEND_BUSY)
        except Unavailable:
            answer = self.gateway_failure(request.request_id, Code.SYSTEM_ERROR, MSG_BACKEND_UNAVAILABLE)
        progress.wait_ended()  # a wait that ended in Busy or Unavailable still counts
        answer.log_facts = replace(
            answer.log_facts,
            worker=progress.worker,
            attempts=progress.attempts,
            queue_seconds=progress.queue_seconds,
            failed_workers=tuple(progress.failed_workers),
            error_type=answer.log_facts.error_type or progress.error_type,
        )
        return answer

    async def _forward_with_retries(self, request: ForwardRequest, progress: _Progress) -> ApiResponse:
        timeout_seconds = self._timeouts.for_class(slow=self.is_slow(request.path))
        tried: set[int] = set()
        busy_elsewhere_since: float | None = None
        while True:
            try:
                answer, images = await self._attempt(request, timeout_seconds, tried, progress)
            except WorkerBusy:  # shared with another gateway: not an attempt, not a failure
                # (the lease was given back marked busy: nobody is handed the worker until a
                # probe says it is free)
                assert progress.worker is not None
                # each new wait for a worker starts its own queue wait: bound them all together,
                # or a host busy with another gateway's long job holds this request (and its slot)
                busy_elsewhere_since = busy_elsewhere_since or trio.current_time()
                if trio.current_time() - busy_elsewhere_since > self._dispatcher.queue_wait_seconds:
                    raise Busy("every eligible worker stayed busy with other gateways' jobs") from None
                tried.discard(progress.worker)
                progress.attempts -= 1
                continue
            except HostFailed as failed:  # the host named its failure: the kind decides (failures.py)
                assert progress.worker is not None
                progress.failed_workers.append(progress.worker)
                progress.error_type = failed.kind.value
                log.warning(
                    "主机报告故障 | request_id=%s | worker=%s | 第%d次 | error_type=%s",
                    request.request_id,
                    progress.worker,
                    progress.attempts,
                    failed.kind.value,
                )
                elsewhere = self._dispatcher.pool.eligible(frozenset(tried))
                if not (elsewhere and self._policy.allows_retry(failed, request.path, progress.attempts)):
                    return self._passed_on(failed.answer)  # its own answer, with its kind's guidance
                self._metrics.observe_retry(failed.reason)
                continue
            except WorkerFailure as failure:  # the worker is broken (ejected in `_attempt`)
                assert progress.worker is not None
                progress.failed_workers.append(progress.worker)
                log.warning(
                    "转发失败 | request_id=%s | worker=%s | 第%d次 | 原因=%s",
                    request.request_id,
                    progress.worker,
                    progress.attempts,
                    failure,
                )
                if not self._policy.allows_retry(failure, request.path, progress.attempts):
                    return self.gateway_failure(request.request_id, Code.SYSTEM_ERROR, MSG_BACKEND_UNAVAILABLE)
                self._metrics.observe_retry(failure.reason)
                continue
            except (WorkerRefusal, RequestNotSent) as refused:  # the request's fault or the gateway's: no ejection
                title, worker = refused.log_title, progress.worker
                log.warning("%s | request_id=%s | worker=%s | %s", title, request.request_id, worker, refused)
                return self.gateway_failure(request.request_id, refused.code, refused.message)
            return await self._finish(request, answer, images)

    async def _attempt(
        self,
        request: ForwardRequest,
        timeout_seconds: float,
        tried: set[int],
        progress: _Progress,
    ) -> tuple[WorkerAnswer, DecodedImages | None]:
        """One forward; the answer is judged while the lease is held, so a worker that sent
        garbage is ejected before anyone else can be handed it."""
        progress.wait_began()
        slow = self.is_slow(request.path)
        if progress.first_worker_wait is None:
            progress.first_worker_wait = progress.waiting_since
        async with self._dispatcher.worker(
            frozenset(tried), path=request.path, slow=slow, waiting_since=progress.first_worker_wait
        ) as lease:
            progress.wait_ended()
            progress.attempts += 1  # an attempt is a worker tried, not a wait for one
            progress.worker = lease.index
            tried.add(lease.index)
            try:
                # A client that leaves now cancels the forward (the upstream connection is
                # closed) and leaves the worker draining until the host says it is free.
                # A busy answer (or another gateway's lease on the host) gives the worker
                # back marked busy, in the same step (`WorkerLease.forwarding`).
                with lease.forwarding(timeout_seconds):
                    async with self._host_leases.hold(lease.url, timeout_seconds):
                        answer = await self._audit.forwarding(
                            request.execution_id,
                            lease.index,
                            forwarded(self._upstream, lease.url, request, timeout_seconds),
                        )
                    # the host's own 1007 (its inference timeout, a restart) is no service time
                    lease.timed = answer.envelope.get("code") != Code.SYSTEM_ERROR
                if lease.timed:
                    self._dispatcher.answered(lease.index)  # its failures in a row end here
                images = await self._images.decode(answer.envelope) if has_images(answer.raw) else None
            except WorkerFailure as failure:  # the host pays before the lease is given back: nobody gets it first
                self._charge(lease.index, failure)
                raise
            except BadImage as error:
                unusable = UnusableAnswer(str(error))
                self._charge(lease.index, unusable)
                raise unusable from None
        if lease.handed_on:
            await _let_the_next_forward_go_first()
        return answer, images

    async def _check(self, request: ForwardRequest) -> None:
        """The GPU host's own checks of fields, image size and format (gateway.md § Parameter
        checks at the edge): a request it would refuse never takes a queue slot or a GPU."""
        arguments = (request.path, request.body, request.content_type, self._limits)
        if len(request.body) <= CHECK_INLINE_BYTES:
            check_request(*arguments)
        else:  # a few ms of parsing for megabytes: not on the event loop
            await trio.to_thread.run_sync(check_request, *arguments)

    def _charge(self, index: int, failure: WorkerFailure) -> None:
        """What the failure does to the host: its kind's action when it named one, else ejected."""
        if isinstance(failure, HostFailed):
            self._act_on(index, failure.kind)
            return
        self._dispatcher.eject(index, str(failure))
        self._metrics.observe_ejection(index, failure.reason)

    def _act_on(self, index: int, kind: ErrorType) -> None:
        """What `kind` does to the host that named it (`KIND_RULES`), the hold's length by
        its failures of that kind in a row (`FailureNumbers.hold_seconds`)."""
        self._metrics.observe_host_failure(index, kind.value)
        action = KIND_RULES[kind].action
        seconds = self._failures.hold_seconds(kind, self._dispatcher.count_failure(index, kind))
        if action is HostAction.BACK_OFF:
            self._dispatcher.rest(index, seconds)
            log.warning("主机退避 | worker=%d | error_type=%s | %.1f 秒内不分配请求", index, kind.value, seconds)
            return
        event = self._dispatcher.eject(index, f"error_type={kind.value}", cooldown_seconds=seconds)
        self._metrics.observe_ejection(index, kind.value)
        if action is HostAction.OUT_FIXED and event is not None:  # once per time out, not per request
            log.error(
                "主机模型未就绪（%s），隔离 %.0f 秒，待探活确认模型已加载后恢复；加载失败需人工处理 | worker=%d",
                kind.value,
                seconds,
                index,
            )

    async def _finish(self, request: ForwardRequest, answer: WorkerAnswer, images: DecodedImages | None) -> ApiResponse:
        """The client-facing envelope; the worker is already free while the files are written."""
        if images is None:
            return self._passed_on(answer)  # byte for byte, with its guidance
        try:
            rewritten = await self._images.write(answer.envelope, images)
        except ImageWriteError as error:  # the gateway's own disk: no retry, no ejection
            log.error("标注图写入失败（网关本地存储） | request_id=%s | 错误=%s", request.request_id, error)
            return self.gateway_failure(request.request_id, Code.SYSTEM_ERROR, DEFAULT_MESSAGES[Code.SYSTEM_ERROR])
        return ApiResponse.of_envelope(encode(rewritten), answer.envelope["code"], model_version=answer.model_version)

    def is_slow(self, path: str) -> bool:
        """A generation endpoint (`slow_paths`): its own timeout, class and reservation."""
        return path in self._policy.slow_paths


async def _let_the_next_forward_go_first() -> None:
    """The worker just given back went to a request waiting for it, whose task the hand-over
    woke: its forward runs before this answer is built and written (a GPU waiting for its
    next job is the scarcest thing here; this answer waits one short step). Two scheduler
    steps: trio runs a batch's tasks in either order, so after the first the woken task may
    still be behind this one; by the end of the second it has had its turn. Cancel-shielded:
    no new point at which a client that left cancels an answer already obtained."""
    await trio.lowlevel.cancel_shielded_checkpoint()
    await trio.lowlevel.cancel_shielded_checkpoint()


@dataclass
class _Progress:
    queue_seconds: float = 0.0
    attempts: int = 0
    worker: int | None = None
    failed_workers: list[int] = field(default_factory=list)
    error_type: str | None = None  # the last kind a host named
    waiting_since: float | None = None  # a queue wait (slot, worker) under way
    first_worker_wait: float | None = None  # when its first wait for a worker began

    def wait_began(self) -> None:
        self.waiting_since = trio.current_time()

    def wait_ended(self) -> None:
        """Counts the wait under way into `queue_seconds`, also one that ended in Busy."""
        if self.waiting_since is not None:
            self.queue_seconds += trio.current_time() - self.waiting_since
            self.waiting_since = None
