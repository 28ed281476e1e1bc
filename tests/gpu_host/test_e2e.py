"""End to end: the real gateway (`hairgate edge`) in front of real GPU hosts with the real analysis.

The default run keeps one of these: `hairgate dev` itself, a photo through it, Ctrl-C.
The others are `slow` (`make test-all`).
"""

from __future__ import annotations

import io
import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import cv2
import httpx
import numpy as np
import pytest
from PIL import Image
from skimage import data

from cluster.launcher import REPO_ROOT, Process, Service, free_ports, hairgate_argv
from cluster.launcher import start as start_process
from shared.contract import HEADER_TOKEN
from shared.contract.envelope import envelope_errors
from tests.analysis.images import encode
from tests.gpu_host.processes import (
    STARTUP_DEADLINE_SECONDS,
    astronaut_png,
    child_pids,
    cluster_files,
    is_running,
    start,
    two_faces_png,
    wait_for,
)

MEASURE = "/api/v1/hair/measure"


def _descendants(pid: int) -> list[int]:
    found = []
    for child in child_pids(pid):
        found += [child, *_descendants(child)]
    return found


def test_hairgate_dev_serves_a_photo_through_gateway_and_two_hosts_then_stops_everything(tmp_path: Path) -> None:
    gateway_port, first_host_port, _, metrics_port = free_ports(4)
    command = [
        *hairgate_argv(), "dev", "--workers", "2", "--config", str(REPO_ROOT / "settings.toml"),
        "--port", str(gateway_port), "--first-worker-port", str(first_host_port), "--metrics-port", str(metrics_port),
    ]  # fmt: skip
    dev = start_process(Service("dev", command, url=""), tmp_path / "dev.log", cwd=tmp_path)
    try:
        curl = dev.wait_for_log(r"curl -F image=@.*", STARTUP_DEADLINE_SECONDS).group(0).split()
        photo, url = Path(tmp_path / curl[2].removeprefix("image=@")), curl[3]
        with httpx.Client(timeout=120) as client:
            answer = client.post(url, files={"image": ("photo.png", photo.read_bytes(), "image/png")})
            body = answer.json()
            assert envelope_errors("measure", body) is None, envelope_errors("measure", body)
            annotated = client.get(body["data"]["annotated_image_url"]) if body["code"] == 0 else None
        processes = _descendants(dev.pid)
        secrets_mode = (tmp_path / "var/dev/secrets.toml").stat().st_mode & 0o777
    finally:
        exit_code = dev.stop(signal.SIGINT, grace_s=60)
        rest = dev.log_text()
    assert url == f"http://127.0.0.1:{gateway_port}/api/v1/hair/measure"
    assert body["code"] == 0, body
    assert annotated is not None and annotated.status_code == 200
    assert Image.open(io.BytesIO(annotated.content)).size == Image.open(photo).size == (512, 512)
    assert secrets_mode == 0o600
    assert len(processes) >= 5  # 2 hosts + their model children + the gateway
    assert exit_code == 0, rest
    assert [pid for pid in processes if is_running(pid)] == []
    assert "GPU host stopped" in rest  # the hosts' shutdown logs made it to the terminal


# -- a cluster started service by service (slow) ------------------------------------------


class Cluster:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.files = cluster_files(directory, hosts=2)
        self.hosts: list[Process] = [start(service, directory) for service in self.files.hosts]
        self.gateway: Process = start(self.files.gateway, directory)
        for host in self.hosts:
            wait_for(host, self.files.token, lambda r: r.status_code == 200, "host ready")
        wait_for(self.gateway, self.files.token, lambda r: r.json().get("workers_healthy") == 2, "pool complete")

    def post(self, image: bytes, name: str = "photo.png") -> dict:
        with httpx.Client(base_url=self.gateway.url, timeout=120) as client:
            body = client.post(MEASURE, files={"image": (name, image, "application/octet-stream")}).json()
        assert envelope_errors("measure", body) is None, envelope_errors("measure", body)  # the document's answer
        return body

    def stop(self) -> None:
        for service in [self.gateway, *self.hosts]:
            service.stop()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    running = Cluster(tmp_path_factory.mktemp("cluster"))
    try:
        yield running
    finally:
        running.stop()


