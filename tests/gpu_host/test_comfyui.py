"""The ComfyUI client against a fake ComfyUI served on loopback (real sockets, real HTTP)."""

from __future__ import annotations

import base64
import io
import json
import logging
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import trio
from PIL import Image

from gpu_host import comfyui
from gpu_host.comfyui import (
    PLACEHOLDERS,
    ComfyUIClient,
    draw_grown,
    load_workflow,
    placeholders_in,
    seed_for,
)
from shared.contract.hop import INPAINT_MASK_KEY
from shared.logs import FailureLog
from shared.settings import SettingsError
from tests.fakes.fake_comfyui import PAINT, FakeComfyUI, serve_fake_comfyui

CORE_NODES = {
    "CheckpointLoaderSimple",
    "LoadImage",
    "LoadImageMask",
    "ImageToMask",
    "VAEEncodeForInpaint",
    "CLIPTextEncode",
    "KSampler",
    "VAEDecode",
    "ImageCompositeMasked",
    "SaveImage",
}
WIDTH, HEIGHT = 64, 48
BAND = slice(6, 14)  # rows the masks mark white: "above the brows" of a 48-row photo


def _png(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format="PNG")
    return buffer.getvalue()


def _decode(content: bytes) -> np.ndarray:
    return np.array(Image.open(io.BytesIO(content)))


PHOTO = _png(np.random.default_rng(3).integers(0, 200, (HEIGHT, WIDTH, 3), dtype=np.uint8))


def _mask(band: slice = BAND) -> bytes:
    mask = np.zeros((HEIGHT, WIDTH), np.uint8)
    mask[band] = 255
    return _png(mask)


@pytest.fixture
async def fake(nursery: trio.Nursery) -> AsyncIterator[FakeComfyUI]:
    served = FakeComfyUI()
    await nursery.start(serve_fake_comfyui, served)
    yield served


def _client(url: str, timeout: float = 10.0) -> ComfyUIClient:
    return ComfyUIClient(url, load_workflow(""), timeout, poll_seconds=0.01)


async def _draw(url: str, masks: dict[str, bytes], timeout: float = 10.0) -> dict[str, bytes | None]:
    async with _client(url, timeout) as client:
        return await client.draw(PHOTO, masks)


# --- the workflow -----------------------------------------------------------------------


def test_default_workflow_is_core_nodes_with_every_placeholder() -> None:
    workflow = load_workflow("")
    assert {node["class_type"] for node in workflow.values()} <= CORE_NODES
    assert placeholders_in(workflow) == set(PLACEHOLDERS)
    savers = [node for node in workflow.values() if node["class_type"] == "SaveImage"]
    assert len(savers) == 1


@pytest.mark.parametrize("missing", ["{{image}}", "{{mask}}"])
def test_workflow_without_image_or_mask_is_a_settings_error(tmp_path: Path, missing: str) -> None:
    text = json.dumps(load_workflow("")).replace(f'"{missing}"', '"fixed.png"')
    path = tmp_path / "workflow.json"
    path.write_text(text)
    with pytest.raises(SettingsError, match=r"gpu_host\.comfyui_workflow.*" + missing.replace("{", r"\{")):
        load_workflow(str(path))


@pytest.mark.parametrize(
    "content",
    [
        "not json",
        '{"1": {"inputs": {}}}',
        '["a list"]',
        '{"1": {"class_type": "LoadImage", "inputs": {"image": "{{photo}}"}}}',
    ],
)
def test_unreadable_or_foreign_workflow_is_a_settings_error(tmp_path: Path, content: str) -> None:
    path = tmp_path / "workflow.json"
    path.write_text(content)
    with pytest.raises(SettingsError, match=r"gpu_host\.comfyui_workflow"):
        load_workflow(str(path))


def test_missing_workflow_file_is_a_settings_error(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match=r"gpu_host\.comfyui_workflow"):
        load_workflow(str(tmp_path / "absent.json"))


def test_seed_depends_on_image_and_plan() -> None:
    assert seed_for(PHOTO, "standard") == seed_for(bytes(PHOTO), "standard")
    assert seed_for(PHOTO, "standard") != seed_for(PHOTO, "aggressive")
    assert seed_for(PHOTO, "standard") != seed_for(PHOTO + b"\0", "standard")


# --- drawing against the fake ---------------------------------------------------------


async def test_uploads_photo_and_same_size_masks_and_returns_the_output(fake: FakeComfyUI) -> None:
    masks = {"standard": _mask(), "aggressive": _mask(slice(6, 20))}
    drawn = await _draw(fake.url, masks)

    assert PHOTO in fake.uploads.values()
    for mask in masks.values():
        assert mask in fake.uploads.values()
        assert _decode(mask).shape == _decode(PHOTO).shape[:2]
    assert all(form == {"type": "input", "overwrite": "true"} for form in fake.upload_forms)
    assert len(fake.prompts) == 2
    for plan, picture in drawn.items():
        assert picture is not None and picture in fake.outputs.values()
        grown = _decode(picture)
        painted = (grown == PAINT).all(axis=2)
        assert painted.any() and np.array_equal(painted, _decode(masks[plan]) == 255)


