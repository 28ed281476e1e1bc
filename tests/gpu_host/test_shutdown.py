"""A real Hypercorn serving the host in-process (`main.serve`, a fake child behind it), stopped
by a real SIGTERM: what happens to kept-alive connections and to requests in flight."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import httpx
import pytest
import trio

from gpu_host.main import hypercorn_config
from shared.settings import GpuHostSettings
from tests.gpu_host.conftest import MEASURE, TOKEN, Fifos, auth, image_file
from tests.gpu_host.inprocess import WAIT, Host, running_host


async def _kept_alive_connection(host: Host) -> trio.SocketStream:
    """A connection that has had one answer and is kept alive (idle) by the host."""
    stream = await trio.open_tcp_stream("127.0.0.1", host.port)
    await stream.send_all(f"GET /health HTTP/1.1\r\nHost: x\r\nX-Internal-Token: {TOKEN}\r\n\r\n".encode())
    received = b""
    while b"\r\n\r\n" not in received:
        received += await stream.receive_some()
    head, _, body = received.partition(b"\r\n\r\n")
    (length,) = [int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")]
    while len(body) < length:
        body += await stream.receive_some()
    assert head.startswith(b"HTTP/1.1 200")
    assert b"connection: close" not in head.lower()
    return stream


async def _request_in_flight(host: Host, fifos: Fifos, nursery: trio.Nursery) -> list[httpx.Response]:
    """A business request that is inside the child (blocked there until released)."""
    answers: list[httpx.Response] = []

    async def post() -> None:
        async with httpx.AsyncClient(base_url=host.url, headers=auth(), timeout=120) as client:
            image = image_file(fifos.command)["image"]
            answers.append(await client.post(MEASURE, files={"image": ("p.jpg", image.stream, "image/jpeg")}))

    nursery.start_soon(post)
    with trio.fail_after(WAIT):
        await fifos.wait_entered()
    return answers


async def test_sigterm_closes_idle_kept_alive_connections_at_once_and_lets_a_request_finish(
    fifos: Fifos, tmp_path: Path
) -> None:
    async with running_host(tmp_path) as host, trio.open_nursery() as nursery:
        idle = await _kept_alive_connection(host)
        answers = await _request_in_flight(host, fifos, nursery)
        os.kill(os.getpid(), signal.SIGTERM)  # received by the host's signal handler
        with trio.fail_after(WAIT):  # not after the grace (55 s): a request sent now would wait it out
            closed = await idle.receive_some()
        still_serving = not host.stopped.is_set()
        await fifos.release_child()
    assert closed == b""
    assert still_serving  # the request in flight kept the host up ...
    assert [(a.status_code, a.json()["code"]) for a in answers] == [(200, 0)]  # ... and got its answer


@pytest.mark.slow
async def test_sigterm_lets_an_inference_longer_than_five_seconds_finish(fifos: Fifos, tmp_path: Path) -> None:
    async with running_host(tmp_path) as host, trio.open_nursery() as nursery:
        answers = await _request_in_flight(host, fifos, nursery)
        os.kill(os.getpid(), signal.SIGTERM)
        await trio.sleep(6)  # the scenario itself: an inference that outlasts the old 5 s grace
        assert not host.stopped.is_set()  # (a stopped host has killed the child: nobody to release)
        await fifos.release_child()
    assert [(a.status_code, a.json()["code"]) for a in answers] == [(200, 0)]


def test_the_grace_covers_the_inference_and_comfyui_when_it_draws() -> None:
    plain = hypercorn_config(GpuHostSettings(inference_timeout_seconds=45), "127.0.0.1:0").graceful_timeout
    drawing = GpuHostSettings(
        inference_timeout_seconds=45, comfyui_url="http://127.0.0.1:8188", comfyui_timeout_seconds=100
    )
    assert plain > 45
    assert hypercorn_config(drawing, "127.0.0.1:0").graceful_timeout == plain + 100
