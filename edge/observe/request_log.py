"""The request log: one JSON line per `/api/` request, written in batches, rotated by size.

Handlers call `record()` (no I/O, no await); a background task owned by the serving
nursery writes whatever has accumulated at most `flush_interval_seconds` later in one
thread hop, because a thread hop per request costs ~0.5 ms of latency. The same task
feeds each record to the `observers` (`/admin/stats`, the metrics), so that their cost is
not in any request's latency either. Entries carry
metadata only: never a token, a body or an image.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import trio

log = logging.getLogger("edge.request_log")

BACKUPS = 3  # request_log.jsonl.1 … .3


@dataclass(frozen=True)
class RequestRecord:
    """One line of the request log; `worker` is the pool index, never the URL."""

    ts: str
    request_id: str
    method: str
    path: str
    client_ip: str
    worker: int | None
    attempts: int
    queue_ms: float
    duration_ms: float
    http_status: int
    code: int | None
    bytes_in: int
    bytes_out: int
    idempotent_replay: bool = False
    rate_limited: bool = False
    early_refusal: bool = False  # busy at once: by the estimate it could not start within its queue wait
    failed_workers: tuple[int, ...] = ()  # indexes whose forward failed (retried elsewhere, or the last try)
    error_type: str | None = None  # the last failure kind a host named (gateway.md § Failure kinds)
    model_version: str | None = None  # what produced the answer (X-Model-Version); a replay: the original's


class RequestLog:
    """Batching, size-rotated JSON-lines writer; run `run()` in the serving nursery."""

    def __init__(
        self,
        path: str | Path,
        max_bytes: int,
        flush_interval_seconds: float = 0.5,
        observers: Sequence[Callable[[RequestRecord], None]] = (),
    ) -> None:
        self.path = Path(path)
        # Aggregates fed from the batch (stats, metrics): off the request's own path, and
        # behind the log by at most one flush interval.
        self._observers = tuple(observers)
        self._max_bytes = max_bytes
        self._flush_interval_seconds = flush_interval_seconds
        self._pending: list[RequestRecord] = []
        self._has_pending = trio.Event()

    def record(self, entry: RequestRecord) -> None:
        self._pending.append(entry)
        self._has_pending.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        try:
            while True:
                await self._has_pending.wait()
                await trio.sleep(self._flush_interval_seconds)  # let a batch gather
                await self.flush()
        finally:
            with trio.CancelScope(shield=True):  # shutdown: what was recorded still lands
                await self.flush()

    async def flush(self) -> None:
        batch, self._pending = self._pending, []
        self._has_pending = trio.Event()
        for entry in batch:
            for observe in self._observers:
                observe(entry)
        if batch:
            # Records are flat: vars() gives asdict()'s dict without its recursive copy,
            # which was the costliest part of logging a request.
            lines = "".join(json.dumps(vars(entry), ensure_ascii=False) + "\n" for entry in batch)
            await trio.to_thread.run_sync(self._append, lines.encode())

    def _append(self, data: bytes) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            size = self._size()
            if size > 0 and size + len(data) > self._max_bytes:
                self._rotate()
            _append_whole(self.path, data)
        except OSError as error:  # a full disk loses log lines, never requests
            log.error("请求日志写入失败 | 文件=%s | 错误=%s", self.path, error)

    def _size(self) -> int:
        try:
            return self.path.stat().st_size
        except FileNotFoundError:
            return 0

    def _rotate(self) -> None:
        for number in range(BACKUPS - 1, 0, -1):
            older = self.path.with_name(f"{self.path.name}.{number}")
            if older.exists():
                os.replace(older, self.path.with_name(f"{self.path.name}.{number + 1}"))
        os.replace(self.path, self.path.with_name(f"{self.path.name}.1"))


def _append_whole(path: Path, data: bytes) -> None:
    """Append `data` entirely or not at all: a line cut by a full disk is taken back.

    Otherwise the next batch would be appended onto the torn line and both records lost
    to every reader of the file. This process is the file's only writer.
    """
    descriptor = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        start = os.fstat(descriptor).st_size
        written = 0
        try:
            while written < len(data):
                written += os.write(descriptor, data[written:])
        except OSError:
            os.ftruncate(descriptor, start)
            raise
    finally:
        os.close(descriptor)
