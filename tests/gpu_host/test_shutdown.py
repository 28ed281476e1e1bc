"""A real Hypercorn serving the host in-process (`main.serve`, a fake child behind it), stopped
by a real SIGTERM: what happens to kept-alive connections and to requests in flight."""

from __future__ import annotations

import os
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import httpx
import pytest
import trio

from gpu_host.auth import TokenGuard
from gpu_host.main import hypercorn_config, listen, serve
from shared.settings import AuthSettings, GpuHostSettings, Settings
from tests.gpu_host import fake_child
from tests.gpu_host.conftest import LIMITS, MEASURE, TOKEN, Fifos, auth, image_file

WAIT = 30  # below the grace these tests run with (inference timeout 45 s + margin)


@dataclass
class Host:
    url: str
    port: int
    stopped: trio.Event


@asynccontextmanager
async def running_host() -> AsyncIterator[Host]:
    settings = Settings(
        auth=AuthSettings(accept_passwords=(TOKEN,)),
        gpu_host=GpuHostSettings(inference_timeout_seconds=45),
        analysis=LIMITS,
    )
    config = hypercorn_config(settings.gpu_host, "127.0.0.1:0")
    sockets = listen(config)
    port = sockets.insecure_sockets[0].getsockname()[1]
    stopped = trio.Event()

    async def serve_then_note() -> None:
        await serve(settings, config, sockets, TokenGuard((TOKEN,)), lambda: settings, entry=fake_child.serve)
        stopped.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve_then_note)
        host = Host(f"http://127.0.0.1:{port}", port, stopped)
        await _wait_ready(host)
        yield host
        with trio.fail_after(WAIT):
            await stopped.wait()


async def _wait_ready(host: Host) -> None:
    # The model is inside `serve`: no event to wait on from here, so poll with a deadline.
    async with httpx.AsyncClient(base_url=host.url, headers=auth()) as client:
        with trio.fail_after(WAIT):
            while True:
                try:
                    if (await client.get("/health")).status_code == 200:
                        return
                except httpx.TransportError:
                    pass
                await trio.sleep(0.05)


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


async def test_sigterm_closes_idle_kept_alive_connections_at_once_and_lets_a_request_finish(fifos: Fifos) -> None:
    async with running_host() as host, trio.open_nursery() as nursery:
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
async def test_sigterm_lets_an_inference_longer_than_five_seconds_finish(fifos: Fifos) -> None:
    async with running_host() as host, trio.open_nursery() as nursery:
        answers = await _request_in_flight(host, fifos, nursery)
        os.kill(os.getpid(), signal.SIGTERM)
        await trio.sleep(6)  # the scenario itself: an inference that outlasts the old 5 s grace
        assert not host.stopped.is_set()  # (a stopped host has killed the child: nobody to release)
        await fifos.release_child()
    assert [(a.status_code, a.json()["code"]) for a in answers] == [(200, 0)]