@pytest.mark.slow
def test_non_image_through_the_gateway_is_1002(cluster: Cluster) -> None:
    body = cluster.post(b"%PDF-1.4 this is not a photo", "file.pdf")
    assert (body["code"], body["data"]) == (1002, None)


@pytest.mark.slow
def test_two_faces_through_the_gateway_is_1006(cluster: Cluster) -> None:
    body = cluster.post(two_faces_png())
    assert (body["code"], body["data"]) == (1006, None)


@pytest.mark.slow
def test_json_body_through_the_gateway_returns_every_image_as_a_url(cluster: Cluster) -> None:
    import base64

    with httpx.Client(base_url=cluster.gateway.url, timeout=120) as client:
        body = client.post(
            "/api/v1/hair/hairline",
            json={
                "image_base64": "data:image/png;base64," + base64.b64encode(astronaut_png()).decode(),
                "styles": ["rounded"],
            },
        ).json()
        assert body["code"] == 0, body
        assert envelope_errors("hairline", body) is None, envelope_errors("hairline", body)
        (design,) = body["data"]["hairline_images"]
        assert client.get(design["image_url"]).status_code == 200


def _logged(cluster: Cluster, path: str) -> list[dict]:
    """The gateway's request log lines for `path` (written in batches: polled)."""
    log = cluster.directory / "request_log.jsonl"
    lines = log.read_text().splitlines() if log.is_file() else []
    return [entry for entry in map(json.loads, lines) if entry["path"] == path]


def _noisy_7200_jpeg() -> bytes:
    """The attack of issue 39: a face in the middle of a 7200 x 7200 noisy background, a
    legal upload (52 MP, a few MB) whose /grow drew six ~73 MB PNGs."""
    noise = np.random.default_rng(0).integers(60, 200, (120, 120, 3), dtype=np.uint8)
    canvas = cv2.resize(noise, (7200, 7200), interpolation=cv2.INTER_CUBIC)  # ~1.6 MB as JPEG
    canvas[3344:3856, 3344:3856] = data.astronaut()
    return encode(canvas, "JPEG", quality=40)


@pytest.mark.slow
def test_a_grow_too_large_to_draw_is_the_clients_refusal_and_takes_no_host_out(cluster: Cluster) -> None:
    """The host counts what the answer would draw before it draws it (1004, saying the
    limit); the gateway passes the refusal on, ejects nobody and retries nowhere."""
    photo = _noisy_7200_jpeg()
    with httpx.Client(base_url=cluster.gateway.url, timeout=120, headers={HEADER_TOKEN: cluster.files.token}) as client:
        body = client.post("/api/v1/hair/grow", files={"image": ("big.jpg", photo, "image/jpeg")}).json()
        health = client.get("/gateway-health").json()
        after = client.post(MEASURE, files={"image": ("a.png", astronaut_png(), "image/png")}).json()
    assert (body["code"], body["data"]) == (1004, None), body
    assert "6 张 7200×7200" in body["message"] and "上限 120" in body["message"], body["message"]
    assert health["workers_healthy"] == 2, health
    assert after["code"] == 0, after
    served = cluster.gateway.poll_until(lambda: _logged(cluster, "/api/v1/hair/grow"), "the /grow logged", 10)
    assert [(entry["attempts"], entry["failed_workers"]) for entry in served] == [(1, [])], served  # no retry


@pytest.mark.slow
def test_with_every_host_stopped_the_gateway_monitor_is_503(cluster: Cluster) -> None:
    for host in cluster.hosts:
        assert host.stop() == 0
    deadline = time.monotonic() + 30
    with httpx.Client(base_url=cluster.gateway.url, timeout=5) as client:
        while (monitor := client.get("/monitor")).status_code != 503 and time.monotonic() < deadline:
            time.sleep(0.1)  # the gateway's prober notices on its own schedule
        answer = client.post(MEASURE, files={"image": ("a.png", astronaut_png(), "image/png")}).json()
    assert monitor.status_code == 503
    assert (answer["code"], answer["message"]) == (1007, "后端服务暂不可用，请稍后重试")
