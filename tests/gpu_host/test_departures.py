"""Deadlines and departures (issue 16, gpu_host.md § Deadlines and departures) through the whole
host in this process: the real Hypercorn and app (`tests.gpu_host.inprocess`), a fake child
that a test holds inside a request (FIFOs), a fake ComfyUI speaking ComfyUI's HTTP API.

A departure is the real thing: the client's connection closes mid-request, Hypercorn tells
the app, quart-trio cancels the handler. The real `hairgate gpu-host` cases (real models)
are in test_deep_health.py.
"""

from __future__ import annotations

import io
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import trio
from PIL import Image

from shared.contract import HEADER_REQUEST_TIMEOUT_MS, MSG_DEADLINE_TOO_SHORT, Code
from tests.fakes.fake_comfyui import FakeComfyUI, serve_fake_comfyui
from tests.gpu_host.conftest import MEASURE, Fifos, auth
from tests.gpu_host.fake_child import scripted
from tests.gpu_host.inprocess import WAIT, Host, host_settings, running_host

GROW = "/api/v1/hair/grow"


def _photo() -> bytes:
    pixels = np.random.default_rng(11).integers(0, 200, (32, 40, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def _upload(content: bytes) -> dict[str, Any]:
    return {"files": {"image": ("photo.png", content, "image/png")}}


async def _health(client: httpx.AsyncClient) -> dict[str, Any]:
    return (await client.get("/health")).json()


async def _until_idle(client: httpx.AsyncClient) -> None:
    # The host is another "machine" here: its busy flag is what the gateway polls, so poll it.
    with trio.fail_after(WAIT):
        while (await _health(client))["busy"]:
            await trio.sleep(0.02)


@pytest.fixture
async def client_of(tmp_path: Path) -> AsyncIterator[Any]:
    """`client_of(host)`: an httpx client for `host` carrying the token; closed at the end."""
    clients: list[httpx.AsyncClient] = []

    def make(host: Host) -> httpx.AsyncClient:
        clients.append(httpx.AsyncClient(base_url=host.url, headers=auth(), verify=host.verify, timeout=WAIT))
        return clients[-1]

    yield make
    for client in clients:
        await client.aclose()


async def test_too_little_time_given_is_a_1007_at_once_without_running_anything(
    tmp_path: Path, fifos: Fifos, client_of: Any
) -> None:
    async with running_host(tmp_path) as host:
        client = client_of(host)
        with trio.fail_after(5):  # a request that ran would block in the child until released
            refused = await client.post(MEASURE, headers={HEADER_REQUEST_TIMEOUT_MS: "999"}, **_upload(fifos.command))
        health = await _health(client)
        served = await client.post(MEASURE, headers={HEADER_REQUEST_TIMEOUT_MS: "60000"}, **_upload(scripted(b"ok")))
    body = refused.json()
    assert (refused.status_code, body["code"], body["message"]) == (
        200,
        Code.SYSTEM_ERROR,
        MSG_DEADLINE_TOO_SHORT.format(ms=999),
    )
    assert health["busy"] is False
    assert (served.status_code, served.json()["code"]) == (200, Code.OK)


async def test_a_deadline_longer_than_any_is_no_deadline_of_its_own_not_an_overflow(
    tmp_path: Path, client_of: Any
) -> None:
    # 400 digits overflowed int / 1000 (an OverflowError answered 1007 with a traceback) and
    # past 4,300 digits int() itself refused them
    async with running_host(tmp_path) as host:
        client = client_of(host)
        codes = [
            (
                await client.post(
                    MEASURE, headers={HEADER_REQUEST_TIMEOUT_MS: "9" * digits}, **_upload(scripted(b"ok"))
                )
            ).json()["code"]
            for digits in (13, 400, 5000)
        ]
    assert codes == [Code.OK, Code.OK, Code.OK]


async def test_an_inference_past_the_deadline_answers_1007_in_time_and_keeps_the_child(
    tmp_path: Path, fifos: Fifos, client_of: Any
) -> None:
    async with running_host(tmp_path) as host:
        client = client_of(host)
        pid_before = await _model_pid(client)
        started = trio.current_time()
        late = await client.post(MEASURE, headers={HEADER_REQUEST_TIMEOUT_MS: "1700"}, **_upload(fifos.command))
        answered_after = trio.current_time() - started
        with trio.fail_after(WAIT):
            await fifos.wait_entered()  # the child is still inside it ...
        busy = (await _health(client))["busy"]  # ... and the host says so
        await fifos.release_child()
        await _until_idle(client)
        after = await client.post(MEASURE, **_upload(scripted(b"ok")))
        pid_after = await _model_pid(client)
    assert late.json()["code"] == Code.SYSTEM_ERROR and "1.2" in late.json()["message"]
    assert 1.1 < answered_after < 1.7  # 1700 ms given, 500 ms of them kept for the answer
    assert busy is True
    assert after.json()["code"] == Code.OK and pid_after == pid_before == after.json()["data"]["pid"]


async def test_a_client_that_leaves_mid_inference_frees_the_host_without_a_model_restart(
    tmp_path: Path, fifos: Fifos, client_of: Any
) -> None:
    async with running_host(tmp_path) as host:
        client = client_of(host)
        pid_before = await _model_pid(client)
        async with trio.open_nursery() as nursery:
            leaving = trio.CancelScope()

            async def departing_request() -> None:
                with leaving:  # cancelling it closes the connection mid-request: a departure
                    async with httpx.AsyncClient(base_url=host.url, headers=auth(), timeout=WAIT) as own:
                        await own.post(MEASURE, **_upload(fifos.command))

            nursery.start_soon(departing_request)
            with trio.fail_after(WAIT):
                await fifos.wait_entered()
            leaving.cancel()
        busy_after_leaving = (await _health(client))["busy"]
        await fifos.release_child()
        await _until_idle(client)
        after = await client.post(MEASURE, **_upload(scripted(b"ok")))
        metrics = (await client.get("/metrics")).text
    assert busy_after_leaving is True  # until the child is free again
    assert after.json()["code"] == Code.OK and after.json()["data"]["pid"] == pid_before
    assert "hairgate_host_model_restarts_total 0.0" in metrics


async def test_a_client_that_leaves_during_a_comfyui_prompt_interrupts_and_dequeues_it_within_a_second(
    tmp_path: Path, nursery: trio.Nursery, client_of: Any
) -> None:
    fake = FakeComfyUI()
    fake.knobs.never_finish = True
    await nursery.start(serve_fake_comfyui, fake)
    async with running_host(tmp_path, host_settings(comfyui_url=fake.url)) as host:
        client = client_of(host)
        leaving = trio.CancelScope()
        async with trio.open_nursery() as requests:

            async def departing_generation() -> None:
                with leaving:
                    async with httpx.AsyncClient(base_url=host.url, headers=auth(), timeout=WAIT) as own:
                        await own.post(GROW, data={"plans": "standard"}, **_upload(_photo()))

            requests.start_soon(departing_generation)
            with trio.fail_after(WAIT):
                await fake.prompt_queued.wait()
            left_at = trio.current_time()
            leaving.cancel()
        # how soon (the target: within a second) is printed below as a measurement, not asserted:
        # a timed bound fails on a loaded machine
        with trio.fail_after(WAIT):
            await fake.interrupted.wait()
        with trio.fail_after(WAIT):
            while not fake.queue_requests:
                await trio.sleep(0.01)
        after = await client.post(MEASURE, **_upload(scripted(b"ok")))
    print(f"/interrupt reached ComfyUI {fake.interrupt_times[0] - left_at:.3f} s after the client left")
    (prompt_id,) = fake.prompts
    assert fake.interrupts == [{"prompt_id": prompt_id}]
    assert fake.queue_requests == [{"delete": [prompt_id]}]
    assert after.json()["code"] == Code.OK


async def _model_pid(client: httpx.AsyncClient) -> int:
    answer = (await client.post(MEASURE, **_upload(scripted(b"ok")))).json()
    assert answer["code"] == Code.OK, answer
    return int(answer["data"]["pid"])
