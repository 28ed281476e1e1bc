"""The image rewrite: nested keys, arrays, null, and all-or-nothing on a bad image."""

from __future__ import annotations

import base64
import io
import json
import re
from pathlib import Path

import pytest
import trio
from PIL import Image

from edge.annotations.rewrite import BadImage, ImageStore, ImageWriteError, has_images

BASE_URL = "https://hair.example.com"
URL = re.compile(re.escape(BASE_URL) + r"/static/annotations/([0-9a-f-]{36}\.png)")


def png_base64(color: str = "red") -> str:
    buffer = io.BytesIO()
    Image.new("RGB", (4, 3), color).save(buffer, "PNG")
    return base64.b64encode(buffer.getvalue()).decode()


@pytest.fixture
def store(tmp_path: Path) -> ImageStore:
    return ImageStore(tmp_path / "static", BASE_URL, trio.CapacityLimiter(2))


async def rewrite(store: ImageStore, body):
    return await store.write(body, await store.decode(body))


def annotations(store: ImageStore) -> list[Path]:
    return sorted(store.directory.iterdir()) if store.directory.exists() else []


async def test_rewrites_every_base64_key_at_any_depth(store: ImageStore) -> None:
    body = {
        "code": 0,
        "data": {
            "annotated_image_base64": png_base64("red"),
            "results": [
                {"plan": "standard", "image_base64": png_base64("green"), "grown_image_base64": None},
                {"plan": "aggressive", "image_base64": png_base64("blue"), "grown_image_base64": png_base64()},
            ],
            "nested": {"deeper": [[{"mask_image_base64": png_base64("white")}]]},
            "note_base64_is_not_a_suffix": "kept",
        },
    }
    rewritten = await rewrite(store, body)
    data = rewritten["data"]
    urls = [
        data["annotated_image_url"],
        data["results"][0]["image_url"],
        data["results"][1]["image_url"],
        data["results"][1]["grown_image_url"],
        data["nested"]["deeper"][0][0]["mask_image_url"],
    ]
    assert data["results"][0]["grown_image_url"] is None
    assert data["note_base64_is_not_a_suffix"] == "kept"
    assert list(data["results"][0]) == ["plan", "image_url", "grown_image_url"], "key order is kept"
    names = [URL.fullmatch(url).group(1) for url in urls]
    assert sorted(names) == [p.name for p in annotations(store)]
    colors = {Image.open(store.directory / n).getpixel((0, 0)) for n in names[:3]}
    assert colors == {(255, 0, 0), (0, 128, 0), (0, 0, 255)}
    assert '_base64"' not in json.dumps(rewritten), "no key ending in _base64 is left"


@pytest.mark.parametrize(
    "bad",
    [
        "not base64!!",
        base64.b64encode(b"GIF89a" + bytes(40)).decode(),  # valid base64, not a PNG
        png_base64()[:-8],  # truncated
        12345,  # not a string
    ],
)
async def test_a_bad_image_fails_the_whole_response_and_leaves_nothing(store: ImageStore, bad) -> None:
    body = {"data": {"a_base64": png_base64(), "items": [{"b_base64": png_base64()}, {"c_base64": bad}]}}
    with pytest.raises(BadImage):
        await store.decode(body)
    assert annotations(store) == []
    assert list(store.directory.parent.rglob("*")) in ([], [store.directory])


async def test_null_writes_nothing_and_body_without_images_is_untouched(store: ImageStore) -> None:
    assert await rewrite(store, {"data": {"grown_image_base64": None}}) == {"data": {"grown_image_url": None}}
    body = {"data": {"x": [1, 2]}}
    assert await rewrite(store, body) is body
    assert annotations(store) == []


def test_has_images_precheck() -> None:
    assert has_images(b'{"data":{"mask_image_base64":"..."}}')
    assert not has_images(b'{"data":{"mask_image_url":"..."}}')


async def test_disk_error_propagates_and_cleans_up(tmp_path: Path) -> None:
    blocker = tmp_path / "static"
    blocker.write_text("a file where the folder should be")
    store = ImageStore(blocker, BASE_URL, trio.CapacityLimiter(1))
    with pytest.raises(ImageWriteError):
        await rewrite(store, {"a_base64": png_base64()})
