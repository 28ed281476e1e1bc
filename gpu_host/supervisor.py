"""The model child's life as a pure state machine: loading, ready, replaced, waiting, failed.

No I/O and no trio (like `edge.pool`): every event takes `now` (seconds on any monotonic
clock) and returns the actions the I/O layer (`gpu_host.model_process`) must carry out, in
order, so tests are tables of (state, event) -> state, actions.

    LOADING    a child was spawned and is loading its models, until `deadline`
    READY      it said Ready and answered a Ping
    REPLACING  a ready child failed an inference and was killed; respawned once it exited
    WAITING    the last start failed; the next one is spawned at `deadline` (backoff)
    FAILED     the models cannot be loaded (LoadFailed): needs an operator, never retried

Invariants:
- a child that served and then died is replaced at once (recovery time = load time); a
  child that failed to start is replaced after a backoff that doubles per failure in a row,
  so a crash loop cannot flood the log;
- every transition away from READY says why in `message`, which `/health` shows.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass


class Phase(enum.Enum):
    LOADING = "loading"
    READY = "ready"
    REPLACING = "replacing"
    WAITING = "waiting"
    FAILED = "error"


class Action(enum.Enum):
    KILL = "kill"  # SIGKILL the child if it still runs, reap it, close its pipe (idempotent)
    SPAWN = "spawn"  # start a fresh child


@dataclass(frozen=True)
class Backoff:
    """Delay before the n-th start in a row that failed: first, doubling, at most `max`."""

    first_seconds: float = 1.0
    max_seconds: float = 30.0

    def delay(self, failures_in_a_row: int) -> float:
        return min(self.first_seconds * 2 ** (failures_in_a_row - 1), self.max_seconds)


class Supervisor:
    """Where the model child is in its life; mutated only through the event methods."""

    def __init__(self, load_timeout_seconds: float, backoff: Backoff = Backoff()) -> None:
        self.load_timeout_seconds = load_timeout_seconds
        self.backoff = backoff
        self.phase = Phase.LOADING
        self.message: str | None = None  # why it is not ready, when it is not
        self.deadline = math.inf  # LOADING: the load deadline; WAITING: the next spawn
        self.device: str | None = None
        self.segmenter: str | None = None
        self.restarts = 0
        self.failed_starts = 0  # in a row; reset by a successful load

    @property
    def ready(self) -> bool:
        return self.phase is Phase.READY

    # -- events --------------------------------------------------------------------------

    def start(self, now: float) -> list[Action]:
        """Supervision begins: spawn the first child."""
        return self._spawn(now)

    def loaded(self, device: str, segmenter: str, now: float) -> list[Action]:
        """The child said Ready and answered a Ping."""
        if self.phase is not Phase.LOADING:
            return []
        self.phase, self.message, self.deadline = Phase.READY, None, math.inf
        self.device, self.segmenter = device, segmenter
        self.failed_starts = 0
        return []

    def refused(self, message: str) -> list[Action]:
        """The child said LoadFailed: the settings or the files are wrong; retrying cannot help."""
        self.phase, self.message, self.deadline = Phase.FAILED, message, math.inf
        return [Action.KILL]

    def exited(self, description: str, now: float) -> list[Action]:
        """The child exited or its pipe broke; `description` says how (e.g. its exit code)."""
        if self.phase is Phase.READY:
            self.restarts += 1
            self.message = f"model process exited unexpectedly ({description})"
            return [Action.KILL, *self._spawn(now)]
        if self.phase is Phase.REPLACING:  # the kill we asked for took effect; keep its reason
            self.restarts += 1
            return [Action.KILL, *self._spawn(now)]
        if self.phase is Phase.LOADING:
            return self._start_failed(f"model process failed while loading ({description})", now)
        return []  # WAITING or FAILED: that child was already given up on

    def inference_failed(self, reason: str) -> list[Action]:
        """An inference timed out or broke the pipe: the child must go (never for a caller that left)."""
        if self.phase is not Phase.READY:
            return []
        self.phase, self.message = Phase.REPLACING, reason
        return [Action.KILL]

    def tick(self, now: float) -> list[Action]:
        """Time passed: a load over its deadline is given up on; a backoff that ended spawns."""
        if now < self.deadline:
            return []
        if self.phase is Phase.LOADING:
            return self._start_failed(f"model load timed out after {self.load_timeout_seconds:g}s", now)
        if self.phase is Phase.WAITING:
            return self._spawn(now)
        return []

    # -- helpers -------------------------------------------------------------------------

    def _spawn(self, now: float) -> list[Action]:
        self.phase, self.deadline = Phase.LOADING, now + self.load_timeout_seconds
        self.device = self.segmenter = None
        return [Action.SPAWN]

    def _start_failed(self, reason: str, now: float) -> list[Action]:
        self.restarts += 1
        self.failed_starts += 1
        self.phase, self.message = Phase.WAITING, reason
        self.deadline = now + self.backoff.delay(self.failed_starts)
        return [Action.KILL]
