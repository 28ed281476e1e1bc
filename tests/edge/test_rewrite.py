"""The image rewrite: nested keys, arrays, null, and all-or-nothing on a bad image."""

from __future__ import annotations

import base64
import io
import json
import os
import re
import tracemalloc
import uuid
import zlib
from pathlib import Path

import pytest
import trio
from PIL import Image

import edge.annotations.rewrite as rewrite_module
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


def big_png(size: int, fill: bytes = b"\x00") -> bytes:
    """A PNG's frame (signature, IHDR, IEND) around `size` bytes: what the checks read."""
    ihdr = b"IHDR" + (64).to_bytes(4, "big") * 2 + b"\x08\x02\x00\x00\x00"
    header = b"\x89PNG\r\n\x1a\n" + (13).to_bytes(4, "big") + ihdr + zlib.crc32(ihdr).to_bytes(4, "big")
    return header + fill * size + b"\x00\x00\x00\x00IEND\xaeB`\x82"


async def test_an_answer_nested_thousands_deep_is_rewritten_without_recursion(store: ImageStore) -> None:
    # ~500 levels was a RecursionError (the gateway bounds what a host sends; the walk
    # itself must not depend on that)
    body: dict = {"mask_image_base64": png_base64()}
    for _ in range(5000):
        body = {"a": [body]}
    images = await store.decode(body)
    assert images.sizes and images.sizes[0]
    rewritten = await store.write(body, images)
    node = rewritten
    for _ in range(5000):
        node = node["a"][0]
    assert URL.fullmatch(node["mask_image_url"]) and len(annotations(store)) == 1


async def test_a_rewrite_holds_one_piece_of_an_image_not_all_of_them(store: ImageStore) -> None:
    # the attack's /grow answer: ~54 MB of PNGs decoded at once (RSS 150 -> 355 MB)
    pngs = [big_png(4 * 1024 * 1024, bytes([n])) for n in range(4)]
    body = {"data": {"results": [{"image_base64": base64.b64encode(png).decode()} for png in pngs]}}
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        rewritten = await rewrite(store, body)
        peak = tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()
    names = [URL.fullmatch(item["image_url"]).group(1) for item in rewritten["data"]["results"]]
    assert [(store.directory / name).read_bytes() == png for name, png in zip(names, pngs, strict=True)] == [True] * 4
    assert peak < 4 * rewrite_module.BASE64_PIECE_CHARS, f"{peak / 2**20:.1f} MB held; one image is 4 MB, all 16 MB"


def test_base64_is_decoded_the_same_piece_by_piece(monkeypatch) -> None:
    monkeypatch.setattr(rewrite_module, "BASE64_PIECE_CHARS", 8)
    png = big_png(100)
    assert rewrite_module.checked_size(base64.b64encode(png).decode()) == len(png)
    padded_early = base64.b64encode(b"x").decode() + base64.b64encode(png).decode()  # "eA==" then more
    with pytest.raises(BadImage):
        rewrite_module.checked_size(padded_early)


def plant(folder: Path, count: int, size: int) -> list[str]:
    """`count` annotation files of `size` bytes, oldest first (a minute apart)."""
    folder.mkdir(parents=True, exist_ok=True)
    names = []
    for number in range(count):
        name = f"{uuid.uuid4()}.png"
        (folder / name).write_bytes(b"p" * size)
        os.utime(folder / name, (1_700_000_000 + 60 * number,) * 2)
        names.append(name)
    return names


async def test_the_size_cap_holds_at_write_time_oldest_first(tmp_path: Path) -> None:
    # the cap was only the sweep's, every 600 s: a burst of answers could fill the disk
    store = ImageStore(tmp_path / "static", BASE_URL, trio.CapacityLimiter(2), max_total_mb=1)
    planted = plant(store.directory, 10, 100 * 1024)  # 1000 KiB of the 1024 KiB cap
    png = big_png(200 * 1024)
    await rewrite(store, {"image_base64": base64.b64encode(png).decode()})
    left = {path.name for path in annotations(store)}
    assert planted[:2] == [name for name in planted if name not in left], "the two oldest went, no more"
    assert sum(path.stat().st_size for path in annotations(store)) <= 1024 * 1024
    for _ in range(3):  # its own writes are counted too
        await rewrite(store, {"image_base64": base64.b64encode(png).decode()})
    assert sum(path.stat().st_size for path in annotations(store)) <= 1024 * 1024
    assert len([name for name in planted if (store.directory / name).exists()]) == 2


async def test_an_answer_over_its_share_of_the_cap_is_refused_and_deletes_nothing(tmp_path: Path) -> None:
    store = ImageStore(tmp_path / "static", BASE_URL, trio.CapacityLimiter(2), max_total_mb=1)
    planted = plant(store.directory, 3, 1024)
    body = {"a_base64": base64.b64encode(big_png(300 * 1024)).decode()}  # over a quarter of 1 MB
    with pytest.raises(ImageWriteError):
        await rewrite(store, body)
    assert sorted(path.name for path in annotations(store)) == sorted(planted)
