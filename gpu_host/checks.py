"""The host's deep checks for `/health` (gpu_host.md § /health): free disk space and ComfyUI.

Both are measured off the request path by background tasks owned by the host's one
nursery (`gpu_host.main.serve`); `/health` and `/metrics` only read the last result, so a
probe costs nothing more than it did (seed 001 §7: a full disk kept a shallow `/health` at
200 and the gateway kept sending work to a machine that could not produce it).

- disk: every `DISK_CHECK_INTERVAL_SECONDS` (and at once when the threshold changes on
  SIGHUP) the free space of each filesystem the host writes to; below
  `gpu_host.min_free_disk_mb` on any of them: `low`, and `/health` is 503 until it is back.
  A threshold of 0 turns the check off (nothing is measured). A reading is bounded by
  `DISK_READ_TIMEOUT_SECONDS` (statvfs on a hung network mount never returns): one that
  does not come back in time counts as 0 MB free, no second reading is started while the
  hung one is still out (no thread piles up), and `/health` says how old the last
  completed reading is (`disk_age_seconds`).
- comfyui: `off` when no ComfyUI is configured; else the last answer of `GET /system_stats`,
  every `gpu_host.comfyui_probe_interval_seconds`: `ok` or `down` (never makes the host
  unready: the analysis still works; the gateway sends generation elsewhere). ComfyUI's
  output directory is measured with the disk: low space there counts as the disk's, but a
  directory that cannot be measured at all (missing, no permission) marks ComfyUI `down`,
  not the whole host.

Each change of either is logged once (a warning going bad, an info line coming back).
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import trio

from shared.contract import (
    CHECK_COMFYUI,
    CHECK_DISK,
    CHECK_DOWN,
    CHECK_LOW,
    CHECK_OFF,
    CHECK_OK,
    HEALTH_CHECKS_KEY,
    MSG_DISK_LOW,
)

log = logging.getLogger("gpu_host.checks")

DISK_CHECK_INTERVAL_SECONDS = 2.0
DISK_READ_TIMEOUT_SECONDS = 5.0
HEALTH_DISK_AGE_KEY = "disk_age_seconds"
_MB = 1024 * 1024


@dataclass(frozen=True)
class DiskReading:
    """The filesystem with the least free space among those measured, at the last measurement."""

    path: str
    free_mb: int
    measurable: bool = True


@dataclass(frozen=True)
class WrittenPaths:
    """Where the host writes (its own paths), and ComfyUI's output directory when configured."""

    host: list[Path]
    comfyui_output: Path | None = None


@dataclass(frozen=True)
class DiskReadings:
    """One measurement: the host's least free filesystem, and ComfyUI's output directory."""

    host: DiskReading
    comfyui_output: DiskReading | None


def written_paths(secrets_path: str | Path | None, comfyui_output_dir: str) -> WrittenPaths:
    """Where the host writes: its temp directory (uploads spooled by the form parser), the
    directory of its secrets file (`/admin/tokens` persists there) and, when configured,
    ComfyUI's output directory on this machine."""
    paths = [Path(tempfile.gettempdir())]
    if secrets_path:
        paths.append(Path(secrets_path).parent)
    return WrittenPaths(paths, Path(comfyui_output_dir) if comfyui_output_dir else None)


