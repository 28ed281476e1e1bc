"""The annotation clean-up: keeps `<static_dir>/annotations/` bounded, at write time and by a sweep.

`WriteCap` holds `max_total_mb` when an answer's files are written: the oldest files go
first until they fit. A background task (`StaticCleanup`) sweeps every `interval_seconds`:
it deletes the PNGs older than `max_age_hours` and then, oldest first, as many more as it
takes to bring the rest under `max_total_mb` (also what other gateways sharing the folder
wrote). What to delete is
decided by a pure function (`files_to_delete`) over (name, size, mtime) entries; listing
and unlinking run in a file thread. A temp file (`.<name>.tmp`, see `edge.annotations.rewrite`) is
left alone while it may still be being written; one older than `TEMP_FILE_MAX_AGE_SECONDS`
was abandoned by a crash and goes. Errors (a missing permission, a vanished directory) are
logged once per distinct error, never raised: the gateway keeps serving.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import trio

from shared.settings import StaticCleanupSettings

log = logging.getLogger("edge.static_cleanup")

ANNOTATIONS = "annotations"  # the folder under static_dir, and the URL path under /static
# A PNG is written in milliseconds; a temp file this old belongs to no running write.
TEMP_FILE_MAX_AGE_SECONDS = 3600.0
# One answer's images may take at most this share of max_total_mb: writing it never
# deletes more than this much of other clients' annotations (a larger one is refused).
ANSWER_SHARE = 0.25
_MB = 1024 * 1024


@dataclass(frozen=True)
class FileEntry:
    """One directory entry as the decision needs it."""

    name: str
    size: int
    mtime: float


@dataclass(frozen=True)
class SweepResult:
    """What one sweep did: files deleted, bytes freed, bytes left, and the first error if any."""

    deleted: int
    freed_bytes: int
    remaining_bytes: int
    error: str | None = None


def is_temp_file(name: str) -> bool:
    return name.startswith(".") and name.endswith(".tmp")


def files_to_delete(
    entries: Iterable[FileEntry], now: float, max_age_hours: float, max_total_mb: float
) -> list[FileEntry]:
    """The entries to delete, oldest first: expired PNGs, then the oldest beyond the size cap.

    Only `*.png` and abandoned temp files are ever chosen; anything else in the directory
    is not the gateway's and stays.
    """
    oldest_kept = now - max_age_hours * 3600
    doomed: list[FileEntry] = []
    kept: list[FileEntry] = []
    for entry in entries:
        if is_temp_file(entry.name):
            if entry.mtime < now - TEMP_FILE_MAX_AGE_SECONDS:
                doomed.append(entry)
        elif entry.name.endswith(".png"):
            (doomed if entry.mtime < oldest_kept else kept).append(entry)
    kept.sort(key=lambda entry: (entry.mtime, entry.name))
    excess = sum(entry.size for entry in kept) - max_total_mb * _MB
    for entry in kept:
        if excess <= 0:
            break
        doomed.append(entry)
        excess -= entry.size
    return sorted(doomed, key=lambda entry: (entry.mtime, entry.name))


def scan(directory: Path) -> list[FileEntry]:
    """Regular files directly in `directory` (no symlinks followed); none when it is missing."""
    entries: list[FileEntry] = []
    try:
        iterator = os.scandir(directory)
    except FileNotFoundError:
        return entries  # no annotation written yet
    with iterator:
        for item in iterator:
            try:
                status = item.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue  # deleted or renamed meanwhile
            if item.is_file(follow_symlinks=False):
                entries.append(FileEntry(item.name, status.st_size, status.st_mtime))
    return entries


def sweep(directory: Path, now: float, settings: StaticCleanupSettings) -> SweepResult:
    """One pass: scan, decide, unlink. Blocking; runs in a file thread. Never raises OSError."""
    try:
        entries = scan(directory)
    except OSError as error:
        return SweepResult(0, 0, 0, f"cannot list {directory}: {error.strerror or error}")
    doomed = files_to_delete(entries, now, settings.max_age_hours, settings.max_total_mb)
    total = sum(entry.size for entry in entries)
    deleted = freed = 0
    first_error: str | None = None
    for entry in doomed:
        try:
            (directory / entry.name).unlink(missing_ok=True)
        except OSError as error:
            first_error = first_error or f"cannot delete in {directory}: {error.strerror or error}"
            continue
        deleted += 1
        freed += entry.size
    return SweepResult(deleted, freed, total - freed, first_error)


class WriteCap:
    """`max_total_mb` at write time, for one `ImageStore`; blocking, called in file threads.

    It learns the folder by one scan (at the first write) and then counts what it writes,
    oldest first. Files deleted meanwhile by the sweep still count until they come up as
    the oldest (their unlink finds nothing), so the count is never below what is there:
    this gateway's writes never take the folder past the cap. Other gateways' writes to a
    shared folder are seen by the next sweep (or the next store, after a reload)."""

    def __init__(self, directory: Path, max_total_mb: float) -> None:
        self._directory = directory
        self._cap_bytes = int(max_total_mb * _MB)
        self._lock = threading.Lock()  # file threads write answers side by side
        self._files: deque[tuple[str, int]] | None = None  # (name, size), oldest first
        self._total = 0  # what the files count for, plus writes under way

    @property
    def per_answer_bytes(self) -> int:
        return int(self._cap_bytes * ANSWER_SHARE)

    def reserve(self, incoming_bytes: int) -> None:
        """Delete the oldest PNGs until `incoming_bytes` more fit under the cap, and count them."""
        with self._lock:
            if self._files is None:
                entries = sorted(
                    (entry for entry in scan(self._directory) if entry.name.endswith(".png")),
                    key=lambda entry: (entry.mtime, entry.name),
                )
                self._files = deque((entry.name, entry.size) for entry in entries)
                self._total = sum(entry.size for entry in entries)
            while self._files and self._total + incoming_bytes > self._cap_bytes:
                name, size = self._files.popleft()
                with contextlib.suppress(OSError):  # the sweep reports what it cannot delete
                    (self._directory / name).unlink(missing_ok=True)
                self._total -= size
            self._total += incoming_bytes

    def wrote(self, files: list[tuple[str, int]]) -> None:
        """The reserved write succeeded: these (name, size) are the newest files."""
        with self._lock:
            assert self._files is not None, "reserve() comes first"
            self._files.extend(files)

    def release(self, reserved_bytes: int) -> None:
        """The reserved write failed and its files were removed."""
        with self._lock:
            self._total -= reserved_bytes


class StaticCleanup:
    """The background task; `reconfigure` (a reload) sets what the next sweep and the next
    wait use."""

    def __init__(
        self,
        static_dir: str | Path,
        settings: StaticCleanupSettings,
        limiter: trio.CapacityLimiter,
        *,
        wall_clock: Callable[[], float] = time.time,  # file times are wall-clock times
    ) -> None:
        self.directory = Path(static_dir) / ANNOTATIONS
        self._settings = settings
        self._limiter = limiter
        self._wall_clock = wall_clock
        self._last_error: str | None = None

    def reconfigure(self, settings: StaticCleanupSettings) -> None:
        """Reloaded settings: a sleep under way keeps its length, the sweep after it uses them."""
        self._settings = settings

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Sweep at once (a gateway restarted after days), then every `interval_seconds`."""
        task_status.started()
        while True:
            await self.sweep_once()
            await trio.sleep(self._settings.interval_seconds)

    async def sweep_once(self) -> SweepResult | None:
        settings = self._settings
        try:
            result = await trio.to_thread.run_sync(
                sweep, self.directory, self._wall_clock(), settings, limiter=self._limiter
            )
        except Exception:  # housekeeping must never take the gateway down with it
            self._report_error("unexpected error", exc_info=True)
            return None
        if result.deleted:
            log.info(
                "标注图清理 | 删除=%d 释放=%.1fMB 剩余=%.1fMB",
                result.deleted,
                result.freed_bytes / _MB,
                result.remaining_bytes / _MB,
            )
        if result.error is not None:
            self._report_error(result.error)
        elif self._last_error is not None:
            log.info("标注图清理已恢复正常")
            self._last_error = None
        return result

    def _report_error(self, error: str, *, exc_info: bool = False) -> None:
        # Once per distinct error: a permission problem would otherwise log every interval.
        if error != self._last_error:
            log.error("标注图清理失败（网关继续服务）| %s", error, exc_info=exc_info)
            self._last_error = error