async def test_queued_graph_has_no_placeholder_left(fake: FakeComfyUI) -> None:
    await _draw(fake.url, {"standard": _mask()})
    (graph,) = fake.prompts.values()
    assert "{{" not in json.dumps(graph)
    nodes = {node["class_type"]: node["inputs"] for node in graph.values()}
    assert fake.uploads[nodes["LoadImage"]["image"]] == PHOTO
    assert fake.uploads[nodes["LoadImageMask"]["image"]] == _mask()
    assert nodes["KSampler"]["seed"] == seed_for(PHOTO, "standard")
    texts = [node["inputs"]["text"] for node in graph.values() if node["class_type"] == "CLIPTextEncode"]
    assert all(texts) and len(set(texts)) == 2
    assert fake.client_ids[0]


async def test_a_retried_request_queues_the_same_graph(fake: FakeComfyUI) -> None:
    await _draw(fake.url, {"standard": _mask()})
    await _draw(fake.url, {"standard": _mask()})
    first, second = fake.prompts.values()
    assert first == second


async def test_comfyui_answering_500_gives_none(fake: FakeComfyUI, caplog: pytest.LogCaptureFixture) -> None:
    fake.knobs.fail_status = 500
    with caplog.at_level(logging.WARNING, "gpu_host.comfyui"):
        drawn = await _draw(fake.url, {"standard": _mask(), "aggressive": _mask()})
    assert drawn == {"standard": None, "aggressive": None}
    assert "HTTP 500" in caplog.text


async def test_never_finishing_prompt_times_out_then_is_interrupted_and_dropped(fake: FakeComfyUI) -> None:
    fake.knobs.never_finish = True
    drawn = await _draw(fake.url, {"standard": _mask()}, timeout=0.5)
    assert drawn == {"standard": None}
    (prompt_id,) = fake.prompts
    assert fake.history_polls >= 1
    assert fake.interrupts == [{"prompt_id": prompt_id}]
    assert fake.queue_requests == [{"delete": [prompt_id]}]


async def test_comfyui_down_gives_none() -> None:
    with socket.socket() as bound_not_listening:  # held: no other test can take the port meanwhile
        bound_not_listening.bind(("127.0.0.1", 0))
        port = bound_not_listening.getsockname()[1]
        drawn = await _draw(f"http://127.0.0.1:{port}", {"standard": _mask()})
    assert drawn == {"standard": None}


def _grow_answer() -> dict:
    """What the model process answers for grow when the host asks for inpainting masks."""
    return {
        "results": [
            {
                "plan": "standard",
                "image_base64": "…",
                "grown_image_base64": None,
                "generator": None,
                INPAINT_MASK_KEY: base64.b64encode(_mask()).decode(),
            },
            {
                "plan": "aggressive",
                "image_base64": "…",
                "grown_image_base64": None,
                "generator": None,
                INPAINT_MASK_KEY: base64.b64encode(_mask(slice(6, 20))).decode(),
            },
        ]
    }


async def test_grow_answer_gets_comfyui_pictures_and_loses_its_masks(fake: FakeComfyUI) -> None:
    async with _client(fake.url) as client:
        data = await draw_grown(client, PHOTO, _grow_answer())
    for result in data["results"]:
        assert INPAINT_MASK_KEY not in result and result["generator"] == "comfyui"
        assert base64.b64decode(result["grown_image_base64"]) in fake.outputs.values()
    assert len(fake.prompts) == 2


async def test_mark_answer_without_a_mask_asks_comfyui_nothing(fake: FakeComfyUI) -> None:
    async with _client(fake.url) as client:
        data = await draw_grown(
            client, PHOTO, {"marked_image_base64": "…", "grown_image_base64": None, "generator": None}
        )
    assert data["grown_image_base64"] is None and data["generator"] is None
    assert not fake.uploads and not fake.prompts


async def test_failing_comfyui_leaves_grow_answer_null_without_masks(fake: FakeComfyUI) -> None:
    fake.knobs.fail_status = 500
    async with _client(fake.url) as client:
        data = await draw_grown(client, PHOTO, _grow_answer())
    for result in data["results"]:
        assert INPAINT_MASK_KEY not in result
        assert result["grown_image_base64"] is None and result["generator"] is None


def test_failures_are_logged_at_most_once_per_interval(caplog: pytest.LogCaptureFixture) -> None:
    failures = FailureLog(
        logging.getLogger("gpu_host.comfyui"), "ComfyUI generation failed", 3600, level=logging.WARNING
    )
    with caplog.at_level(logging.WARNING, "gpu_host.comfyui"):
        for attempt in range(5):
            failures.report(f"attempt {attempt}")
    assert [record.getMessage() for record in caplog.records if "attempt" in record.getMessage()] == [
        "ComfyUI generation failed | attempt 0 | 上次记录后又失败 0 次"
    ]


def test_a_deeply_nested_answer_is_a_comfyui_failure_not_a_crash() -> None:
    # json raises RecursionError, not ValueError, on 50,000 levels: the probe task must survive it
    deep = httpx.Response(
        200, content=b"[" * 50_000 + b"]" * 50_000, request=httpx.Request("GET", "http://c/system_stats")
    )
    with pytest.raises(comfyui.ComfyUIFailure):
        comfyui._json(deep)
