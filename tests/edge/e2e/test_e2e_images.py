"""The `*_base64` -> `*_url` rewrite and the static files it serves, through the real gateway."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from shared.contract import MSG_BACKEND_UNAVAILABLE, Code, envelope
from tests.edge.e2e.harness import Cluster, gateway_health, measure, wait_until
from tests.fakes.fake_worker import PNG_BYTES, Knobs, job_data

ANNOTATIONS = "/static/annotations/"


def _check_rewritten(expected: Any, actual: Any, base_url: str, urls: list[str]) -> None:
    """`actual` is `expected` with every `x_base64` key at any depth turned into `x_url`."""
    if isinstance(expected, dict):
        assert isinstance(actual, dict)
        renamed = {k[: -len("_base64")] + "_url" if k.endswith("_base64") else k for k in expected}
        assert set(actual) == renamed, f"keys {sorted(actual)} != {sorted(renamed)}"
        for key, value in expected.items():
            if not key.endswith("_base64"):
                _check_rewritten(value, actual[key], base_url, urls)
                continue
            url = actual[key[: -len("_base64")] + "_url"]
            if value is None:
                assert url is None, "a null image stays null"
            else:
                assert url.startswith(base_url + ANNOTATIONS) and url.endswith(".png"), url
                urls.append(url)
    elif isinstance(expected, list):
        assert isinstance(actual, list) and len(actual) == len(expected)
        for item, got in zip(expected, actual, strict=True):
            _check_rewritten(item, got, base_url, urls)
    else:
        assert actual == expected


@pytest.mark.slow
async def test_every_base64_key_at_any_depth_becomes_a_served_url(cluster: Cluster) -> None:
    (fake,) = cluster.start_fakes(1)
    await fake.configure(shape="nested")
    gateway = cluster.start_gateway()
    async with cluster.client() as client:
        response = await measure(client)
        body = response.json()
        assert body["code"] == Code.OK, body
        urls: list[str] = []
        _check_rewritten(job_data("/api/v1/hair/measure", Knobs(shape="nested")), body["data"], gateway.url, urls)
        assert len(urls) == 6 and len(set(urls)) == 6, "one fresh file per image"
        for url in urls:
            image = await client.get(url.removeprefix(gateway.url))
            assert image.status_code == 200
            assert image.headers["content-type"].startswith("image/png")
            assert image.content == PNG_BYTES
    assert len(cluster.annotation_files()) == 6


@pytest.mark.slow
@pytest.mark.parametrize("bad_image", ["bad_base64", "not_png"])
async def test_an_unusable_image_fails_the_request_and_leaves_no_file(cluster: Cluster, bad_image: str) -> None:
    (fake,) = cluster.start_fakes(1)
    # Nested: five good images come before the bad one, so some may be written first.
    await fake.configure(shape="nested", image=bad_image)
    cluster.start_gateway()
    async with cluster.client() as client:
        response = await measure(client, headers={"X-Request-ID": "broken-image"})
        assert response.json() == envelope(Code.SYSTEM_ERROR, "broken-image", message=MSG_BACKEND_UNAVAILABLE)
        assert (await gateway_health(client))["workers_healthy"] == 0, "a worker sending broken images is ejected"
    leftovers = [p for p in cluster.static_dir.rglob("*") if p.is_file()] if cluster.static_dir.exists() else []
    assert leftovers == [], "nothing half-written stays on disk"


@pytest.mark.slow
async def test_an_unusable_image_is_retried_on_another_worker(cluster: Cluster) -> None:
    broken, good = cluster.start_fakes(2)
    await broken.configure(image="not_png")
    cluster.start_gateway(edge={"health_check": {"cooldown_seconds": 30}})
    async with cluster.client() as client:
        for _ in range(4):
            assert (await measure(client)).json()["code"] == Code.OK
            if (await broken.stats())["jobs"]:
                break
        assert len((await broken.stats())["jobs"]) == 1
    assert len(cluster.annotation_files()) == len((await good.stats())["jobs"]), "only the good images are kept"


TRAVERSALS = [
    "/static/annotations/../../secrets.toml",
    "/static/annotations/..%2f..%2fsecrets.toml",
    "/static/annotations/%2e%2e/%2e%2e/secrets.toml",
    "/static/annotations/%2e%2e%2f%2e%2e%2fsecrets.toml",
    "/static/annotations/..%252f..%252fsecrets.toml",
    "/static/annotations/..%5c..%5csecrets.toml",
    "/static/%2e%2e/secrets.toml",
    "/static/../settings.toml",
    "/static/canary.txt",
    "/static/annotations/notes.txt",
    "/static/annotations/",
    "/static/annotations/{valid}/../../canary.txt",
    "/static/annotations/{valid}%00.txt",
    "/static/annotations/..%2f..%2f..%2f..%2f..%2f..%2fetc%2fpasswd",
]


async def _raw_get(port: int, target: str) -> tuple[int, bytes]:
    """GET with `target` exactly as written: no client normalises or re-encodes it."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(f"GET {target} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
        received = b""
        with trio.fail_after(10):
            while not _complete(received) and (chunk := await stream.receive_some()):
                received += chunk
    return int(received.split(b" ", 2)[1]), received


