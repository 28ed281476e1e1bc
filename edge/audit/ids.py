"""Execution ids: `exec_<unix ms, 13 digits>_<gateway id, 3 digits>_<sequence, 5 digits>` (seed 002 §4.2.1).

Sortable by time; unique across gateways with different `edge.audit.gateway_id`. The
sequence counts the ids of one millisecond and wraps after 99,999 (no gateway issues
that many per millisecond). The millisecond never goes back within one process (a clock
stepped back reuses the last one), so a process never repeats an id.
"""

from __future__ import annotations

import time
from collections.abc import Callable

SEQUENCE_LIMIT = 100_000


class ExecutionIds:
    def __init__(self, gateway_id: int, clock_ns: Callable[[], int] = time.time_ns) -> None:
        if not 0 <= gateway_id <= 999:
            raise ValueError("gateway_id must be 0-999")
        self._gateway = f"{gateway_id:03d}"
        self._clock_ns = clock_ns
        self._last_ms = 0
        self._head = ""  # "exec_<ms>_<gateway>_" of the current millisecond: formatted once per ms
        self._sequence = 0

    def next(self) -> str:
        now_ms = self._clock_ns() // 1_000_000
        if now_ms > self._last_ms:
            self._start(now_ms)
        else:
            self._sequence = (self._sequence + 1) % SEQUENCE_LIMIT
            if self._sequence == 0:  # 100,000 in one ms (or a clock stepped back): borrow the next ms
                self._start(self._last_ms + 1)
        return f"{self._head}{self._sequence:05d}"

    def _start(self, ms: int) -> None:
        self._last_ms, self._sequence = ms, 0
        self._head = f"exec_{ms:013d}_{self._gateway}_"
