"""`hairgate dev`: valid settings for both roles, a private token, working commands, a cluster with no hole."""

from __future__ import annotations

import os
import re
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from cluster.dev import banner, prepare, supervise
from cluster.launcher import REPO_ROOT, Service, free_port
from shared.settings import load_settings
from tests.gpu_host.processes import is_running


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
    host_pid = int(re.search(r"gateway    \| giving up, host pid (\d+)", out).group(1))
    assert exit_code == 1
    assert "ready" not in out
    assert "hairgate dev: gateway exited with code 3; stopped everything" in err
    assert not is_running(host_pid)
