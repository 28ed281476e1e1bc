"""Endpoint 99 on the gateway: real face-worker processes (spawned), real MediaPipe, real photos.

No GPU host exists in any of these tests: the endpoint never touches the pool. Starting a
worker costs ~1-3 s (spawn, MediaPipe), so the default run starts one pool and asks it
everything; the tests that need more workers or blocked jobs are `slow`.
"""

from __future__ import annotations

import base64
import json
import os
import struct
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import trio
import trio.testing
from PIL import Image
from skimage import data

from edge.local.face_workers import FaceWorkers
from edge.local.special_points import RETRY_AFTER_SECONDS, SpecialPoints
from shared.contract import MSG_BACKEND_BUSY, Code
from shared.settings import AnalysisSettings
from tests.analysis.conftest import SPECIAL_POINT_NAMES
from tests.analysis.images import encode, no_face_photo, side_by_side

LIMITS = AnalysisSettings()


def multipart(image: bytes, **fields: str) -> tuple[bytes, str]:
    """A client's multipart body and its Content-Type, as httpx writes them."""
    request = httpx.Request("POST", "http://gateway.test/", files={"image": ("photo", image)}, data=fields)
    return request.read(), request.headers["content-type"]


def upscaled(rgb: np.ndarray, factor: int) -> np.ndarray:
    height, width = rgb.shape[:2]
    return np.asarray(Image.fromarray(rgb).resize((width * factor, height * factor), Image.Resampling.LANCZOS))


@pytest.fixture
async def special_points(nursery: trio.Nursery) -> AsyncIterator[SpecialPoints]:
    workers = FaceWorkers(1, queue_wait_seconds=60)
    await nursery.start(workers.run)
    yield SpecialPoints(workers, LIMITS)


async def test_points_of_a_real_face_and_the_hosts_refusals(special_points: SpecialPoints) -> None:
    photo = upscaled(data.astronaut(), 2)  # 1024×1024, ~1 MP
    answer = await special_points.answer(*multipart(encode(photo, "JPEG", quality=92)), request_id="r-1")
    envelope = answer.envelope
    assert (envelope["code"], envelope["request_id"], answer.retry_after) == (0, "r-1", None)
    assert envelope["data"]["image"] == {"width": 1024, "height": 1024}
    points = envelope["data"]["points"]
    assert set(points) == SPECIAL_POINT_NAMES
    # Anatomy, top to bottom along the midline and left to right across it.
    heights = [points[name][1] for name in ("trichion", "glabella", "nasion", "subnasale", "menton")]
    assert heights == sorted(heights)
    assert points["left_temple"][0] < points["left_iris_center"][0] < points["nasion"][0]
    assert points["nasion"][0] < points["right_iris_center"][0] < points["right_temple"][0]
    # The astronaut's eyes, read off the 512 px original (~203, 101 and ~247, 104), doubled.
    assert points["left_iris_center"] == pytest.approx([407, 202], abs=8)
    assert points["right_iris_center"] == pytest.approx([493, 207], abs=8)

    as_json = json.dumps({"image_base64": base64.b64encode(encode(photo, "PNG")).decode()}).encode()
    answer = await special_points.answer(as_json, "application/json", "r-2")
    from_json = answer.envelope["data"]["points"]
    assert all(from_json[name] == pytest.approx(points[name], abs=1.5) for name in SPECIAL_POINT_NAMES)  # PNG, not JPEG

    refusals = {
        Code.NO_FACE: multipart(encode(upscaled(no_face_photo(), 2), "JPEG")),
        Code.MULTIPLE_FACES: multipart(encode(side_by_side(photo, photo), "JPEG")),
        Code.UNSUPPORTED_IMAGE: multipart(b"GIF89a not really an image at all"),
        Code.BAD_RESOLUTION: multipart(encode(data.astronaut()[:400], "PNG")),  # 400 px short side
        Code.INVALID_PARAMETER: (b'{"image_base64": "@@@"}', "application/json"),
    }
    for code, (body, content_type) in refusals.items():
        answer = await special_points.answer(body, content_type, "r-3")
        assert (answer.envelope["code"], answer.envelope["data"], answer.retry_after) == (code, None, None), code
        assert answer.envelope["message"], code
    answer = await special_points.answer(*multipart(b"x" * (LIMITS.max_image_bytes + 1)), "r-4")
    assert answer.envelope["code"] == Code.TOO_LARGE
    answer = await special_points.answer(b"", "text/plain", "r-5")
    assert answer.envelope["code"] == Code.INVALID_PARAMETER
    assert "text/plain" in answer.envelope["message"]


