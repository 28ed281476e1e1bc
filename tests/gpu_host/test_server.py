"""`hairgate gpu-host` as an operator runs it: a real process, the real model child, real photos."""

from __future__ import annotations

import base64
import io
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from PIL import Image

from cluster.launcher import child_env
from gpu_host.version import host_model_version
from shared.contract import HEADER_MODEL_VERSION, HEADER_TOKEN
from tests.gpu_host.processes import (
    REPO_ROOT,
    astronaut_png,
    cluster_files,
    is_running,
    mapped_libraries,
    model_child_pid,
    set_settings,
    start,
    wait_for,
)

MEASURE = "/api/v1/hair/measure"


def test_real_host_opens_at_once_loads_in_the_child_serves_and_stops_cleanly(tmp_path: Path) -> None:
    cluster = cluster_files(tmp_path, hosts=1)
    host = start(cluster.hosts[0], tmp_path)
    try:
        first = wait_for(host, cluster.token, lambda r: True, "the port to open")
        ready = wait_for(host, cluster.token, lambda r: r.status_code == 200, "ready")
        model_pid = model_child_pid(host.pid)
        with httpx.Client(base_url=host.url, timeout=120, headers={HEADER_TOKEN: cluster.token}) as client:
            answer = client.post(MEASURE, files={"image": ("astronaut.png", astronaut_png(), "image/png")})
            unauthorized = client.get("/health", headers={HEADER_TOKEN: "nope"})
        web_maps, model_maps = mapped_libraries(host.pid), mapped_libraries(model_pid)
    finally:
        exit_code = host.stop(signal.SIGTERM)
    # the port opened before the models were loaded
    # its model version, hashed by the web process at its start (no BiSeNet, no ComfyUI)
    version = host_model_version("", None).value
    deep = {"inference_timeout_seconds": 50, "model_version": version, "checks": {"disk": "ok", "comfyui": "off"}}
    first_body, ready_body = first.json(), ready.json()
    ages = [body.pop("disk_age_seconds") for body in (first_body, ready_body)]  # the disk reading's
    assert all(isinstance(age, float) and 0 <= age < 10 for age in ages), ages
    assert (first.status_code, first_body) == (503, {"status": "loading", **deep})
    ready = {"status": "ok", "device": "cpu", "segmenter": "hairnet", "busy": False, "wanted": False}
    assert ready_body == {**ready, **deep}
    body = answer.json()
    assert (body["code"], answer.headers["X-Request-ID"]) == (0, body["request_id"]), body
    assert answer.headers[HEADER_MODEL_VERSION] == version
    annotated = Image.open(io.BytesIO(base64.b64decode(body["data"]["annotated_image_base64"])))
    assert (annotated.format, annotated.size) == ("PNG", (512, 512))
    assert unauthorized.status_code == 401
    # only the child loaded the heavy libraries
    assert "mediapipe" in model_maps
    assert "mediapipe" not in web_maps and "torch" not in web_maps and "cv2" not in web_maps
    assert exit_code == 0
    assert not is_running(model_pid)
    assert cluster.token not in host.log_text()


