"""`GET /admin/stats` (gateway.md § Request log and stats): aggregates of the request log, in memory.

`record()` is called for every request-log entry (a few microseconds: counters and two
samples per window); `snapshot()` answers the endpoint without reading the log. Two
windows: since start, and the last hour as 60 one-minute slots merged on demand.

Percentiles are exact while a window holds few samples (up to `EXACT_SAMPLES` per path,
nearest rank: `shared.percentiles`), so one slow request among ten is the p99, not lost
to a sketch's rank rounding down; beyond that they come from a DDSketch (1 % relative
accuracy, at most `_SKETCH_BINS` bins), clamped to the exact maximum, which is reported
too: `max` is never below `p99`. Memory is bounded whatever the traffic: a fixed number
of samples then a fixed-size sketch, paths told apart only when they are the gateway's
endpoints (`endpoint_label`: anything else counts as "other", so junk `/api/…` paths can
neither grow it nor push a real endpoint out, and no raw NUL or undecodable byte becomes a
key), and workers are the configured indexes. `by_worker.failed` counts every failed
forward, also one retried elsewhere.
"""

from __future__ import annotations

import time
from array import array
from collections import Counter
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from ddsketch import LogCollapsingLowestDenseDDSketch

from edge.observe.request_log import RequestRecord
from edge.pool.scheduling import QUEUE_CLASSES, all_fast, queue_class
from shared.contract import Code
from shared.contract.endpoints import AnsweredBy, answered_by
from shared.percentiles import percentiles

OTHER_PATHS = "other"
# The gateway passes every `/api/` route it serves (`shared.contract.endpoints.api_paths`).
DEFAULT_KNOWN_PATHS = frozenset(endpoint.path for endpoint in answered_by(AnsweredBy.GPU_HOST))
NO_CODE = "none"  # a response that carried no envelope code
EXACT_SAMPLES = 2048  # per path and window: beyond this, the sketch answers
_RELATIVE_ACCURACY = 0.01
_SKETCH_BINS = 2048
_SLOT_SECONDS = 60
_SLOTS = 60  # one hour of one-minute slots


def endpoint_label(path: str, known_paths: Collection[str]) -> str:
    """The path as a stats key and metric label: itself for a known endpoint, "other" for
    anything else (whatever arrived first)."""
    return path if path in known_paths else OTHER_PATHS


def _sketch() -> LogCollapsingLowestDenseDDSketch:
    return LogCollapsingLowestDenseDDSketch(relative_accuracy=_RELATIVE_ACCURACY, bin_limit=_SKETCH_BINS)


class _Samples:
    """One quantity's distribution: the samples themselves while few, a sketch always, the max."""

    def __init__(self) -> None:
        self._exact: array[float] | None = array("d")  # None once there were too many
        self._sketch = _sketch()
        self._max = 0.0

    def add(self, value: float) -> None:
        self._sketch.add(value)
        self._max = max(self._max, value)
        if self._exact is not None:
            if len(self._exact) < EXACT_SAMPLES:
                self._exact.append(value)
            else:
                self._exact = None

    def merge(self, other: _Samples) -> None:
        self._sketch.merge(other._sketch)
        self._max = max(self._max, other._max)
        if (
            self._exact is not None
            and other._exact is not None
            and len(self._exact) + len(other._exact) <= EXACT_SAMPLES
        ):
            self._exact.extend(other._exact)
        else:
            self._exact = None

    def report(self, **fractions: float) -> dict[str, float | None]:
        """Each named percentile and `max`, in the samples' unit; all None when there is none."""
        if self._sketch.count == 0:
            return {**{name: None for name in fractions}, "max": None}
        if self._exact is not None:
            values = percentiles(self._exact, *fractions.values())
        else:  # a sketch's estimate may overshoot by its accuracy: never past the real max
            values = [min(self._sketch.get_quantile_value(q) or 0.0, self._max) for q in fractions.values()]
        return {
            **{name: round(value, 2) for name, value in zip(fractions, values, strict=True)},
            "max": round(self._max, 2),
        }


@dataclass
class _PathStats:
    count: int = 0
    codes: Counter[str] = field(default_factory=Counter)
    latency_ms: _Samples = field(default_factory=_Samples)


@dataclass
class _WorkerStats:
    served: int = 0
    failed: int = 0


