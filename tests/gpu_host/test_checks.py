"""The deep checks (`gpu_host.checks`): what is measured, and ComfyUI's probe through the whole
in-process host (real Hypercorn, fake child) against a fake ComfyUI that really goes down."""

from __future__ import annotations

from pathlib import Path

import httpx
import trio

from gpu_host.checks import HostChecks, least_free
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
    checks = HostChecks([tmp_path], free_mb + 10**6, disk_interval_seconds=3600)
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
    async with running_host(tmp_path, settings) as host:
        async with httpx.AsyncClient(base_url=host.url, headers=auth(), verify=host.verify) as client:

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
