"""The whole host in this process: `gpu_host.main.serve` (the real Hypercorn on a loopback
port, the real app, a fake child behind it), as `hairgate gpu-host` runs it, minus the
process boundary, so a test can reach inside (a fake ComfyUI in the same nursery, FIFOs).

`running_host` stops it the way an operator does: SIGTERM, received by the host's own
signal handler (a test may send it earlier itself to watch the graceful stop).
"""

from __future__ import annotations

import os
import signal
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import trio

from gpu_host.admin import HostTokens
from gpu_host.auth import TokenGuard
from gpu_host.comfyui import load_workflow
from gpu_host.main import check_tls, hypercorn_config, listen, serve
from shared.secrets_file import SecretsSource
from shared.settings import ENV_ACCEPT_PASSWORDS, AuthSettings, GpuHostSettings, Settings
from tests.gpu_host import fake_child
from tests.gpu_host.conftest import LIMITS, TOKEN, auth

WAIT = 30  # below the grace these hosts run with (inference timeout 45 s + margin)


@dataclass
class Host:
    url: str
    port: int
    stopped: trio.Event
    verify: ssl.SSLContext | bool  # what an httpx client needs to trust it


def host_settings(**gpu_host: object) -> Settings:
    return Settings(
        auth=AuthSettings(accept_passwords=(TOKEN,)),
        gpu_host=GpuHostSettings(inference_timeout_seconds=45, **gpu_host),
        analysis=LIMITS,
    )


@asynccontextmanager
async def running_host(
    directory: Path, settings: Settings | None = None, *, ca_file: Path | None = None
) -> AsyncIterator[Host]:
    """The host serving on a free loopback port, its model ready; stopped (SIGTERM) on exit."""
    settings = settings or host_settings()
    config = hypercorn_config(settings.gpu_host, "127.0.0.1:0")
    check_tls(config)
    sockets = listen(config)
    listening = sockets.secure_sockets or sockets.insecure_sockets
    port = listening[0].getsockname()[1]
    scheme = "https" if config.ssl_enabled else "http"
    guard = TokenGuard(settings.auth.accept_passwords)
    secrets = SecretsSource(directory / "secrets.toml", ENV_ACCEPT_PASSWORDS, from_environment=False)
    tokens = HostTokens(guard, settings.auth.accept_passwords, secrets)
    workflow = load_workflow(settings.gpu_host.comfyui_workflow)
    stopped = trio.Event()

    async def serve_then_note() -> None:
        await serve(settings, config, sockets, guard, tokens, lambda: settings, workflow, entry=fake_child.serve)
        stopped.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve_then_note)
        host = Host(f"{scheme}://127.0.0.1:{port}", port, stopped, _trusting(ca_file))
        await _wait_ready(host)
        yield host
        if not stopped.is_set():  # (no checkpoint between: it cannot stop in between)
            os.kill(os.getpid(), signal.SIGTERM)
        with trio.fail_after(WAIT):
            await stopped.wait()


def _trusting(ca_file: Path | None) -> ssl.SSLContext | bool:
    return ssl.create_default_context(cafile=str(ca_file)) if ca_file else True


async def _wait_ready(host: Host) -> None:
    # The model is inside `serve`: no event to wait on from here, so poll with a deadline.
    async with httpx.AsyncClient(base_url=host.url, headers=auth(), verify=host.verify) as client:
        with trio.fail_after(WAIT):
            while True:
                try:
                    if (await client.get("/health")).status_code == 200:
                        return
                except httpx.TransportError:
                    pass
                await trio.sleep(0.05)