def least_free(paths: Iterable[Path]) -> DiskReading:
    """The lowest free space (for an unprivileged writer) among `paths`, one per filesystem.
    A path that cannot be measured (missing, no permission) counts as 0 MB free: the host
    cannot write there either."""
    readings = []
    seen_devices: set[int] = set()
    for path in paths:
        try:
            device = os.stat(path).st_dev
            if device in seen_devices:
                continue
            seen_devices.add(device)
            readings.append(DiskReading(str(path), shutil.disk_usage(path).free // _MB))
        except OSError:
            readings.append(DiskReading(str(path), 0, measurable=False))
    return min(readings, key=lambda reading: reading.free_mb)


def read_disks(paths: WrittenPaths) -> DiskReadings:
    comfyui = None if paths.comfyui_output is None else least_free([paths.comfyui_output])
    return DiskReadings(least_free(paths.host), comfyui)


class HostChecks:
    """The last result of each deep check; `run_disk` and `run_comfyui` keep them current."""

    def __init__(
        self,
        paths: WrittenPaths,
        min_free_disk_mb: int,
        *,
        comfyui_probe: Callable[[], Awaitable[str | None]] | None = None,
        comfyui_probe_interval_seconds: float = 10.0,
        disk_interval_seconds: float = DISK_CHECK_INTERVAL_SECONDS,
        disk_read_timeout_seconds: float = DISK_READ_TIMEOUT_SECONDS,
    ) -> None:
        """`comfyui_probe`: None when ComfyUI answers, else why not (None: not configured)."""
        self._paths = paths
        self._min_free_mb = min_free_disk_mb
        self._probe = comfyui_probe
        self._probe_interval = comfyui_probe_interval_seconds
        self._disk_interval = disk_interval_seconds
        self._disk_read_timeout = disk_read_timeout_seconds
        self.disk: DiskReading | None = None  # None until the first measurement
        self.disk_read_at: float | None = None  # trio clock of the last completed reading
        self.comfyui_output_unmeasurable = False
        self._reading_out = False  # a reading's thread has not come back (a hung mount)
        self.comfyui = CHECK_OFF if comfyui_probe is None else CHECK_DOWN  # down until it first answers
        self._measure_now = trio.Event()
        self._probed = False  # a first failed probe is logged too (the state starts as down)
        self._logged_low = False  # what the log said last: each change is logged once

    @property
    def disk_low(self) -> bool:
        return self.disk is not None and self.disk.free_mb < self._min_free_mb

    def disk_message(self) -> str | None:
        """Why `/health` is 503 for the disk, or None."""
        if self.disk is None or not self.disk_low:
            return None
        return MSG_DISK_LOW.format(free_mb=self.disk.free_mb, needed_mb=self._min_free_mb)

    def snapshot(self) -> dict[str, str]:
        """`/health`'s `checks`."""
        comfyui = CHECK_DOWN if self.comfyui != CHECK_OFF and self.comfyui_output_unmeasurable else self.comfyui
        return {CHECK_DISK: CHECK_LOW if self.disk_low else CHECK_OK, CHECK_COMFYUI: comfyui}

    def health_fields(self) -> Mapping[str, object]:
        """What `/health` shows of the checks: their states, and how old the disk's reading is."""
        age = None if self.disk_read_at is None else round(trio.current_time() - self.disk_read_at, 1)
        return {HEALTH_CHECKS_KEY: self.snapshot(), HEALTH_DISK_AGE_KEY: age}

    def set_min_free_disk_mb(self, megabytes: int) -> None:
        """A reloaded threshold (SIGHUP): measured against at once."""
        if megabytes != self._min_free_mb:
            log.info("gpu_host.min_free_disk_mb reloaded | was=%d now=%d", self._min_free_mb, megabytes)
            self._min_free_mb = megabytes
            self._measure_now.set()

    async def run_disk(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Measure now, `started()`, then every few seconds until cancelled."""
        await self._measure_disk()
        task_status.started()
        while True:
            with trio.move_on_after(self._disk_interval):
                await self._measure_now.wait()
            self._measure_now = trio.Event()
            await self._measure_disk()

    async def run_comfyui(self) -> None:
        """Probe ComfyUI now and every `comfyui_probe_interval_seconds` until cancelled (no-op when off)."""
        if self._probe is None:
            return
        while True:
            problem = await self._probe()
            state = CHECK_DOWN if problem else CHECK_OK
            if state != self.comfyui or (problem and not self._probed):
                if problem:
                    log.warning("ComfyUI down: /health checks.comfyui=down | reason=%s", problem)
                else:
                    log.info("ComfyUI reachable: /health checks.comfyui=ok")
            self.comfyui, self._probed = state, True
            await trio.sleep(self._probe_interval)

    async def _measure_disk(self) -> None:
        if self._min_free_mb == 0:  # the check is off
            self.disk, self.disk_read_at, self._logged_low = None, None, False
            self.comfyui_output_unmeasurable = False
            return
        readings = await self._read_disks()
        if readings is None:
            path = ", ".join(str(p) for p in self._paths.host)
            self.disk = DiskReading(path, 0, measurable=False)  # cannot measure: cannot write either
        else:
            self.disk, self.disk_read_at = readings.host, trio.current_time()
            self._set_comfyui_output(readings.comfyui_output)
        was_low, self._logged_low = self._logged_low, self.disk_low
        if self.disk_low and not was_low:
            log.error(
                "disk space low: /health answers 503 until it is back | path=%s free_mb=%d min_free_disk_mb=%d",
                self.disk.path, self.disk.free_mb, self._min_free_mb,
            )  # fmt: skip
        elif was_low and not self.disk_low:
            log.info(
                "disk space back: /health ready again | path=%s free_mb=%d min_free_disk_mb=%d",
                self.disk.path, self.disk.free_mb, self._min_free_mb,
            )  # fmt: skip

    async def _read_disks(self) -> DiskReadings | None:
        """One reading in a thread (statvfs on a hung mount must not stop the event loop),
        or None: it did not come back within the timeout, or an earlier one still has not."""
        if self._reading_out:
            return None
        self._reading_out = True
        outcome: list[DiskReadings] = []

        def read() -> None:
            try:
                outcome.append(read_disks(self._paths))
            finally:
                self._reading_out = False  # a plain store: read by the event loop's next round

        with trio.move_on_after(self._disk_read_timeout):
            await trio.to_thread.run_sync(read, abandon_on_cancel=True)
        if not outcome:
            log.error("disk reading timed out after %g s (a hung mount?): counted as 0 MB free | paths=%s",
                      self._disk_read_timeout, [str(p) for p in self._paths.host])  # fmt: skip
            return None
        return outcome[0]

    def _set_comfyui_output(self, reading: DiskReading | None) -> None:
        """ComfyUI's output directory: unmeasurable marks ComfyUI down; its free space counts
        as the disk's (it fills the same way)."""
        unmeasurable = reading is not None and not reading.measurable
        if unmeasurable != self.comfyui_output_unmeasurable:
            if unmeasurable:
                log.warning("ComfyUI output directory cannot be measured: /health checks.comfyui=down | path=%s",
                            reading.path if reading else "")  # fmt: skip
            else:
                log.info("ComfyUI output directory measurable again")
        self.comfyui_output_unmeasurable = unmeasurable
        if reading is not None and reading.measurable and self.disk is not None and reading.free_mb < self.disk.free_mb:
            self.disk = reading


def no_checks() -> HostChecks:
    """Checks that never report a problem (an app under test without the background tasks)."""
    return HostChecks(WrittenPaths([]), 0)
