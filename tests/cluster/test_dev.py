"""`hairgate dev`: valid settings for both roles, a private token, working commands, a cluster with no hole."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from cluster.dev import banner, holding, prepare, supervise
from cluster.launcher import REPO_ROOT, Service, free_port
from shared.settings import load_settings
from tests.gpu_host.processes import is_running
from tests.test_dependencies import make_plan


def test_prepare_writes_settings_both_roles_accept_and_a_private_token(tmp_path: Path) -> None:
    cluster = prepare(REPO_ROOT / "settings.toml", 3, 20480, 20481, tmp_path)
    settings = load_settings(cluster.settings_path, cluster.secrets_path, environ={})
    again = prepare(REPO_ROOT / "settings.toml", 3, 20480, 20481, tmp_path)

    assert settings.edge.pool.workers == ("http://127.0.0.1:20481", "http://127.0.0.1:20482", "http://127.0.0.1:20483")
    assert settings.edge.public_base_url == "http://127.0.0.1:20480"
    assert settings.auth.shared_password == cluster.token
    assert settings.auth.accept_passwords == (cluster.token,)
    assert len(cluster.token) >= 32 and again.token != cluster.token
    assert cluster.secrets_path.stat().st_mode & 0o777 == 0o600
    assert cluster.token not in cluster.settings_path.read_text()
    assert [service.argv[-1] for service in cluster.hosts] == ["127.0.0.1:20481", "127.0.0.1:20482", "127.0.0.1:20483"]
    assert "edge" in cluster.gateway.argv and cluster.gateway.argv[-1] == "127.0.0.1:20480"
    assert "curl -F image=@photo.jpg http://127.0.0.1:20480/api/v1/hair/measure" in banner(cluster, None)
    assert cluster.token not in banner(cluster, None)


def test_a_service_that_exits_on_its_own_stops_the_rest_and_dev_exits_1(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    cluster = prepare(REPO_ROOT / "settings.toml", 1, free_port(), free_port(), tmp_path)
    fifo = tmp_path / "pid"
    os.mkfifo(fifo)  # the gateway gives up only once the host runs (and said which pid it has)
    host_code = f"import os, time; open({str(fifo)!r}, 'w').write(str(os.getpid())); time.sleep(120)"
    gateway_code = f"print('giving up, host pid', open({str(fifo)!r}).read(), flush=True); raise SystemExit(3)"
    host = Service("gpu-host-1", [sys.executable, "-c", host_code], "http://127.0.0.1:9")
    gateway = Service("gateway", [sys.executable, "-c", gateway_code], "http://127.0.0.1:9")

    exit_code = supervise(replace(cluster, hosts=[host], gateway=gateway), photo=None)

    out, err = capfd.readouterr()
    said = re.search(r"gateway    \| giving up, host pid (\d+)", out)
    assert said is not None, out
    host_pid = int(said.group(1))
    assert exit_code == 1
    assert "ready" not in out
    assert "hairgate dev: gateway exited with code 3; stopped everything" in err
    assert not is_running(host_pid)


def test_a_dev_gateway_lets_the_benchmarks_burst(tmp_path: Path) -> None:
    """Issue 15: bench_gpu_host stopped with 请求过于频繁 against the shipped 30/min, burst 10."""
    from edge.admission.rate_limit import MemoryRateLimiter

    cluster = prepare(REPO_ROOT / "settings.toml", 1, free_port(), free_port(), tmp_path)
    limit = load_settings(cluster.settings_path, cluster.secrets_path, environ={}).edge.rate_limit
    limiter = MemoryRateLimiter(limit.requests_per_minute, limit.burst, clock=lambda: 0.0)
    assert limit.enabled, "the limit stays on in dev: its answers can be tried"
    assert all(limiter.check_now("ip:127.0.0.1").allowed for _ in range(1000)), "1000 requests back to back"


def test_every_dev_option_explains_itself_and_shows_its_default() -> None:
    from cluster.cli import build_parser

    commands = next(action for action in build_parser()._actions if action.dest == "command")
    dev = commands.choices["dev"]  # type: ignore[index]
    options = [action for action in dev._actions if action.option_strings and action.dest != "help"]
    assert {action.dest for action in options} == {"workers", "config", "port", "first_worker_port", "metrics_port"}
    text = " ".join(dev.format_help().split())
    for action in options:
        assert action.help, action.dest
        assert f"(default: {action.default})" in text, action.dest


def test_make_run_passes_its_ports_and_config_to_hairgate_dev() -> None:
    variables = ["PORT=18080", "METRICS_PORT=19464", "WORKER_PORT=28300", "WORKERS=3", "CONFIG=my.toml"]
    plan = make_plan("-o", ".venv/.installed", "run", *variables)
    command = " ".join(plan.replace("\\\n", " ").split())
    assert (
        "hairgate dev --config my.toml --workers 3 --port 18080 --metrics-port 19464 --first-worker-port 28300"
    ) in command


def test_a_second_dev_run_from_the_same_directory_refuses_and_leaves_the_first_ones_token(tmp_path: Path) -> None:
    with holding(tmp_path / "var" / "dev"):
        first = prepare(REPO_ROOT / "settings.toml", 1, free_port(), free_port(), tmp_path / "var" / "dev")
        second = subprocess.run(
            [sys.executable, "-m", "cluster.cli", "dev", "--config", str(REPO_ROOT / "settings.toml")],
            cwd=tmp_path,
            env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert second.returncode == 2, second.stderr
        assert f"another `hairgate dev` (pid {os.getpid()}) runs from var/dev: stop it first" in second.stderr
        assert first.token in first.secrets_path.read_text(), "the first run's token is not overwritten"
    with holding(tmp_path / "var" / "dev"):
        pass  # free again once the first run let go