def test_web_process_modules_never_include_torch_or_mediapipe() -> None:
    script = """
import sys
from gpu_host import admin, app, auth, comfyui, connections, main, metrics, model_process, protocol, supervisor, version
from gpu_host.auth import TokenGuard
from shared.contract import uploads
from shared.settings import Settings
settings = Settings()
model = model_process.ModelProcess(
    main.child_config(settings), inference_timeout_seconds=1, model_load_timeout_seconds=1
)
client = comfyui.ComfyUIClient("http://127.0.0.1:1", comfyui.load_workflow(""), 1)
model_version = version.host_model_version("", comfyui.load_workflow("")).value  # hashes the analysis's data
app.create_app(model, TokenGuard(("t",)), settings.analysis, model_version=model_version, comfyui=client)
print(sorted(m for m in ("torch", "mediapipe", "cv2", "numpy") if m in sys.modules))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO_ROOT, check=True)
    assert out.stdout.strip() == "[]", out.stderr


@pytest.mark.parametrize(
    ("secrets", "extra_settings", "bind", "names"),
    [
        ('[auth]\nshared_password = "x"\n', "", "127.0.0.1:20001", "auth.accept_passwords"),
        (
            '[auth]\naccept_passwords = ["t"]\n',
            "[gpu_host]\ninference_timeout_seconds = -1\n",
            "127.0.0.1:20001",
            "gpu_host.inference_timeout_seconds",
        ),
        ('[auth]\naccept_passwords = ["t"]\n', "[gpu_host]\nbogus = 1\n", "127.0.0.1:20001", "gpu_host.bogus"),
        ('[auth]\naccept_passwords = ["t"]\n', "", "nonsense", "bind"),
        (
            '[auth]\naccept_passwords = ["t"]\n',
            '[gpu_host]\ncomfyui_workflow = "/nope/workflow.json"\n',
            "127.0.0.1:20001",
            "gpu_host.comfyui_workflow",
        ),
        (
            '[auth]\naccept_passwords = ["t"]\n',
            f'[gpu_host]\ncertfile = "{__file__}"\nkeyfile = "{__file__}"\n',
            "127.0.0.1:20001",
            "gpu_host.certfile",
        ),
    ],
)
def test_bad_settings_exit_non_zero_with_one_line_naming_the_key(
    tmp_path: Path, secrets: str, extra_settings: str, bind: str, names: str
) -> None:
    (tmp_path / "settings.toml").write_text(extra_settings)
    (tmp_path / "secrets.toml").write_text(secrets)
    command = [
        sys.executable,
        "-m",
        "cluster.cli",
        "gpu-host",
        "--config",
        str(tmp_path / "settings.toml"),
        "--bind",
        bind,
    ]
    out = subprocess.run(command, capture_output=True, text=True, cwd=REPO_ROOT, env=child_env(), timeout=60)
    assert out.returncode != 0
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and names in lines[0], out.stderr


@pytest.mark.slow
def test_missing_weights_file_keeps_the_host_up_and_says_why(tmp_path: Path) -> None:
    cluster = cluster_files(tmp_path, hosts=1)
    set_settings(cluster.settings_path, "gpu_host", bisenet_weights=str(tmp_path / "79999_iter.pth"))
    host = start(cluster.hosts[0], tmp_path)
    try:
        failed = wait_for(host, cluster.token, lambda r: r.json().get("status") == "error", "the load error")
    finally:
        assert host.stop() == 0
    assert failed.status_code == 503
    assert "79999_iter.pth" in failed.json()["message"]


@pytest.mark.slow
def test_sigkilled_model_child_is_replaced_and_the_next_request_works(tmp_path: Path) -> None:
    cluster = cluster_files(tmp_path, hosts=1)
    host = start(cluster.hosts[0], tmp_path)
    try:
        wait_for(host, cluster.token, lambda r: r.status_code == 200, "ready")
        victim = model_child_pid(host.pid)
        os.kill(victim, signal.SIGKILL)
        killed_at = time.monotonic()
        wait_for(host, cluster.token, lambda r: r.status_code == 503, "503 after the crash")
        wait_for(host, cluster.token, lambda r: r.status_code == 200, "ready again")
        recovered_after = time.monotonic() - killed_at
        with httpx.Client(base_url=host.url, timeout=120, headers={HEADER_TOKEN: cluster.token}) as client:
            answer = client.post(MEASURE, files={"image": ("a.png", astronaut_png(), "image/png")})
        successor = model_child_pid(host.pid)
    finally:
        host.stop()
    assert answer.json()["code"] == 0
    assert successor != victim
    print(f"recovered in {recovered_after:.1f} s")


def test_sighup_swaps_the_accepted_tokens_without_a_restart(tmp_path: Path) -> None:
    cluster = cluster_files(tmp_path, hosts=1)
    host = start(cluster.hosts[0], tmp_path)
    new_token = "rotated-" + cluster.token[:8]
    try:
        wait_for(host, cluster.token, lambda r: r.status_code != 401, "the old token accepted")
        cluster.secrets_path.write_text(f'[auth]\naccept_passwords = ["{new_token}"]\n')
        host.process.send_signal(signal.SIGHUP)
        wait_for(host, new_token, lambda r: r.status_code != 401, "the new token accepted")
        with httpx.Client(timeout=5) as client:
            old = client.get(cluster.hosts[0].health_url, headers={HEADER_TOKEN: cluster.token})
        still_running = host.process.poll() is None
    finally:
        host.stop()
    assert old.status_code == 401
    assert still_running
    assert "accept_passwords reloaded | count=1" in host.log_text()
    assert new_token not in host.log_text() and cluster.token not in host.log_text()


def test_a_taken_port_exits_1_with_one_line_and_leaves_no_model_child(tmp_path: Path) -> None:
    import re
    import socket

    cluster = cluster_files(tmp_path, hosts=1)
    port = int(cluster.hosts[0].argv[-1].rsplit(":", 1)[1])
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", port))
        squatter.listen()
        out = subprocess.run(cluster.hosts[0].argv, capture_output=True, text=True, env=child_env(), timeout=60)
    assert out.returncode == 1
    assert f"cannot serve on 127.0.0.1:{port}" in out.stderr.strip().splitlines()[-1]
    started = re.search(r"model process started \| pid=(\d+)", out.stderr)
    assert started is None or not is_running(int(started[1]))


def test_an_address_that_is_not_ours_is_reported_as_itself_before_anything_starts(tmp_path: Path) -> None:
    cluster = cluster_files(tmp_path, hosts=1)
    argv = [*cluster.hosts[0].argv[:-1], "192.0.2.1:20001"]  # TEST-NET-1: no interface has it
    out = subprocess.run(argv, capture_output=True, text=True, env=child_env(), timeout=60)
    assert out.returncode == 1
    assert out.stderr.strip().splitlines()[-1] == (
        "hairgate gpu-host: cannot serve on 192.0.2.1:20001: [Errno 99] Cannot assign requested address"
    )
    assert "model process started" not in out.stderr  # the socket is bound before the model loads
