"""`/static/annotations/<uuid>.png`: served; anything else under /static 404, no escape."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest
import trio

from edge.annotations.static_files import annotation_path
from edge.gateway import Gateway

PNG = b"\x89PNG\r\n\x1a\n" + b"fake-but-served-as-is"


@pytest.fixture
def annotation(gateway: Gateway) -> str:
    folder = Path(gateway.settings.edge.static_dir) / "annotations"
    folder.mkdir(parents=True)
    name = f"{uuid.uuid4()}.png"
    (folder / name).write_bytes(PNG)
    # a secret beside the static folder, the target of every traversal attempt below
    (Path(gateway.settings.edge.static_dir).parent / "secrets.toml").write_text("token")
    return name


async def test_serves_an_annotation(client, annotation: str) -> None:
    response = await client.get(f"/static/annotations/{annotation}")
    assert response.status_code == 200
    assert response.headers["content-type"] == "image/png"
    assert response.content == PNG


@pytest.mark.parametrize(
    "path",
    [
        "/static/annotations/../../secrets.toml",
        "/static/annotations/%2e%2e/%2e%2e/secrets.toml",
        "/static/annotations/..%2f..%2fsecrets.toml",
        "/static/annotations/..\\..\\secrets.toml",
        "/static/annotations//etc/passwd",
        "/static/annotations/00000000-0000-0000-0000-000000000000.png",  # well-formed, absent
        "/static/annotations/not-a-uuid.png",
        "/static/secrets.toml",
        "/static/",
        "/static",
    ],
)
async def test_everything_else_is_404(client, annotation: str, path: str) -> None:
    response = await client.get(path)
    assert response.status_code == 404
    assert b"token" not in response.content


async def test_a_symlink_named_like_an_annotation_is_not_followed(client, gateway: Gateway, annotation: str) -> None:
    folder = Path(gateway.settings.edge.static_dir) / "annotations"
    link = f"{uuid.uuid4()}.png"
    os.symlink(folder.parent.parent / "secrets.toml", folder / link)
    assert (await client.get(f"/static/annotations/{link}")).status_code == 404


async def test_a_hard_link_named_like_an_annotation_is_not_served(client, gateway: Gateway, annotation: str) -> None:
    """Issue 15: a hard link to the secrets file under an annotation's name was served as a PNG."""
    folder = Path(gateway.settings.edge.static_dir) / "annotations"
    link = f"{uuid.uuid4()}.png"
    os.link(folder.parent.parent / "secrets.toml", folder / link)
    response = await client.get(f"/static/annotations/{link}")
    assert response.status_code == 404
    assert b"token" not in response.content
    os.link(folder / annotation, folder / f"{uuid.uuid4()}.png")  # even a second name of a real one
    assert (await client.get(f"/static/annotations/{annotation}")).status_code == 404


async def test_an_annotations_folder_replaced_by_a_symlink_is_not_entered(client, gateway: Gateway) -> None:
    static = Path(gateway.settings.edge.static_dir)
    elsewhere = static.parent / "elsewhere"
    elsewhere.mkdir()
    name = f"{uuid.uuid4()}.png"
    (elsewhere / name).write_bytes(PNG)
    static.mkdir(parents=True, exist_ok=True)
    os.symlink(elsewhere, static / "annotations")
    assert (await client.get(f"/static/annotations/{name}")).status_code == 404


@pytest.mark.parametrize(
    ("subpath", "allowed"),
    [
        ("annotations/0b9f6a2e-8d4c-4a57-9c0b-6f1f0a3c2d11.png", True),
        ("annotations/0B9F6A2E-8D4C-4A57-9C0B-6F1F0A3C2D11.png", False),
        ("annotations/0b9f6a2e-8d4c-4a57-9c0b-6f1f0a3c2d11.png/x", False),
        ("other/0b9f6a2e-8d4c-4a57-9c0b-6f1f0a3c2d11.png", False),
        ("annotations/------------------------------------.png", False),  # 36 characters, no UUID4
        ("annotations/0b9f6a2e-8d4c-1a57-9c0b-6f1f0a3c2d11.png", False),  # a UUID1: never written
    ],
)
def test_annotation_path_only_accepts_uuid_names(tmp_path: Path, subpath: str, allowed: bool) -> None:
    path = annotation_path(tmp_path, subpath)
    assert (path is not None) is allowed
    if path is not None:
        assert path.parent == tmp_path / "annotations"


async def test_a_directory_named_like_an_annotation_is_404_and_leaks_no_descriptor(
    client, gateway: Gateway, annotation: str
) -> None:
    name = f"{uuid.uuid4()}.png"
    (Path(gateway.settings.edge.static_dir) / "annotations" / name).mkdir()
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(20):
        assert (await client.get(f"/static/annotations/{name}")).status_code == 404
    assert len(os.listdir("/proc/self/fd")) <= before


async def test_a_fifo_named_like_an_annotation_does_not_block(client, gateway: Gateway, annotation: str) -> None:
    name = f"{uuid.uuid4()}.png"
    os.mkfifo(Path(gateway.settings.edge.static_dir) / "annotations" / name)
    with trio.fail_after(5):  # without O_NONBLOCK the open waits for a writer forever
        for _ in range(8):  # more than the file threads: none may stay stuck
            assert (await client.get(f"/static/annotations/{name}")).status_code == 404
        assert (await client.get(f"/static/annotations/{annotation}")).status_code == 200


async def test_head_and_other_methods(client, annotation: str) -> None:
    assert (await client.head(f"/static/annotations/{annotation}")).status_code == 200
    response = await client.post(f"/static/annotations/{annotation}", content=b"x")
    assert response.status_code == 405 and response.headers["allow"] == "GET, HEAD"
