"""The gateway's face worker processes: `edge.cpu.workers` of them, each with its own detector.

Processes, not threads, by measurement (docs/edge.md § Endpoint 99): the face mesh and the
upload parsing hold the GIL for milliseconds at a time, which a thread would take from the
event loop that answers `/monitor` and forwards `/api`. A process costs ~150 MB and a
second to start; the workers are started (spawn) in the background when `run` starts
(`start_at_start`, so the gateway's port never waits for them) or at their first job, and
kept for good.

`run()` belongs in the gateway's nursery; it owns the processes and ends them when it is
cancelled. `call()` runs one job from `edge.local.face_jobs` behind this pool's own
`trio.CapacityLimiter`, so a flood of endpoint 99 queues here and never takes a GPU-pool
slot. Every failure is a ContractError for the envelope: the job's refusal of the photo;
1007 `MSG_BACKEND_BUSY` when no worker frees up within `queue_wait_seconds`; 1007 when a
worker dies, or hangs past `JOB_TIMEOUT_SECONDS` and is killed (it is replaced).
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import trio
import trio_parallel

from edge.local import face_jobs
from edge.local.face_jobs import Refusal
from shared.contract import MSG_BACKEND_BUSY, Code, ContractError

log = logging.getLogger("edge.face_workers")

T = TypeVar("T")

# A job takes ~50 ms (1 MP) to ~300 ms (12 MP); a worker's first job may include its start
# (~1-3 s on a busy machine). Only a hung worker gets anywhere near this.
JOB_TIMEOUT_SECONDS = 30.0
# How long `run()`'s exit waits for a worker to leave cleanly before killing it.
SHUTDOWN_GRACE_SECONDS = 5.0


@dataclass(frozen=True)
class FaceWorkersStatistics:
    workers: int
    running: int  # jobs holding a worker
    waiting: int  # jobs queued for one


class FaceWorkers:
    """A pool of face worker processes; `run()` must be started in a nursery before `call()`."""

    def __init__(self, workers: int, *, queue_wait_seconds: float, start_at_start: bool = True) -> None:
        self._workers = workers
        self._start_at_start = start_at_start
        self._queue_wait_seconds = queue_wait_seconds
        self._limiter = trio.CapacityLimiter(workers)
        # The jobs are already bounded by `_limiter` (acquired with a deadline, which
        # trio-parallel's own acquisition has not), so trio-parallel gets no bound of its own.
        self._unbounded = trio.CapacityLimiter(math.inf)
        self._context: trio_parallel.WorkerContext | None = None

    def statistics(self) -> FaceWorkersStatistics:
        stats = self._limiter.statistics()
        return FaceWorkersStatistics(self._workers, stats.borrowed_tokens, stats.tasks_waiting)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve jobs until cancelled (workers start in the background, ~1-3 s), then end
        the workers (waiting for running jobs)."""
        async with trio_parallel.open_worker_context(
            idle_timeout=math.inf,
            init=face_jobs.prepare_worker,
            grace_period=SHUTDOWN_GRACE_SECONDS,
            worker_type=trio_parallel.WorkerType.SPAWN,
        ) as context:
            self._context = context
            try:
                task_status.started()
                if self._start_at_start:
                    await self._start_every_worker()
                await trio.sleep_forever()
            finally:
                self._context = None

    async def call(self, request_id: str, job: Callable[..., T | Refusal], *args: Any) -> T:
        """`job(*args)` in a worker; ContractError for a refusal, a busy pool or a broken worker."""
        if self._context is None:
            raise RuntimeError("FaceWorkers.run() is not running")
        with trio.move_on_after(self._queue_wait_seconds) as waiting:
            await self._limiter.acquire()
        if waiting.cancelled_caught:
            log.warning("人脸计算排队超时 | request_id=%s | 等待=%gs", request_id, self._queue_wait_seconds)
            raise ContractError(Code.SYSTEM_ERROR, MSG_BACKEND_BUSY)
        try:
            result = await self._run_job(self._context, request_id, job, args)
        finally:
            self._limiter.release()
        if isinstance(result, Refusal):
            raise result.error()
        return result

    async def _run_job(
        self, context: trio_parallel.WorkerContext, request_id: str, job: Callable[..., T], args: tuple[Any, ...]
    ) -> T:
        # Shielded: a client that leaves must not kill a healthy worker mid-job (a new one
        # costs a second); the job's own deadline kills only a hung one.
        with trio.CancelScope(shield=True):
            with trio.move_on_after(JOB_TIMEOUT_SECONDS):
                try:
                    return await context.run_sync(job, *args, kill_on_cancel=True, limiter=self._unbounded)
                except trio_parallel.BrokenWorkerError as error:
                    log.error("人脸计算进程异常退出 | request_id=%s | 错误=%s", request_id, error)
                    raise ContractError(Code.SYSTEM_ERROR) from None
        log.error("人脸计算进程超时已终止 | request_id=%s | 超时=%gs", request_id, JOB_TIMEOUT_SECONDS)
        raise ContractError(Code.SYSTEM_ERROR)

    async def _start_every_worker(self) -> None:
        """Spawn all workers now (concurrently) rather than at the first requests."""
        async with trio.open_nursery() as nursery:
            for _ in range(self._workers):
                nursery.start_soon(self._start_one_worker)

    async def _start_one_worker(self) -> None:
        # a ContractError is logged by `call`; the next job starts a worker again
        with contextlib.suppress(ContractError):
            await self.call("-", bool)  # the worker's `init` (`prepare_worker`) runs before any job
