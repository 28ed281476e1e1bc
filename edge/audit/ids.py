"""Execution ids: `exec_<unix ms, 13 digits>_<gateway id, 3 digits>_<node, 12 hex>_<sequence, 5 digits>`.

Seed 002 §4.2.1's shape with a node part: 48 random bits drawn once per process. Two
gateways left at the default `edge.audit.gateway_id` (or given the same one) used to issue
the same ids, since each one's sequence starts again every millisecond; with the node they
differ without any configuration (two processes draw the same node about once in 2^47
pairs), and a restarted gateway never reuses its predecessor's ids either. The millisecond
comes first and every part has a fixed width, so the text order is the time order. The
sequence counts the ids of one millisecond and wraps after 99,999 (no gateway issues that
many per millisecond). The millisecond never goes back within one process (a clock stepped
back reuses the last one), so a process never repeats an id.
"""

from __future__ import annotations

import re
import secrets
import time
from collections.abc import Callable

SEQUENCE_LIMIT = 100_000
NODE_BYTES = 6  # 12 hex digits: the id stays 41 characters, well within VARCHAR(64)
_NODE = re.compile(rf"[0-9a-f]{{{NODE_BYTES * 2}}}")


def new_node() -> str:
    """A process's node part: random, drawn at start (nothing to configure, nothing shared)."""
    return secrets.token_hex(NODE_BYTES)


class ExecutionIds:
    """The ids of one gateway process; `node` is also what the audit rows it creates carry."""

    def __init__(self, gateway_id: int, clock_ns: Callable[[], int] = time.time_ns, *, node: str | None = None) -> None:
        if not 0 <= gateway_id <= 999:
            raise ValueError("gateway_id must be 0-999")
        self.node = new_node() if node is None else node
        if not _NODE.fullmatch(self.node):
            raise ValueError(f"node must be {NODE_BYTES * 2} lowercase hex digits")
        self._gateway = f"{gateway_id:03d}_{self.node}"
        self._clock_ns = clock_ns
        self._last_ms = 0
        self._head = ""  # "exec_<ms>_<gateway>_<node>_" of the current millisecond: formatted once per ms
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