@dataclass
class _Window:
    requests: int = 0
    by_path: dict[str, _PathStats] = field(default_factory=dict)
    by_worker: dict[int, _WorkerStats] = field(default_factory=dict)
    queue_wait_ms: _Samples = field(default_factory=_Samples)
    # gateway.md § Scheduling: the same wait for fast and for slow (`slow_paths`) requests
    queue_wait_ms_by_class: dict[str, _Samples] = field(default_factory=lambda: {c: _Samples() for c in QUEUE_CLASSES})
    replays: int = 0
    rate_limited: int = 0

    def add(self, entry: RequestRecord, path: str, request_class: str) -> None:
        self.requests += 1
        stats = self.by_path.get(path)
        if stats is None:
            stats = self.by_path[path] = _PathStats()
        stats.count += 1
        stats.codes[NO_CODE if entry.code is None else str(entry.code)] += 1
        stats.latency_ms.add(max(entry.duration_ms, 0.0))
        self.queue_wait_ms.add(max(entry.queue_ms, 0.0))
        self.queue_wait_ms_by_class[request_class].add(max(entry.queue_ms, 0.0))
        for index in entry.failed_workers:  # forwards that failed: retried elsewhere, or the last try
            self._worker(index).failed += 1
        if entry.worker is not None and entry.worker not in entry.failed_workers:
            worker = self._worker(entry.worker)
            if _worker_failed(entry):
                worker.failed += 1
            else:
                worker.served += 1
        self.replays += entry.idempotent_replay
        self.rate_limited += entry.rate_limited

    def _worker(self, index: int) -> _WorkerStats:
        worker = self.by_worker.get(index)
        if worker is None:
            worker = self.by_worker[index] = _WorkerStats()
        return worker

    def merge(self, other: _Window) -> None:
        self.requests += other.requests
        for path, theirs in other.by_path.items():
            ours = self.by_path.setdefault(path, _PathStats())
            ours.count += theirs.count
            ours.codes.update(theirs.codes)
            ours.latency_ms.merge(theirs.latency_ms)
        for index, worker in other.by_worker.items():
            mine = self.by_worker.setdefault(index, _WorkerStats())
            mine.served += worker.served
            mine.failed += worker.failed
        self.queue_wait_ms.merge(other.queue_wait_ms)
        for name, samples in other.queue_wait_ms_by_class.items():
            self.queue_wait_ms_by_class[name].merge(samples)
        self.replays += other.replays
        self.rate_limited += other.rate_limited

    def report(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "by_path": {
                path: {
                    "count": stats.count,
                    "codes": dict(stats.codes),
                    "latency_ms": stats.latency_ms.report(p50=0.5, p95=0.95, p99=0.99),
                }
                for path, stats in self.by_path.items()
            },
            "by_worker": {
                str(index): {"served": worker.served, "failed": worker.failed}
                for index, worker in sorted(self.by_worker.items())
            },
            "queue_wait_ms": self.queue_wait_ms.report(p50=0.5, p99=0.99),
            "queue_wait_ms_by_class": {
                name: samples.report(p50=0.5, p99=0.99) for name, samples in self.queue_wait_ms_by_class.items()
            },
            "replays": self.replays,
            "rate_limited": self.rate_limited,
        }


def _worker_failed(entry: RequestRecord) -> bool:
    """The worker's attempt ended the request in a system error (its own 1007 or a broken answer)."""
    return entry.code == Code.SYSTEM_ERROR or entry.http_status >= 500


class RequestStats:
    """Since-start and last-hour aggregates; `now` is wall-clock seconds (time.time())."""

    def __init__(self, started_at: float | None = None, known_paths: Collection[str] = DEFAULT_KNOWN_PATHS) -> None:
        self.started_at = time.time() if started_at is None else started_at
        self._known_paths = frozenset(known_paths)
        self._since_start = _Window()
        self._slots: list[tuple[int, _Window] | None] = [None] * _SLOTS  # (minute number, its window)
        # Is this path slow (edge.dispatch.slow_paths)? The gateway sets it to the live setting.
        self.classify: Callable[[str], bool] = all_fast

    def record(self, entry: RequestRecord, now: float | None = None) -> None:
        minute = int((time.time() if now is None else now) // _SLOT_SECONDS)
        path = endpoint_label(entry.path, self._known_paths)
        request_class = queue_class(entry.path, self.classify)
        self._since_start.add(entry, path, request_class)
        self._slot(minute).add(entry, path, request_class)

    def _slot(self, minute: int) -> _Window:
        index = minute % _SLOTS
        slot = self._slots[index]
        if slot is None or slot[0] != minute:
            slot = self._slots[index] = (minute, _Window())
        return slot[1]

    def snapshot(self, now: float | None = None) -> dict[str, Any]:
        """The `/admin/stats` body."""
        minute = int((time.time() if now is None else now) // _SLOT_SECONDS)
        last_hour = _Window()
        for slot in self._slots:
            if slot is not None and minute - _SLOTS < slot[0] <= minute:
                last_hour.merge(slot[1])
        started = datetime.fromtimestamp(self.started_at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        return {"since_start": self._since_start.report(), "last_hour": last_hour.report(), "started_at": started}
