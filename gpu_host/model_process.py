"""The I/O around the model supervisor: spawn the child, talk to it, reap it, keep time.

`gpu_host.supervisor.Supervisor` decides (pure); `ModelProcess` carries out its actions and
feeds it events. `run()` is the one task that spawns, loads and reaps children; it is owned
by the host's nursery (`gpu_host.main.serve`) and stops when that nursery is cancelled.
Invariants:
- at most one inference is in flight (a one-slot `trio.Semaphore`, held from the request
  that takes it until the child has answered), and the host never queues: a request that
  finds the slot taken fails at once with `ModelBusy` (HTTP 503 busy, gateway.md § Several
  gateways); `/health` never takes it;
- an inference runs in a task of `run()`'s own nursery, not in the caller's: a caller that
  leaves (its client closed the connection) or whose deadline passes stops waiting, while
  the child finishes and its answer is dropped. The child is never killed because a caller
  left — a reload costs seconds, the inference milliseconds (gpu_host.md § Deadlines and
  departures); the slot stays taken (`busy`) until the child is free;
- ready means one thing, `ready()`: the supervisor says READY and the child has not exited
  since; `/health` and `infer` both use it, so a dead child is 503 on both;
- the event loop never blocks: pipe waits are `wait_readable` on its descriptor, transfers
  and reaping (`Process.join`) run in a worker thread;
- a child that dies, exceeds `inference_timeout_seconds`, or does not load within
  `model_load_timeout_seconds`, is SIGKILLed and replaced; the request that saw it gets 1007.
"""

from __future__ import annotations

import logging
import math
import multiprocessing
import multiprocessing.connection
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.context import SpawnContext
from multiprocessing.process import BaseProcess
from typing import Any

import trio

from gpu_host import child
from gpu_host.protocol import (
    ChildConfig,
    ChildEntry,
    ChildMessage,
    Failure,
    Infer,
    LoadFailed,
    ParentMessage,
    Ping,
    Pong,
    Ready,
    Result,
)
from gpu_host.supervisor import Action, Backoff, Phase, Supervisor
from shared.contract import (
    MSG_DEADLINE_EXCEEDED,
    MSG_INFERENCE_TIMED_OUT,
    MSG_MODEL_PROCESS_DIED,
    Code,
    ContractError,
    ErrorType,
)

log = logging.getLogger("gpu_host.model")


class ModelUnavailable(Exception):
    """No ready child: the request was not run (the gateway may send it elsewhere).
    `error_type`: loading (or reloading), or the last load failed (a person must look)."""

    def __init__(self, message: str, error_type: ErrorType = ErrorType.MODEL_NOT_LOADED) -> None:
        super().__init__(message)
        self.error_type = error_type


class ModelBusy(Exception):
    """The child is running another request: this one was not run (nor queued)."""


@dataclass
class _Job:
    """One inference: run by a task of `ModelProcess.run`, waited for by its caller (if it stays)."""

    message: Infer
    done: trio.Event = field(default_factory=trio.Event)
    data: dict | None = None
    error: Exception = field(default_factory=lambda: ModelUnavailable("the host is stopping"))
    departed: bool = False  # the caller stopped waiting: the answer is dropped

    def outcome(self) -> dict:
        if self.data is None:
            raise self.error
        return self.data


@dataclass(frozen=True)
class ModelStatistics:
    """A snapshot for `/health` and the logs."""

    state: Phase
    message: str | None  # why it is not ready, when it is not
    device: str | None
    segmenter: str | None
    busy: bool
    pid: int | None
    restarts: int