def imported(module: str) -> bool:
    """A job for the workers: whether its process has imported `module` already."""
    return module in sys.modules


async def test_a_workers_first_job_finds_the_analysis_imported() -> None:
    # the import (SciPy, OpenCV: ~1.2 s on 2 cores) is the worker's start, not its first answer's
    workers = FaceWorkers(1, queue_wait_seconds=60, start_at_start=False)  # this job is the first
    async with trio.open_nursery() as nursery:
        await nursery.start(workers.run)
        assert await workers.call("r", imported, "analysis.endpoints")
        nursery.cancel_scope.cancel()


# --- a pool held busy: jobs that wait on a named pipe the test writes to -------------


def started_then_blocked(started: str, gate: str) -> int:
    """A job for the workers: announce its pid on `started`, then wait for a byte on `gate`."""
    with open(started, "wb", buffering=0) as pipe:
        pipe.write(struct.pack("<q", os.getpid()))  # 8 bytes: one atomic FIFO write
    with open(gate, "rb", buffering=0) as pipe:  # unbuffered: take one byte, leave the rest
        pipe.read(1)
    return os.getpid()


class BlockedJobs:
    """Named pipes, held open read-write by the test so no open() on either side blocks:
    a job announces itself on `started` and runs until `release()` writes it a byte."""

    def __init__(self, directory: Path) -> None:
        self.started, self.gate = str(directory / "started"), str(directory / "gate")
        os.mkfifo(self.started)
        os.mkfifo(self.gate)
        self._started_fd = os.open(self.started, os.O_RDWR)
        self._gate_fd = os.open(self.gate, os.O_RDWR)

    async def wait_started(self) -> int:
        """The pid of the next job to start (abandoned, not hung, if the test fails first)."""
        record = await trio.to_thread.run_sync(os.read, self._started_fd, 8, abandon_on_cancel=True)
        return struct.unpack("<q", record)[0]

    def release(self, jobs: int = 1) -> None:
        os.write(self._gate_fd, b"x" * jobs)

    def close(self) -> None:
        os.close(self._started_fd)
        os.close(self._gate_fd)


@pytest.fixture
def blocked_jobs(tmp_path: Path) -> Iterator[BlockedJobs]:
    jobs = BlockedJobs(tmp_path)
    yield jobs
    jobs.close()


@pytest.mark.slow
async def test_no_more_jobs_run_at_once_than_workers(blocked_jobs: BlockedJobs) -> None:
    workers = FaceWorkers(2, queue_wait_seconds=60)
    pids: list[int] = []

    async def call() -> None:
        pids.append(await workers.call("r", started_then_blocked, blocked_jobs.started, blocked_jobs.gate))

    async with trio.open_nursery() as nursery:
        await nursery.start(workers.run)
        async with trio.open_nursery() as calls:
            for _ in range(5):
                calls.start_soon(call)
            running = {await blocked_jobs.wait_started(), await blocked_jobs.wait_started()}
            await trio.testing.wait_all_tasks_blocked()
            stats = workers.statistics()
            assert (stats.running, stats.waiting) == (2, 3)
            assert len(running) == 2  # two jobs at once, in two processes
            blocked_jobs.release(5)
        assert len(pids) == 5 and set(pids) == running  # the same two processes ran all five
        nursery.cancel_scope.cancel()


@pytest.mark.slow
async def test_a_pool_busy_past_the_queue_wait_answers_1007_busy_with_retry_after(blocked_jobs: BlockedJobs) -> None:
    workers = FaceWorkers(1, queue_wait_seconds=0.5, start_at_start=False)  # the blocked job is the first
    special_points = SpecialPoints(workers, LIMITS)
    async with trio.open_nursery() as nursery:
        await nursery.start(workers.run)
        nursery.start_soon(workers.call, "r", started_then_blocked, blocked_jobs.started, blocked_jobs.gate)
        await blocked_jobs.wait_started()
        answer = await special_points.answer(*multipart(encode(data.astronaut(), "PNG")), "r-busy")
        assert (answer.envelope["code"], answer.envelope["message"]) == (Code.SYSTEM_ERROR, MSG_BACKEND_BUSY)
        assert answer.retry_after == RETRY_AFTER_SECONDS
        blocked_jobs.release()
        nursery.cancel_scope.cancel()
