"""`hairgate edge` refuses bad settings with one clear line naming the key, and no traceback."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from cluster.cli import main

GOOD_EDGE = '[edge]\nbind = "127.0.0.1:18160"\n[edge.pool]\nworkers = ["http://127.0.0.1:18161"]\n'
GOOD_SECRETS = '[auth]\nshared_password = "s3cret-value"\n'


@pytest.fixture(autouse=True)
def no_secret_environment(monkeypatch) -> None:
    for name in ("HAIRGATE_SHARED_PASSWORD", "HAIRGATE_ACCEPT_PASSWORDS"):
        monkeypatch.delenv(name, raising=False)


def write(tmp_path: Path, settings: str, secrets: str | None = GOOD_SECRETS) -> list[str]:
    (tmp_path / "settings.toml").write_text(settings)
    args = ["edge", "--config", str(tmp_path / "settings.toml")]
    if secrets is not None:
        (tmp_path / "secrets.toml").write_text(secrets)
        args += ["--secrets", str(tmp_path / "secrets.toml")]
    return args


@pytest.mark.parametrize(
    ("settings", "secrets", "extra", "named"),
    [
        (GOOD_EDGE, '[auth]\nshared_password = ""\n', [], "auth.shared_password"),
        (GOOD_EDGE, '[auth]\nshared_password = "s3cret-value\\n"\n', [], "auth.shared_password"),
        (GOOD_EDGE, None, [], "auth.shared_password"),
        (GOOD_EDGE + "[edge.dispatch]\nmax_inflight = 0\n", GOOD_SECRETS, [], "edge.dispatch.max_inflight"),
        (GOOD_EDGE + "[edge.health_check]\ninterval_secs = 3\n", GOOD_SECRETS, [], "edge.health_check.interval_secs"),
        ('[edge]\nbind = "127.0.0.1:18160"\n', GOOD_SECRETS, [], "edge.pool.workers"),
        (GOOD_EDGE, GOOD_SECRETS, ["--bind", "nonsense"], "edge.bind"),
        (GOOD_EDGE, GOOD_SECRETS, ["--bind", "127.0.0.1:99999"], "edge.bind"),
        ('[edge.pool]\nworkers = ["ftp://x"]\n', GOOD_SECRETS, [], "edge.pool.workers"),
    ],
)
def test_bad_settings_exit_non_zero_with_one_line(tmp_path: Path, capsys, settings, secrets, extra, named) -> None:
    assert main(write(tmp_path, settings, secrets) + extra) != 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and named in err, err
    assert "s3cret-value" not in err


def test_missing_config_file_names_it(tmp_path: Path, capsys) -> None:
    assert main(["edge", "--config", str(tmp_path / "absent.toml")]) != 0
    assert "absent.toml" in capsys.readouterr().err


def test_real_command_prints_no_traceback(tmp_path: Path) -> None:
    args = write(tmp_path, GOOD_EDGE, '[auth]\nshared_password = ""\n')
    repo = Path(__file__).resolve().parents[2]
    result = subprocess.run(
        [sys.executable, "-m", "cluster.cli", *args],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(repo)},
    )
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines() == [result.stderr.strip()] and "auth.shared_password" in result.stderr


def test_port_in_use_is_one_line_not_a_traceback(tmp_path: Path, capsys) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        args = [*write(tmp_path, GOOD_EDGE.replace("18161", "1"), GOOD_SECRETS), "--bind", f"127.0.0.1:{port}"]
        assert main(args) == 1
    err = capsys.readouterr().err
    assert f"cannot serve on 127.0.0.1:{port}" in err and "Traceback" not in err


def test_a_taken_metrics_port_is_named_alone(tmp_path: Path, capsys) -> None:
    with socket.socket() as taken, socket.socket() as spare:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        spare.bind(("127.0.0.1", 0))
        metrics_port, public_port = taken.getsockname()[1], spare.getsockname()[1]
        spare.close()  # free again: only the metrics listener's port is taken
        settings = GOOD_EDGE.replace("18161", "1").replace("18160", str(public_port))
        settings = settings.replace("[edge.pool]", f'metrics_bind = "127.0.0.1:{metrics_port}"\n[edge.pool]')
        assert main(write(tmp_path, settings, GOOD_SECRETS)) == 1
    err = capsys.readouterr().err  # the public listener's "Running on …" line may come before
    assert f"hairgate edge: cannot serve on 127.0.0.1:{metrics_port}: " in err.strip().splitlines()[-1]
    assert str(public_port) not in err.strip().splitlines()[-1] and "Traceback" not in err