class ModelProcess:
    """Supervises the model child; `run()` must be started in a nursery before `infer()`."""

    def __init__(
        self,
        config: ChildConfig,
        *,
        inference_timeout_seconds: float,
        model_load_timeout_seconds: float,
        entry: ChildEntry = child.serve,
        backoff: Backoff = Backoff(),
        context: SpawnContext = multiprocessing.get_context("spawn"),
    ) -> None:
        self._config = config
        self._timeout = inference_timeout_seconds
        self._entry = entry
        self._context = context
        self._machine = Supervisor(model_load_timeout_seconds, backoff)
        self._slot = trio.Semaphore(1, max_value=1)  # one inference at a time (see the invariants)
        self._jobs: trio.Nursery | None = None  # run()'s, where inferences run
        self._running: _Job | None = None
        self._process: BaseProcess | None = None
        self._conn: Connection | None = None
        self._transition = trio.Event()

    # -- public surface ------------------------------------------------------------------

    @property
    def inference_timeout_seconds(self) -> float:
        return self._timeout

    def ready(self) -> bool:
        """The one definition of ready, for `/health` and `infer` alike: the supervisor says
        so and the child has not exited since (`run` may not have handled its exit yet)."""
        return self._machine.ready and not self._child_exited()

    def statistics(self) -> ModelStatistics:
        machine = self._machine
        phase, message = machine.phase, machine.message
        if phase is Phase.READY and not self.ready():
            phase, message = Phase.LOADING, "model process exited; restarting"  # run() is on it
        ready = phase is Phase.READY
        return ModelStatistics(
            state=phase,
            message=message,
            device=machine.device if ready else None,
            segmenter=machine.segmenter if ready else None,
            busy=self._slot.value == 0,
            pid=self._process.pid if self._process else None,
            restarts=machine.restarts,
        )

    async def wait_transition(self) -> None:
        """Return at the next supervisor event (a spawn, ready, a failure: each restart counts)."""
        await self._transition.wait()

    async def wait_ready(self) -> None:
        """Return once a child is ready (immediately if one is)."""
        while not self.ready():
            await self.wait_transition()

    async def wait_idle(self) -> None:
        """Return once no inference runs (immediately if none does)."""
        while self._running is not None:
            await self._running.done.wait()

    async def infer(
        self, request_id: str, endpoint: str, image: bytes, options: dict[str, Any], *, wait_seconds: float = math.inf
    ) -> dict:
        """Run one endpoint in the child; its `data` dict, or ContractError / ModelUnavailable /
        ModelBusy (at once, without waiting). `wait_seconds` (a request's deadline, below
        `inference_timeout_seconds`): stop waiting then with a 1007 and drop the answer, as
        when the caller is cancelled; only the host's own timeout replaces the child."""
        if not self.ready() or self._conn is None or self._jobs is None:
            raise ModelUnavailable(self.statistics().message or self._machine.phase.value, self._unready_kind())
        try:
            self._slot.acquire_nowait()
        except trio.WouldBlock:
            raise ModelBusy() from None
        job = self._running = _Job(Infer(request_id, endpoint, image, options))
        self._jobs.start_soon(self._run_job, job, self._conn)  # it releases the slot
        try:
            with trio.move_on_after(wait_seconds) as waiting:
                await job.done.wait()
        except trio.Cancelled:
            job.departed = True  # its client left (or the host stops): the child finishes alone
            raise
        if waiting.cancelled_caught:
            job.departed = True
            log.warning(
                "inference over the request's deadline (%.1f s), answer dropped | request_id=%s",
                wait_seconds,
                request_id,
            )
            raise ContractError(
                Code.SYSTEM_ERROR,
                MSG_DEADLINE_EXCEEDED.format(seconds=round(wait_seconds, 1)),
                error_type=ErrorType.TIMEOUT,
            )
        return job.outcome()

    def _unready_kind(self) -> ErrorType:
        """Why no child can take a job: a load that failed (FAILED, or WAITING after a start
        that failed) needs a person; anything else is a (re)load under way."""
        if self._machine.phase in (Phase.FAILED, Phase.WAITING):
            return ErrorType.MODEL_LOAD_FAILED
        return ErrorType.MODEL_NOT_LOADED

    async def _run_job(self, job: _Job, conn: Connection) -> None:
        """The whole exchange with the child for one inference, whether its caller still waits or not."""
        request_id = job.message.request_id
        started = trio.current_time()
        try:
            with trio.fail_after(self._timeout):
                await _send(conn, job.message)
                reply = await _receive(conn)
            if isinstance(reply, Result) and reply.request_id == request_id:
                job.data = reply.data
            elif isinstance(reply, Failure) and reply.request_id == request_id:
                job.error = ContractError(Code(reply.code), reply.message, error_type=_kind(reply.error_type))
            else:
                self._inference_failed(f"protocol violation: got {type(reply).__name__} for request_id={request_id}")
                job.error = ContractError(Code.SYSTEM_ERROR, MSG_MODEL_PROCESS_DIED, error_type=ErrorType.INTERNAL)
        except trio.TooSlowError:
            self._inference_failed(f"inference timed out after {self._timeout:g}s (request_id={request_id})")
            job.error = ContractError(
                Code.SYSTEM_ERROR, MSG_INFERENCE_TIMED_OUT.format(seconds=self._timeout), error_type=ErrorType.TIMEOUT
            )
        except (EOFError, OSError, trio.ClosedResourceError):
            # a crash mid-inference (a segfault in native code): nothing names the cause
            self._inference_failed(f"model process died during an inference (request_id={request_id})")
            job.error = ContractError(Code.SYSTEM_ERROR, MSG_MODEL_PROCESS_DIED, error_type=ErrorType.INTERNAL)
        finally:  # also when cancelled: the host stops, and run() kills the child on its way out
            self._running = None
            self._slot.release()
            job.done.set()
        if job.departed:
            log.info(
                "inference answer dropped, its caller left | request_id=%s ms=%.0f",
                request_id,
                (trio.current_time() - started) * 1000,
            )

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Keep one child alive until cancelled; `started()` once the first child is spawned
        (not loaded: the port opens at once and `/health` says `loading` meanwhile)."""
        try:
            async with trio.open_nursery() as jobs:
                self._jobs = jobs
                await self._carry_out(self._machine.start(trio.current_time()))
                task_status.started()
                while True:
                    before = self._machine.phase
                    actions = await self._next_event()
                    self._log_if_lost(before)
                    await self._carry_out(actions)
        finally:
            self._jobs = None
            with trio.CancelScope(shield=True):  # a SIGKILLed child is reaped at once
                await self._kill()

    # -- the supervisor's events ---------------------------------------------------------

    async def _next_event(self) -> list[Action]:
        """Wait for what the current phase waits for; the supervisor's answer to it."""
        phase = self._machine.phase
        if phase is Phase.LOADING:
            return await self._load()
        if phase in (Phase.READY, Phase.REPLACING):
            assert self._process is not None
            await trio.lowlevel.wait_readable(self._process.sentinel)
            await self._reap()
            async with self._slot:  # an inference still reading the dead child's pipe ends first
                return self._machine.exited(self._exit_text(), trio.current_time())
        if phase is Phase.WAITING:
            await trio.sleep_until(self._machine.deadline)
            return self._machine.tick(trio.current_time())
        await trio.sleep_forever()  # FAILED: a LoadFailed needs an operator

    async def _load(self) -> list[Action]:
        """Wait for Ready + Pong until the load deadline."""
        assert self._conn is not None
        with trio.move_on_at(self._machine.deadline):
            try:
                first = await _receive(self._conn)
                if isinstance(first, LoadFailed):
                    return self._machine.refused(first.message)
                if not isinstance(first, Ready):
                    raise EOFError(f"expected Ready, got {type(first).__name__}")
                await _send(self._conn, Ping())
                if not isinstance(await _receive(self._conn), Pong):
                    raise EOFError("expected Pong")
            except (EOFError, OSError, trio.ClosedResourceError) as error:
                await self._kill()  # reaps it first, so the reason can name its exit code
                description = f"{error or type(error).__name__}; {self._exit_text()}"
                return self._machine.exited(description, trio.current_time())
            log.info("model process ready | pid=%s device=%s segmenter=%s", self._pid(), first.device, first.segmenter)
            return self._machine.loaded(first.device, first.segmenter, trio.current_time())
        return self._machine.tick(trio.current_time())  # the load deadline passed

    def _inference_failed(self, reason: str) -> None:
        """Not ready from now on; SIGKILL at once (no reaping here): `run` sees the exit."""
        before = self._machine.phase
        self._machine.inference_failed(reason)
        self._log_if_lost(before)
        if self._process is not None and self._process.exitcode is None:
            self._process.kill()
        self._notify()

    # -- the supervisor's actions --------------------------------------------------------

    def _log_if_lost(self, before: Phase) -> None:
        """One error line per child lost (a ready one, or one that failed to start)."""
        after = self._machine.phase
        if after is not before and before in (Phase.READY, Phase.LOADING) and after is not Phase.READY:
            log.error("model process not ready: %s", self._machine.message)

    async def _carry_out(self, actions: list[Action]) -> None:
        for action in actions:
            if action is Action.KILL:
                await self._kill()
            else:
                self._spawn()
        self._notify()

    def _spawn(self) -> None:
        # Spawned from the main thread on purpose (every trio task runs there): the child's
        # parent-death signal fires when the spawning *thread* exits.
        parent_conn, child_conn = self._context.Pipe(duplex=True)
        process = self._context.Process(
            target=self._entry, args=(child_conn, self._config), name="hairgate-model", daemon=True
        )
        process.start()
        child_conn.close()  # else the parent's copy keeps the pipe open and a dead child gives no EOF
        self._process, self._conn = process, parent_conn
        log.info("model process started | pid=%s", process.pid)

    async def _kill(self) -> None:
        """SIGKILL and reap the child (if any) and close our end of its pipe; idempotent."""
        if self._process is not None and self._process.exitcode is None:
            self._process.kill()
        await self._reap()
        if self._conn is not None:
            trio.lowlevel.notify_closing(self._conn.fileno())  # wakes a waiter; its fd number is reused next
            self._conn.close()
            self._conn = None

    async def _reap(self) -> None:
        # In a thread: a SIGKILLed child can take long to exit (a GPU driver tearing down).
        if self._process is not None:
            await trio.to_thread.run_sync(self._process.join)

    def _notify(self) -> None:
        self._transition.set()
        self._transition = trio.Event()

    def _child_exited(self) -> bool:
        """Whether the child has exited, reaped or not: its sentinel is readable from then on."""
        return self._process is None or bool(multiprocessing.connection.wait([self._process.sentinel], timeout=0))

    def _pid(self) -> int | None:
        return self._process.pid if self._process else None

    def _exit_text(self) -> str:
        code = self._process.exitcode if self._process else None
        if code is None:
            return "still running"
        return f"killed by signal {-code}" if code < 0 else f"exit code {code}"


def _kind(name: str | None) -> ErrorType | None:
    """The child's kind by name; None when it named none (or one this host does not know)."""
    try:
        return None if name is None else ErrorType(name)
    except ValueError:
        return None


# The copies run in a thread so the event loop stays free while megabytes cross the pipe.
# They are never abandoned: an abandoned thread could still be reading when the descriptor
# is closed and its number reused by the next child's pipe. Both are short by construction
# (the child is idle when it is sent to; it is mid-reply when it is read from), so a
# cancellation or timeout takes effect in `wait_readable`, where the long wait is.


async def _send(conn: Connection, message: ParentMessage) -> None:
    await trio.to_thread.run_sync(conn.send, message)


async def _receive(conn: Connection) -> ChildMessage:
    await trio.lowlevel.wait_readable(conn.fileno())
    return await trio.to_thread.run_sync(conn.recv)