def _complete(response: bytes) -> bool:
    """Headers and `Content-Length` bytes of body received (the server may keep the socket open)."""
    head, separator, body = response.partition(b"\r\n\r\n")
    if not separator:
        return False
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return len(body) >= int(value)
    return False


@pytest.mark.slow
async def test_static_serves_annotations_only_and_no_path_traversal(cluster: Cluster) -> None:
    cluster.start_fakes(1)
    gateway = cluster.start_gateway()
    async with cluster.client() as client:
        url = (await measure(client)).json()["data"]["annotated_image_url"]
    valid = url.rsplit("/", 1)[1]
    (cluster.static_dir / "canary.txt").write_text("CANARY-IN-STATIC")
    (cluster.static_dir / "annotations" / "notes.txt").write_text("CANARY-IN-ANNOTATIONS")
    port = int(gateway.url.rsplit(":", 1)[1])

    status, served = await _raw_get(port, ANNOTATIONS + valid)
    assert status == 200 and served.endswith(PNG_BYTES), "the control: a real annotation is served"
    for target in TRAVERSALS:
        status, answer = await _raw_get(port, target.format(valid=valid))
        assert status == 404, f"{target} answered {status}"
        for secret in (cluster.token.encode(), b"CANARY", b"[edge", b"root:"):
            assert secret not in answer, f"{target} leaked {secret!r}"


@pytest.mark.slow
async def test_annotations_older_than_max_age_are_deleted(cluster: Cluster) -> None:
    cluster.start_fakes(1)
    cleanup = {"interval_seconds": 0.2, "max_age_hours": 1 / 3600}  # one second
    gateway = cluster.start_gateway(edge={"static_cleanup": cleanup})
    async with cluster.client() as client:
        url = (await measure(client)).json()["data"]["annotated_image_url"].removeprefix(gateway.url)
        assert (await client.get(url)).status_code == 200

        async def deleted() -> bool:
            return (await client.get(url)).status_code == 404

        await wait_until(deleted, 10, "the cleanup task to delete a file past max_age_hours")
    assert cluster.annotation_files() == []


@pytest.mark.slow
async def test_the_oldest_annotations_go_when_the_folder_is_over_its_size(cluster: Cluster) -> None:
    cluster.start_fakes(1)
    gateway = cluster.start_gateway(edge={"static_cleanup": {"interval_seconds": 0.2}})
    async with cluster.client() as client:
        urls = []
        for _ in range(4):
            urls.append((await measure(client)).json()["data"]["annotated_image_url"].removeprefix(gateway.url))
        total = sum(path.stat().st_size for path in cluster.annotation_files())
        cap_bytes = total / 2
        # the cap comes with a reload, which the clean-up task reads at its next sweep
        cluster.write_settings(edge={"static_cleanup": {"interval_seconds": 0.2, "max_total_mb": cap_bytes / 2**20}})
        gateway.reload()

        async def within_the_cap() -> bool:
            return sum(path.stat().st_size for path in cluster.annotation_files()) <= cap_bytes

        await wait_until(within_the_cap, 10, "the cleanup task to bring the folder under max_total_mb")
        assert (await client.get(urls[-1])).status_code == 200, "the newest file stays"
        assert (await client.get(urls[0])).status_code == 404, "the oldest goes first"
