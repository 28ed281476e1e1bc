"""The web side of the model child: start it, watch it, talk to it, replace it when it fails.

`ModelProcess` owns exactly one child at a time (spawn start method, one duplex Pipe).
Invariants:
- at most one inference is in flight (a `trio.Lock`); `/health` never takes that lock;
- the event loop never blocks on the pipe: waits are `wait_readable` on its descriptor,
  transfers run in a worker thread;
- a child that dies, or that exceeds `inference_timeout_seconds`, is SIGKILLed and replaced;
  the request that saw it gets 1007 and the state is `loading` until the new child is ready.
"""

from __future__ import annotations

import enum
import logging
import multiprocessing
from dataclasses import dataclass
from multiprocessing.connection import Connection
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
from shared.contract import MSG_INFERENCE_TIMED_OUT, MSG_MODEL_PROCESS_DIED, Code, ContractError

log = logging.getLogger("gpu_host.model")


class ModelState(enum.Enum):
    LOADING = "loading"  # a child is starting (first start or after a failure)
    READY = "ready"  # the child said Ready and answered a Ping
    FAILED = "error"  # the models cannot be loaded; needs an operator


class ModelUnavailable(Exception):
    """No ready child: the request was not run (the gateway may send it elsewhere)."""


@dataclass(frozen=True)
class ModelStatistics:
    """A snapshot for `/health` and the logs."""

    state: ModelState
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
        entry: ChildEntry = child.serve,
        restart_delay_seconds: float = 1.0,
        max_restart_delay_seconds: float = 30.0,
    ) -> None:
        self._config = config
        self._timeout = inference_timeout_seconds
        self._entry = entry
        self._restart_delay = restart_delay_seconds
        self._max_restart_delay = max_restart_delay_seconds
        self._context = multiprocessing.get_context("spawn")
        self._lock = trio.Lock()
        self._process: BaseProcess | None = None
        self._conn: Connection | None = None
        self._state = ModelState.LOADING
        self._message: str | None = None
        self._ready: Ready | None = None
        self._transition = trio.Event()
        self._failure_reason: str | None = None
        self._restarts = 0
        self._scope: trio.CancelScope | None = None

    # -- public surface ------------------------------------------------------------------

    def statistics(self) -> ModelStatistics:
        state, message = self._state, self._message
        if state is ModelState.READY and not self._child_alive():
            state, message = ModelState.LOADING, "model process exited; restarting"  # run() will notice
        ready = self._ready if state is ModelState.READY else None
        return ModelStatistics(
            state=state,
            message=message,
            device=ready.device if ready else None,
            segmenter=ready.segmenter if ready else None,
            busy=self._lock.locked(),
            pid=self._pid(),
            restarts=self._restarts,
        )

    async def wait_transition(self) -> None:
        """Return at the next state change (a spawn, ready, a failure: each restart counts)."""
        await self._transition.wait()

    async def wait_ready(self) -> None:
        """Return once a child is ready (immediately if one is)."""
        while self._state is not ModelState.READY:
            await self.wait_transition()

    async def infer(self, request_id: str, endpoint: str, image: bytes, options: dict[str, Any]) -> dict:
        """Run one endpoint in the child; its `data` dict, or ContractError / ModelUnavailable."""
        async with self._lock:
            if self._state is not ModelState.READY or self._conn is None:
                raise ModelUnavailable(self._message or self._state.value)
            conn = self._conn
            try:
                with trio.fail_after(self._timeout):
                    await _send(conn, Infer(request_id, endpoint, image, options))
                    reply = await _receive(conn)
            except trio.TooSlowError:
                self._fail(f"inference timed out after {self._timeout:g}s (request_id={request_id})")
                raise ContractError(Code.SYSTEM_ERROR, MSG_INFERENCE_TIMED_OUT.format(seconds=self._timeout)) from None
            except (EOFError, OSError, trio.ClosedResourceError):
                self._fail(f"model process died during an inference (request_id={request_id})")
                raise ContractError(Code.SYSTEM_ERROR, MSG_MODEL_PROCESS_DIED) from None
            except trio.Cancelled:
                # The caller went away (client disconnect, shutdown) with a reply still owed:
                # the next request would read it. A fresh child is the simple consistent state.
                self._fail(f"inference abandoned by its caller (request_id={request_id})")
                raise
        if isinstance(reply, Result) and reply.request_id == request_id:
            return reply.data
        if isinstance(reply, Failure) and reply.request_id == request_id:
            raise ContractError(Code(reply.code), reply.message)
        self._fail(f"protocol violation: got {type(reply).__name__} for request_id={request_id}")
        raise ContractError(Code.SYSTEM_ERROR, MSG_MODEL_PROCESS_DIED)

    def stop(self) -> None:
        """Stop supervising; `run` kills the child on its way out (server shutdown)."""
        if self._scope is not None:
            self._scope.cancel()  # not a direct kill: `run` may be waiting on the pipe's descriptor
        else:
            self._kill_child()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Keep one child alive; `started()` as soon as the first child is spawned (not loaded)."""
        with trio.CancelScope() as self._scope:
            try:
                self._spawn()
                task_status.started()
                failed_loads = 0
                while True:
                    if await self._load():
                        failed_loads = 0
                        await self._wait_child_exit()
                        async with self._lock:  # an inference still on the dead child's pipe ends first
                            self._note_exit()
                    elif self._state is ModelState.FAILED:
                        await trio.sleep_forever()  # a LoadFailed is not retried: it needs an operator
                    else:
                        # A child that dies while loading will likely die again: back off
                        # (a crash loop must not flood the log). A child that served and then
                        # died is replaced at once: recovery time = load time.
                        failed_loads += 1
                        await trio.sleep(min(self._restart_delay * 2 ** (failed_loads - 1), self._max_restart_delay))
                    self._spawn()
            finally:
                self._kill_child()

    # -- lifecycle -----------------------------------------------------------------------

    def _spawn(self) -> None:
        # Spawned from the main thread on purpose: the child's parent-death signal fires when
        # the spawning *thread* exits, and a worker thread may exit at any time.
        parent_conn, child_conn = self._context.Pipe(duplex=True)
        process = self._context.Process(
            target=self._entry, args=(child_conn, self._config), name="hairgate-model", daemon=True
        )
        process.start()
        child_conn.close()  # else the parent's copy keeps the pipe open and a dead child gives no EOF
        self._process, self._conn = process, parent_conn
        self._set_state(ModelState.LOADING, self._message)
        log.info("model process started | pid=%s", process.pid)

    async def _load(self) -> bool:
        """Wait for Ready + Pong; False when this child will not become ready."""
        assert self._conn is not None
        try:
            first = await _receive(self._conn)
            if isinstance(first, LoadFailed):
                log.error("model load failed: %s", first.message)
                self._kill_child()
                self._set_state(ModelState.FAILED, first.message)
                return False
            if not isinstance(first, Ready):
                raise EOFError(f"expected Ready, got {type(first).__name__}")
            with trio.fail_after(self._timeout):
                await _send(self._conn, Ping())
                if not isinstance(await _receive(self._conn), Pong):
                    raise EOFError("expected Pong")
        except (EOFError, OSError, trio.ClosedResourceError, trio.TooSlowError) as error:
            self._kill_child()  # reaps it first, so the reason can name its exit code
            reason = f"model process failed while loading ({error or type(error).__name__}; {self._exit_text()})"
            log.error("%s; restarting", reason)
            self._restarts += 1
            self._set_state(ModelState.LOADING, reason)
            return False
        self._ready = first
        self._failure_reason = None
        self._set_state(ModelState.READY, None)
        log.info("model process ready | pid=%s device=%s segmenter=%s", self._pid(), first.device, first.segmenter)
        return True

    async def _wait_child_exit(self) -> None:
        assert self._process is not None
        await trio.lowlevel.wait_readable(self._process.sentinel)

    def _note_exit(self) -> None:
        self._kill_child()  # reaps it; a no-op kill when it is already gone
        reason = self._failure_reason or f"model process exited unexpectedly ({self._exit_text()})"
        self._failure_reason = None
        self._restarts += 1
        log.error("%s; restarting", reason)
        self._set_state(ModelState.LOADING, reason)

    def _fail(self, reason: str) -> None:
        """An inference saw the child fail: mark not ready at once and kill it; `run` restarts it."""
        self._failure_reason = reason
        self._set_state(ModelState.LOADING, reason)
        if self._process is not None and self._process.is_alive():
            self._process.kill()

    def _kill_child(self) -> None:
        """SIGKILL and reap the child (if any) and close our end of its pipe; idempotent."""
        if self._process is not None:
            if self._process.is_alive():
                self._process.kill()
            self._process.join(timeout=5)
        if self._conn is not None:
            trio.lowlevel.notify_closing(self._conn.fileno())  # wakes a waiter; its fd number is reused next
            self._conn.close()
            self._conn = None

    def _set_state(self, state: ModelState, message: str | None) -> None:
        self._state, self._message = state, message
        self._transition.set()
        self._transition = trio.Event()

    def _child_alive(self) -> bool:
        return self._process is not None and self._process.is_alive()

    def _pid(self) -> int | None:
        return self._process.pid if self._process else None

    def _exit_text(self) -> str:
        code = self._process.exitcode if self._process else None
        if code is None:
            return "still running"
        return f"killed by signal {-code}" if code < 0 else f"exit code {code}"


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
