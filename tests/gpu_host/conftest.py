"""Fixtures: a GPU host app in-process with a real spawned child (fake or real) behind it."""

from __future__ import annotations

import io
import multiprocessing
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from multiprocessing.context import SpawnContext
from pathlib import Path
from typing import Any

import pytest
import trio
from werkzeug.datastructures import FileStorage

from gpu_host.admin import HostTokens
from gpu_host.app import create_app
from gpu_host.auth import TokenGuard
from gpu_host.comfyui import ComfyUIClient
from gpu_host.model_process import ModelProcess
from gpu_host.protocol import ChildConfig
from gpu_host.supervisor import Backoff
from gpu_host.version import host_model_version
from shared.secrets_file import SecretsSource
from shared.settings import AnalysisSettings
from tests.gpu_host import fake_child

TOKEN = "tok-current-7f3a9c"
OLD_TOKEN = "tok-previous-51d2e8"
LIMITS = AnalysisSettings(max_image_bytes=64 * 1024)
MEASURE = "/api/v1/hair/measure"
# what a host with these settings (no BiSeNet, the built-in preview) reports: computed as it does
MODEL_VERSION = host_model_version("", None).value
WAIT_SECONDS = 30  # generous for a spawn on a loaded 2-core machine; never reached when healthy


def fake_config(**extra: Any) -> ChildConfig:
    return ChildConfig(bisenet_weights="", device="cpu", limits=LIMITS, extra=extra)


def fake_model(
    timeout: float = 30.0, load_timeout: float = 60.0, context: SpawnContext | None = None, **extra: Any
) -> ModelProcess:
    return ModelProcess(
        fake_config(**extra),
        inference_timeout_seconds=timeout,
        model_load_timeout_seconds=load_timeout,
        entry=fake_child.serve,
        backoff=Backoff(first_seconds=0.05),
        context=context or multiprocessing.get_context("spawn"),
    )


@asynccontextmanager
async def serving(
    model: ModelProcess,
    limits: AnalysisSettings = LIMITS,
    comfyui: ComfyUIClient | None = None,
    secrets: SecretsSource | None = None,
) -> AsyncIterator[Any]:
    """The app with its lifespan running and the model supervisor beside it, as `main.serve`
    runs them; yields a test client. `secrets`: mount `/admin/tokens`, persisting there."""
    guard = TokenGuard((TOKEN, OLD_TOKEN))
    tokens = None if secrets is None else HostTokens(guard, (TOKEN, OLD_TOKEN), secrets)
    app = create_app(model, guard, limits, model_version=MODEL_VERSION, comfyui=comfyui, tokens=tokens)
    async with trio.open_nursery() as nursery:
        await nursery.start(model.run)
        async with app.test_app() as test_app:
            yield test_app.test_client()
        nursery.cancel_scope.cancel()


def auth(**headers: str) -> dict[str, str]:
    return {"X-Internal-Token": TOKEN, **headers}


def image_file(content: bytes, name: str = "photo.jpg") -> dict[str, FileStorage]:
    """A multipart `files=` argument carrying `content` as the image (the fake child's script)."""
    return {"image": FileStorage(io.BytesIO(content), filename=name, content_type="image/jpeg")}


async def post_image(client: Any, command: bytes, path: str = MEASURE, **form: str) -> Any:
    """Post a fake child's script (`fake_child`) as the image, signature first unless it has one."""
    content = command if command.startswith(fake_child.SIGNATURE) else fake_child.scripted(command)
    return await client.post(path, headers=auth(), files=image_file(content), form=form)


@asynccontextmanager
async def job_running(client: Any, fifos: Fifos) -> AsyncIterator[list[Any]]:
    """Inside: a business request is running in the (fake) child, blocked there. On exit
    the child is released and the request's response is in the yielded list."""
    answers: list[Any] = []
    async with trio.open_nursery() as nursery:

        async def job() -> None:
            answers.append(await post_image(client, fifos.command))

        nursery.start_soon(job)
        with trio.fail_after(WAIT_SECONDS):
            await fifos.wait_entered()
        yield answers
        await fifos.release_child()


class Fifos:
    """A pair of named pipes: the fake child says it entered a request, the test releases it."""

    def __init__(self, directory: Path) -> None:
        self.entered = directory / "entered"
        self.release = directory / "release"
        os.mkfifo(self.entered)
        os.mkfifo(self.release)

    @property
    def command(self) -> bytes:
        return fake_child.scripted(f"block:{self.entered}:{self.release}".encode())

    async def wait_entered(self) -> int:
        """Block (in a thread) until the child is inside the request; its pid."""

        def read() -> int:
            with open(self.entered) as pipe:
                return int(pipe.readline())

        return await trio.to_thread.run_sync(read)

    async def release_child(self) -> None:
        def write() -> None:
            with open(self.release, "w") as pipe:
                pipe.write("go\n")

        await trio.to_thread.run_sync(write)


@pytest.fixture
def fifos(tmp_path: Path) -> Fifos:
    return Fifos(tmp_path)
