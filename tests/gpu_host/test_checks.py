"""The deep checks (`gpu_host.checks`): what is measured, and ComfyUI's probe through the whole
in-process host (real Hypercorn, fake child) against a fake ComfyUI that really goes down."""

from __future__ import annotations

import threading
from pathlib import Path

import httpx
import pytest
import trio

import gpu_host.checks
from gpu_host.checks import HostChecks, WrittenPaths, least_free
from tests.fakes.fake_comfyui import FakeComfyUI, SwitchableComfyUI
from tests.gpu_host.conftest import auth
from tests.gpu_host.inprocess import WAIT, host_settings, running_host


def test_one_reading_per_filesystem_and_an_unmeasurable_path_counts_as_full(tmp_path: Path) -> None:
    same_filesystem = [tmp_path, tmp_path / ".."]
    assert least_free(same_filesystem).path == str(tmp_path)  # the second is the same device: skipped
    missing = tmp_path / "no-such-dir"
    assert least_free([tmp_path, missing]).free_mb == 0 and least_free([tmp_path, missing]).path == str(missing)


async def test_below_the_threshold_is_low_with_the_message_and_a_reload_measures_at_once(tmp_path: Path) -> None:
    free_mb = least_free([tmp_path]).free_mb
    checks = HostChecks(WrittenPaths([tmp_path]), free_mb + 10**6, disk_interval_seconds=3600)
    async with trio.open_nursery() as nursery:
        await nursery.start(checks.run_disk)
        low, message = checks.snapshot(), checks.disk_message()
        checks.set_min_free_disk_mb(1)
        ok = checks.snapshot()
        checks.set_min_free_disk_mb(0)  # off: nothing is measured
        with trio.fail_after(WAIT):
            while checks.disk is not None:
                await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    assert low == {"disk": "low", "comfyui": "off"}
    assert message is not None and f"至少需要 {free_mb + 10**6} MB" in message
    assert ok["disk"] == "ok" and checks.snapshot()["disk"] == "ok"


async def test_comfyui_going_down_and_up_shows_in_health_and_never_makes_the_host_unready(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    comfyui = SwitchableComfyUI(FakeComfyUI(), nursery)
    url = await comfyui.up()
    settings = host_settings(comfyui_url=url, comfyui_probe_interval_seconds=0.05)
    async with (
        running_host(tmp_path, settings) as host,
        httpx.AsyncClient(base_url=host.url, headers=auth(), verify=host.verify) as client,
    ):

        async def health_once(comfyui_state: str) -> httpx.Response:
            with trio.fail_after(WAIT):  # a probe every 50 ms: the change shows within a few
                while True:
                    response = await client.get("/health")
                    if response.json()["checks"]["comfyui"] == comfyui_state:
                        return response
                    await trio.sleep(0.02)

        up = await health_once("ok")
        await comfyui.down()
        down = await health_once("down")
        await comfyui.up()
        again = await health_once("ok")
    assert up.status_code == down.status_code == again.status_code == 200
    assert comfyui.fake.system_stats_polls >= 2


async def test_a_hung_disk_reading_times_out_as_low_starts_no_second_thread_and_shows_its_age(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # statvfs on a hung network mount never returns: the check froze on it and /health kept
    # the last reading with no age
    hung, release = threading.Event(), threading.Event()
    reads: list[int] = []
    real_read = gpu_host.checks.read_disks

    def read(paths: WrittenPaths) -> gpu_host.checks.DiskReadings:
        reads.append(1)
        if not release.is_set():
            hung.set()
            release.wait(30)
        return real_read(paths)

    monkeypatch.setattr(gpu_host.checks, "read_disks", read)
    checks = HostChecks(WrittenPaths([tmp_path]), 1, disk_interval_seconds=0.05, disk_read_timeout_seconds=0.2)
    async with trio.open_nursery() as nursery:
        with trio.fail_after(WAIT):
            await nursery.start(checks.run_disk)  # the first reading timed out
        first = checks.snapshot(), checks.health_fields()["disk_age_seconds"]
        await trio.sleep(0.3)  # a few more rounds while the thread is still out
        reads_while_hung = len(reads)
        release.set()
        with trio.fail_after(WAIT):
            while checks.disk_low:
                await trio.sleep(0.02)
        nursery.cancel_scope.cancel()
    assert first == ({"disk": "low", "comfyui": "off"}, None), "no reading yet: low, and no age"
    assert reads_while_hung == 1, "no second thread while the first is hung"
    age = checks.health_fields()["disk_age_seconds"]
    assert isinstance(age, float) and age < 1


async def test_an_unmeasurable_comfyui_output_dir_marks_comfyui_down_not_the_host(tmp_path: Path) -> None:
    output = tmp_path / "comfyui-output"  # missing: ComfyUI cannot write its images there

    async def comfyui_answers() -> None:
        return None

    checks = HostChecks(WrittenPaths([tmp_path], output), 1, comfyui_probe=comfyui_answers, disk_interval_seconds=0.05)
    async with trio.open_nursery() as nursery:
        await nursery.start(checks.run_disk)
        nursery.start_soon(checks.run_comfyui)
        with trio.fail_after(WAIT):
            while checks.comfyui != "ok":
                await trio.sleep(0.01)
        missing = checks.snapshot(), checks.disk_message()
        output.mkdir()
        with trio.fail_after(WAIT):
            while checks.snapshot()["comfyui"] != "ok":
                await trio.sleep(0.02)
        nursery.cancel_scope.cancel()
    assert missing == ({"disk": "ok", "comfyui": "down"}, None), "the host stays in: the analysis works"
