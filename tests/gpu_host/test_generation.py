"""Grown images through the real host app (a spawned fake child behind it): drawn by a fake
ComfyUI speaking ComfyUI's real HTTP API when one is configured, by the child's built-in
preview otherwise; ComfyUI failing never fails the request."""

from __future__ import annotations

import base64
import io
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import trio
from PIL import Image

from gpu_host.comfyui import ComfyUIClient, load_workflow, placeholders_in
from gpu_host.model_process import ModelProcess
from gpu_host.protocol import ChildConfig
from shared.contract import GENERATOR_COMFYUI, GENERATOR_PREVIEW
from shared.contract.hop import INPAINT_MASK_KEY
from shared.settings import AnalysisSettings
from tests.fakes.fake_comfyui import PAINT, FakeComfyUI, serve_fake_comfyui
from tests.gpu_host.conftest import auth, fake_model, image_file, serving
from tests.gpu_host.fake_child import scripted

GROW, MARK = "/api/v1/hair/grow", "/api/v1/hair/mark"
WIDTH, HEIGHT = 40, 32
BAND = slice(HEIGHT // 8, HEIGHT // 4)  # the fake child's mask rows: above any brows


def _photo() -> bytes:
    pixels = np.random.default_rng(7).integers(0, 200, (HEIGHT, WIDTH, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


PHOTO = _photo()


def _pixels(content: bytes) -> np.ndarray:
    return np.array(Image.open(io.BytesIO(content)).convert("RGB"))


@pytest.fixture
async def fake(nursery: trio.Nursery) -> AsyncIterator[FakeComfyUI]:
    served = FakeComfyUI()
    await nursery.start(serve_fake_comfyui, served)
    yield served


async def _post(url: str | None, path: str, image: bytes, timeout: float = 10.0, **form: str) -> dict[str, Any]:
    """One request through a host whose ComfyUI is at `url` (None: none configured)."""
    model = fake_model()
    client = None if url is None else ComfyUIClient(url, load_workflow(""), timeout, poll_seconds=0.01)
    try:
        async with serving(model, comfyui=client) as http:
            await model.wait_ready()
            response = await http.post(path, headers=auth(), files=image_file(image), form=form)
            assert response.status_code == 200
            return await response.get_json()
    finally:
        if client is not None:
            await client.aclose()


async def test_grow_uploads_photo_and_same_size_masks_and_returns_comfyuis_pictures(fake: FakeComfyUI) -> None:
    body = await _post(fake.url, GROW, PHOTO, plans="standard,aggressive")
    assert body["code"] == 0, body
    results = body["data"]["results"]
    assert [r["plan"] for r in results] == ["standard", "aggressive"]
    photos = [content for name, content in fake.uploads.items() if not name.endswith("-mask.png")]
    masks = [_pixels(content)[..., 0] for name, content in fake.uploads.items() if name.endswith("-mask.png")]
    assert photos == [PHOTO]  # the upload itself, once for both plans
    for mask in masks:
        assert mask.shape == (HEIGHT, WIDTH)
        assert mask[BAND].min() == 255 and mask[: BAND.start].max() == 0 and mask[BAND.stop :].max() == 0
    assert len(fake.prompts) == 2 and all(not placeholders_in(graph) for graph in fake.prompts.values())
    for result in results:
        assert result["generator"] == GENERATOR_COMFYUI and INPAINT_MASK_KEY not in result
        grown = _pixels(base64.b64decode(result["grown_image_base64"]))
        assert (grown[BAND] == PAINT).all()  # what the fake painted where the mask was white
        assert (grown[BAND.stop :] == _pixels(PHOTO)[BAND.stop :]).all()


async def test_mark_is_drawn_by_comfyui_too(fake: FakeComfyUI) -> None:
    body = await _post(fake.url, MARK, PHOTO, drop_mm="5")
    data = body["data"]
    assert (body["code"], data["generator"], INPAINT_MASK_KEY in data) == (0, GENERATOR_COMFYUI, False)
    assert (_pixels(base64.b64decode(data["grown_image_base64"]))[BAND] == PAINT).all()


@pytest.mark.parametrize("failure", ["http 500", "never finishes", "down"])
async def test_comfyui_failing_answers_code_0_with_no_grown_image(fake: FakeComfyUI, failure: str) -> None:
    url = fake.url
    if failure == "http 500":
        fake.knobs.fail_status = 500
    elif failure == "never finishes":
        fake.knobs.never_finish = True
    else:
        with socket.socket() as unused:  # a port nobody listens on
            unused.bind(("127.0.0.1", 0))
            url = f"http://127.0.0.1:{unused.getsockname()[1]}"
    body = await _post(url, GROW, PHOTO, timeout=0.5, plans="standard")
    (result,) = body["data"]["results"]
    assert body["code"] == 0
    assert (result["grown_image_base64"], result["generator"], INPAINT_MASK_KEY in result) == (None, None, False)
    if failure == "never finishes":
        assert [request["prompt_id"] for request in fake.interrupts] == list(fake.prompts)  # stopped, not left running


async def test_no_hair_to_grow_from_asks_comfyui_nothing(fake: FakeComfyUI) -> None:
    body = await _post(fake.url, GROW, scripted(b"no picture: the fake child finds no hair"), plans="standard")
    (result,) = body["data"]["results"]
    assert (body["code"], result["grown_image_base64"], result["generator"]) == (0, None, None)
    assert fake.uploads == {} and fake.prompts == {}


async def test_without_comfyui_the_childs_preview_is_returned_unchanged() -> None:
    body = await _post(None, GROW, PHOTO, plans="standard")
    (result,) = body["data"]["results"]
    assert (result["generator"], base64.b64decode(result["grown_image_base64"])) == (GENERATOR_PREVIEW, PHOTO)
    assert "inpaint_masks" not in body["data"]["options"]  # the child was not asked for masks


# -- the real model child on a labelled photo ----------------------------------------------

PHOTOS_DIR = Path(__file__).resolve().parents[2] / ".." / "shared" / "photos"  # beside the checkout
REAL_PHOTO = PHOTOS_DIR / "obama.jpg"  # labelled "hair": a hairline to grow down from


@pytest.mark.slow
@pytest.mark.skipif(not REAL_PHOTO.exists(), reason=f"labelled photo not found: {REAL_PHOTO}")
async def test_real_child_on_a_labelled_photo_sends_comfyui_a_band_above_the_brows(fake: FakeComfyUI) -> None:
    from analysis.endpoints import special_points
    from analysis.face.landmarks import FaceMeshDetector
    from analysis.image_input import decode_image

    photo = REAL_PHOTO.read_bytes()
    model = ModelProcess(
        ChildConfig(bisenet_weights="", device="cpu", limits=AnalysisSettings()),
        inference_timeout_seconds=120,
        model_load_timeout_seconds=300,
    )
    async with (
        ComfyUIClient(fake.url, load_workflow(""), 30, poll_seconds=0.01) as comfyui,
        serving(model, AnalysisSettings(), comfyui=comfyui) as client,
    ):
        with trio.fail_after(300):
            await model.wait_ready()
        response = await client.post(GROW, headers=auth(), files=image_file(photo), form={"plans": "standard"})
        body = await response.get_json()
    assert body["code"] == 0, body
    (result,) = body["data"]["results"]
    assert result["generator"] == GENERATOR_COMFYUI and result["grown_image_base64"]
    ((mask_name, mask_png),) = [(name, content) for name, content in fake.uploads.items() if name.endswith("-mask.png")]
    mask = _pixels(mask_png)[..., 0]
    rgb = decode_image(photo, AnalysisSettings())
    assert mask.shape == rgb.shape[:2]
    detector = FaceMeshDetector()
    try:
        brows_row = special_points(rgb, detector)["points"]["glabella"][1]
    finally:
        detector.close()
    white_rows = np.flatnonzero((mask >= 128).any(axis=1))
    assert white_rows.size and white_rows.max() < brows_row, (mask_name, white_rows.max(), brows_row)
    assert not placeholders_in(next(iter(fake.prompts.values())))
