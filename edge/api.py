"""One `/api/` request from buffered body to final envelope: slot, lease, forward, retry, rewrite.

This is the gateway's request policy with no HTTP server in it: `ApiService.handle()`
takes an `ApiRequest` and always returns an `ApiAnswer` holding an envelope, so every
failure the client sees is an envelope (never a bare disconnect or a 5xx page).
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass
from typing import Any

import trio

from edge.dispatch import Busy, Dispatcher, Unavailable
from edge.forward import FailureKind, ForwardRequest, RetryPolicy, Upstream, WorkerAnswer, WorkerFailure
from edge.rewrite import BadImage, ImageStore, has_images
from shared.contract import (
    DEFAULT_MESSAGES,
    GPU_ENDPOINT_PATHS,
    MSG_BACKEND_BUSY,
    MSG_BACKEND_UNAVAILABLE,
    MSG_ENDPOINT_NOT_AVAILABLE,
    MSG_UNKNOWN_ENDPOINT,
    Code,
    envelope,
)

log = logging.getLogger("edge.api")

# Endpoints 4 and 99 run on the gateway itself (contract.md); not built yet, never forwarded.
GATEWAY_ENDPOINT_PATHS = frozenset({"/api/v1/face/features", "/api/v1/face/special-points"})
BUSY_RETRY_AFTER_SECONDS = 2


@dataclass(frozen=True)
class ApiRequest:
    """A client's `/api/` request, body already buffered (retries replay it)."""

    method: str
    path: str
    query: str
    body: bytes
    content_type: str | None
    request_id: str
    forwarded_for: str


@dataclass
class ApiAnswer:
    """The envelope to send (JSON bytes) and what the request log needs to know."""

    body: bytes
    code: int | None
    retry_after: int | None = None
    worker: int | None = None
    attempts: int = 0
    queue_seconds: float = 0.0


def encode(document: Any) -> bytes:
    return json.dumps(document, ensure_ascii=False, separators=(",", ":")).encode()


class ApiService:
    """Runs one request through dispatch and forwarding, retrying per `RetryPolicy`."""

    def __init__(
        self,
        dispatcher: Dispatcher,
        upstream: Upstream,
        images: ImageStore,
        policy: RetryPolicy,
        *,
        request_timeout_seconds: float,
        slow_request_timeout_seconds: float,
        probe_interval_seconds: float,
    ) -> None:
        self._dispatcher = dispatcher
        self._upstream = upstream
        self._images = images
        self._policy = policy
        self._request_timeout_seconds = request_timeout_seconds
        self._slow_request_timeout_seconds = slow_request_timeout_seconds
        self._probe_interval_seconds = probe_interval_seconds

    def gateway_failure(self, request_id: str, code: Code, message: str) -> ApiAnswer:
        """An envelope made by the gateway; a 1007 carries Retry-After."""
        retry_after = None
        if code is Code.SYSTEM_ERROR:
            nothing_online = not self._dispatcher.pool.any_online()
            retry_after = math.ceil(self._probe_interval_seconds) if nothing_online else BUSY_RETRY_AFTER_SECONDS
        return ApiAnswer(encode(envelope(code, request_id, None, message)), int(code), retry_after)

    async def handle(self, request: ApiRequest) -> ApiAnswer:
        if request.path in GATEWAY_ENDPOINT_PATHS:
            message = MSG_ENDPOINT_NOT_AVAILABLE.format(path=request.path)
            return self.gateway_failure(request.request_id, Code.SYSTEM_ERROR, message)
        if request.path not in GPU_ENDPOINT_PATHS or request.method != "POST":
            message = MSG_UNKNOWN_ENDPOINT.format(method=request.method, path=request.path)
            return self.gateway_failure(request.request_id, Code.INVALID_PARAMETER, message)
        progress = _Progress(trio.current_time())
        try:
            async with self._dispatcher.slot():
                progress.queue_seconds = trio.current_time() - progress.started
                answer = await self._forward_with_retries(request, progress)
        except Busy:
            answer = self.gateway_failure(request.request_id, Code.SYSTEM_ERROR, MSG_BACKEND_BUSY)
        except Unavailable:
            answer = self.gateway_failure(request.request_id, Code.SYSTEM_ERROR, MSG_BACKEND_UNAVAILABLE)
        answer.worker, answer.attempts, answer.queue_seconds = progress.worker, progress.attempts, progress.queue_seconds
        return answer

    async def _forward_with_retries(self, request: ApiRequest, progress: _Progress) -> ApiAnswer:
        forward = ForwardRequest(
            method=request.method,
            target=request.path + (f"?{request.query}" if request.query else ""),
            body=request.body,
            content_type=request.content_type,
            request_id=request.request_id,
            forwarded_for=request.forwarded_for,
        )
        timeout_seconds = self._timeout_for(request.path)
        tried: set[int] = set()
        while True:
            progress.attempts += 1
            try:
                return await self._attempt(forward, timeout_seconds, tried, progress)
            except WorkerFailure as failure:
                log.warning(
                    "转发失败 | request_id=%s | worker=%s | 第%d次 | 原因=%s",
                    request.request_id, progress.worker, progress.attempts, failure,
                )
                if not self._policy.allows_retry(failure, request.path, progress.attempts):
                    return self.gateway_failure(request.request_id, Code.SYSTEM_ERROR, MSG_BACKEND_UNAVAILABLE)
            except OSError as error:  # our own disk, not the worker: no retry, no ejection
                log.error("标注图写入失败 | request_id=%s | 错误=%s", request.request_id, error)
                return self.gateway_failure(request.request_id, Code.SYSTEM_ERROR, DEFAULT_MESSAGES[Code.SYSTEM_ERROR])

    async def _attempt(
        self, forward: ForwardRequest, timeout_seconds: float, tried: set[int], progress: _Progress
    ) -> ApiAnswer:
        waiting_since = trio.current_time()
        async with self._dispatcher.worker(frozenset(tried)) as lease:
            progress.queue_seconds += trio.current_time() - waiting_since
            progress.worker = lease.index
            tried.add(lease.index)
            try:
                answer = await self._upstream.forward(lease.url, forward, timeout_seconds)
            except WorkerFailure as failure:
                self._dispatcher.eject(lease.index, str(failure))
                raise
        # The worker is free again before the (possibly slow) file writes.
        try:
            return ApiAnswer(await self._rewrite(answer), answer.envelope["code"])
        except BadImage as error:
            self._dispatcher.eject(lease.index, f"unusable_body: {error}")
            raise WorkerFailure(FailureKind.UNUSABLE_BODY, str(error)) from None

    async def _rewrite(self, answer: WorkerAnswer) -> bytes:
        if not has_images(answer.raw):
            return answer.raw  # passed through byte for byte
        return encode(await self._images.rewrite(answer.envelope))

    def _timeout_for(self, path: str) -> float:
        slow = path in self._policy.slow_paths
        return self._slow_request_timeout_seconds if slow else self._request_timeout_seconds


@dataclass
class _Progress:
    started: float
    queue_seconds: float = 0.0
    attempts: int = 0
    worker: int | None = None

