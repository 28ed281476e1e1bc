"""The annotation clean-up: the decision as a table, then real files, the loop and its errors."""

from __future__ import annotations

import base64
import logging
import os
from pathlib import Path

import pytest
import trio
import trio.testing

from edge.annotations.rewrite import ImageStore
from edge.annotations.static_cleanup import (
    TEMP_FILE_MAX_AGE_SECONDS,
    FileEntry,
    StaticCleanup,
    WriteCap,
    files_to_delete,
    sweep,
)
from shared.settings import StaticCleanupSettings
from tests.edge.test_rewrite import big_png

NOW = 1_800_000_000.0
HOUR = 3600.0
MB = 1024 * 1024


def png(name: str, size_mb: float, age_hours: float) -> FileEntry:
    return FileEntry(f"{name}.png", int(size_mb * MB), NOW - age_hours * HOUR)


A_OLD = png("a", 1, 80)
B_OLD = png("b", 1, 73)
C = png("c", 3, 10)
D = png("d", 3, 5)
E = png("e", 3, 1)
FRESH_TEMP = FileEntry(".f.png.tmp", 5 * MB, NOW - 1)
STALE_TEMP = FileEntry(".g.png.tmp", 5 * MB, NOW - TEMP_FILE_MAX_AGE_SECONDS - 1)
FOREIGN = FileEntry("README.txt", 50 * MB, NOW - 1000 * HOUR)


@pytest.mark.parametrize(
    ("entries", "max_age_hours", "max_total_mb", "expected"),
    [
        ([], 72, 10, []),
        ([C, D, E], 72, 10, []),  # young and under the cap: nothing
        ([E, A_OLD, C, B_OLD], 72, 100, [A_OLD, B_OLD]),  # by age, oldest first
        ([E, D, C], 72, 7, [C]),  # 9 MB > 7 MB: the oldest goes
        ([E, D, C], 72, 2, [C, D, E]),  # even the newest, when it alone exceeds the cap
        ([E, D, C, A_OLD], 72, 6, [A_OLD, C]),  # expired ones do not count toward the cap
        ([E, D, C], 72, 9, []),  # exactly at the cap stays
        ([FRESH_TEMP, E], 72, 1, [E]),  # a temp file being written is not touched nor counted
        ([STALE_TEMP, E], 72, 10, [STALE_TEMP]),  # an abandoned one goes
        ([FOREIGN, E], 72, 1, [E]),  # not ours: never deleted, not counted
        ([png("y", 1, 2), png("x", 1, 2)], 72, 1, [png("x", 1, 2)]),  # same mtime: by name
    ],
)
def test_files_to_delete(
    entries: list[FileEntry], max_age_hours: float, max_total_mb: float, expected: list[FileEntry]
) -> None:
    assert files_to_delete(entries, NOW, max_age_hours, max_total_mb) == expected


def write_png(directory: Path, name: str, size: int, age_hours: float) -> Path:
    path = directory / name
    path.write_bytes(b"\x89PNG" + b"\0" * (size - 4))
    os.utime(path, (NOW - age_hours * HOUR, NOW - age_hours * HOUR))
    return path


def cleanup_of(static_dir: Path, settings: StaticCleanupSettings) -> StaticCleanup:
    return StaticCleanup(static_dir, settings, trio.CapacityLimiter(1), wall_clock=lambda: NOW)


async def test_sweep_deletes_real_files_by_age_then_size(tmp_path: Path) -> None:
    directory = tmp_path / "annotations"
    directory.mkdir()
    expired = write_png(directory, "expired.png", 1000, 100)
    oldest = write_png(directory, "oldest.png", MB, 3)
    newer = write_png(directory, "newer.png", MB, 2)
    writing = write_png(directory, ".x.png.tmp", MB, 0)
    (directory / "planted").mkdir()  # not a regular file: never touched
    cleanup = cleanup_of(tmp_path, StaticCleanupSettings(max_age_hours=72, max_total_mb=1.5))
    result = await cleanup.sweep_once()
    assert result is not None and result.deleted == 2 and result.error is None
    assert not expired.exists() and not oldest.exists()
    assert newer.exists() and writing.exists() and (directory / "planted").is_dir()


