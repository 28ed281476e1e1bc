"""The request log: batched writes off the event loop, JSON lines, size rotation."""

from __future__ import annotations

import errno
import json
import os
from dataclasses import replace
from pathlib import Path

import trio

from edge.observe.request_log import RequestLog, RequestRecord

RECORD = RequestRecord(
    ts="2026-11-29T00:00:00.000+00:00",
    request_id="r",
    method="POST",
    path="/api/v1/hair/measure",
    client_ip="127.0.0.1",
    worker=0,
    attempts=1,
    queue_ms=0.1,
    duration_ms=2.0,
    http_status=200,
    code=0,
    bytes_in=10,
    bytes_out=20,
)


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


async def test_records_land_after_the_flush_interval_in_one_batch(tmp_path: Path) -> None:
    # Real time: the write runs in a thread, which virtual time would jump past.
    log = RequestLog(tmp_path / "log" / "requests.jsonl", max_bytes=1 << 20, flush_interval_seconds=0.05)
    async with trio.open_nursery() as nursery:
        await nursery.start(log.run)
        for number in range(3):
            log.record(replace(RECORD, request_id=f"r{number}"))
        assert lines(log.path) == [], "record() does no I/O"
        with trio.fail_after(2):
            while not lines(log.path):
                await trio.sleep(0.01)
        assert [entry["request_id"] for entry in lines(log.path)] == ["r0", "r1", "r2"]
        log.record(replace(RECORD, request_id="last"))
        nursery.cancel_scope.cancel()  # shutdown still flushes
    assert lines(log.path)[-1]["request_id"] == "last"


async def test_rotates_by_size(tmp_path: Path) -> None:
    log = RequestLog(tmp_path / "requests.jsonl", max_bytes=1024)
    for batch in range(12):
        for _ in range(2):  # a batch of lines fits under max_bytes
            log.record(replace(RECORD, request_id=f"b{batch}"))
        await log.flush()
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["requests.jsonl", "requests.jsonl.1", "requests.jsonl.2", "requests.jsonl.3"]
    assert all(p.stat().st_size <= 1024 for p in tmp_path.iterdir())
    assert lines(log.path)[-1]["request_id"] == "b11"


async def test_a_full_disk_never_leaves_a_torn_line(tmp_path: Path, monkeypatch) -> None:
    request_log = RequestLog(tmp_path / "log.jsonl", max_bytes=1 << 20)
    request_log.record(RECORD)
    await request_log.flush()
    real_write = os.write

    def disk_fills_mid_batch(descriptor: int, data: bytes) -> int:
        if len(data) > 100:  # half the batch lands, then the disk is full
            real_write(descriptor, data[: len(data) // 2])
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(descriptor, data)

    monkeypatch.setattr(os, "write", disk_fills_mid_batch)
    for index in range(5):
        request_log.record(replace(RECORD, request_id=f"lost-{index}"))
    await request_log.flush()
    monkeypatch.setattr(os, "write", real_write)
    request_log.record(replace(RECORD, request_id="after"))
    await request_log.flush()
    # every line parses: the torn batch was taken back, the next record starts a line
    assert [entry["request_id"] for entry in lines(request_log.path)] == ["r", "after"]