async def test_no_directory_yet_is_not_an_error(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    result = await cleanup_of(tmp_path, StaticCleanupSettings()).sweep_once()
    assert result is not None and result.deleted == 0 and result.error is None
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


async def test_a_persistent_error_is_logged_once_and_recovery_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="edge.static_cleanup")
    (tmp_path / "annotations").write_text("a file where the directory should be")
    cleanup = cleanup_of(tmp_path, StaticCleanupSettings())
    for _ in range(3):
        result = await cleanup.sweep_once()
        assert result is not None and result.error is not None
    errors = [r for r in caplog.records if r.name == "edge.static_cleanup" and r.levelno == logging.ERROR]
    assert len(errors) == 1 and "annotations" in errors[0].getMessage()
    (tmp_path / "annotations").unlink()
    (tmp_path / "annotations").mkdir()
    await cleanup.sweep_once()
    await cleanup.sweep_once()
    recovered = [r for r in caplog.records if r.name == "edge.static_cleanup" and "恢复" in r.getMessage()]
    assert len(recovered) == 1


async def test_run_sweeps_at_start_then_every_interval_with_current_settings(
    tmp_path: Path, autojump_clock: trio.abc.Clock
) -> None:
    directory = tmp_path / "annotations"
    directory.mkdir()
    expired = write_png(directory, "expired.png", 100, 100)
    five_hours = write_png(directory, "five.png", 100, 5)
    cleanup = cleanup_of(tmp_path, StaticCleanupSettings(interval_seconds=600, max_age_hours=72))
    send, receive = trio.open_memory_channel[float](10)
    sweep_once = cleanup.sweep_once

    async def observed_sweep() -> object:
        result = await sweep_once()
        await send.send(trio.current_time())
        return result

    cleanup.sweep_once = observed_sweep  # type: ignore[method-assign]
    async with trio.open_nursery() as nursery:
        started = trio.current_time()
        await nursery.start(cleanup.run)
        assert await receive.receive() == started
        assert not expired.exists() and five_hours.exists()
        await trio.testing.wait_all_tasks_blocked()  # the loop sleeps its 600 s now
        cleanup.reconfigure(StaticCleanupSettings(interval_seconds=60, max_age_hours=4))  # a reload
        assert await receive.receive() - started == 600  # the interval that was current then
        assert not five_hours.exists()
        third = await receive.receive()
        assert third - started == 660
        nursery.cancel_scope.cancel()


# --- the cap at write time (WriteCap) ------------------------------------------------------


def planted(folder: Path, sizes: list[int], first_mtime: float) -> list[str]:
    """Files of these sizes, oldest first, a minute apart."""
    folder.mkdir(parents=True, exist_ok=True)
    names = []
    for number, size in enumerate(sizes):
        name = f"{number:08d}-0000-4000-8000-000000000000.png"
        (folder / name).write_bytes(b"p" * size)
        os.utime(folder / name, (first_mtime + 60 * number,) * 2)
        names.append(name)
    return names


def test_files_the_sweep_deleted_are_given_up_before_any_live_one(tmp_path: Path) -> None:
    # the write cap counts from one scan: what the sweep deleted since must not make it
    # delete live files to make room (its count is never below what is there)
    folder = tmp_path / "annotations"
    names = planted(folder, [100 * 1024] * 10, NOW - 100 * HOUR)  # 1000 KiB, the five oldest will expire
    for name in names[5:]:
        os.utime(folder / name, (NOW - HOUR,) * 2)
    cap = WriteCap(folder, max_total_mb=1)
    cap.reserve(0)  # the first write scans
    sweep(folder, NOW, StaticCleanupSettings(max_age_hours=72, max_total_mb=1))
    assert sorted(os.listdir(folder)) == names[5:]
    cap.reserve(500 * 1024)  # fits beside the five left, by the count after giving up the swept
    assert sorted(os.listdir(folder)) == names[5:], "no live file deleted"
    cap.reserve(100 * 1024)
    assert sorted(os.listdir(folder)) == names[6:], "then the oldest live one"


async def test_answers_written_side_by_side_stay_under_the_cap(tmp_path: Path) -> None:
    store = ImageStore(tmp_path / "static", "http://gateway.test", trio.CapacityLimiter(4), max_total_mb=1)
    planted(store.directory, [50 * 1024] * 20, NOW - HOUR)  # 1000 KiB already
    body = {"image_base64": base64.b64encode(big_png(100 * 1024)).decode()}

    async def one_answer() -> None:
        await store.write(dict(body), await store.decode(body))

    async with trio.open_nursery() as nursery:
        for _ in range(12):
            nursery.start_soon(one_answer)
    sizes = [path.stat().st_size for path in store.directory.iterdir()]
    assert sum(sizes) <= MB and len(sizes) == 10 and sizes.count(len(big_png(100 * 1024))) == 10, (
        "the newest ten answers fit, nothing older"
    )
