"""The two unit files pass `systemd-analyze verify` and say what operations.md § systemd asks.

`verify` also checks that the ExecStart binary exists; a test machine has no
/opt/hairgate, so the units are verified as copies in which that one path points at a
stand-in executable. Any warning counts as a failure (verify exits 0 on unknown keys).
"""

from __future__ import annotations

import configparser
import shutil
import subprocess
from pathlib import Path

import pytest

UNITS = Path(__file__).resolve().parents[1] / "systemd"
UNIT_NAMES = ["hair-gateway.service", "hair-gpu-host.service"]
INSTALLED_BINARY = "/opt/hairgate/.venv/bin/hairgate"


def service_section(name: str) -> dict[str, str]:
    parser = configparser.ConfigParser(strict=False, interpolation=None, delimiters=("=",))
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read(UNITS / name)
    return dict(parser["Service"])


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed here")
@pytest.mark.parametrize("name", UNIT_NAMES)
def test_unit_passes_systemd_analyze_verify(name: str, tmp_path: Path) -> None:
    stand_in = tmp_path / "hairgate"
    stand_in.write_text("#!/bin/sh\n")
    stand_in.chmod(0o755)
    text = (UNITS / name).read_text()
    assert INSTALLED_BINARY in text
    (tmp_path / name).write_text(text.replace(INSTALLED_BINARY, str(stand_in)))
    result = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", str(tmp_path / name)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0 and not result.stderr.strip(), result.stderr


@pytest.mark.parametrize("name", UNIT_NAMES)
def test_unit_reloads_restarts_and_may_rewrite_its_secrets(name: str) -> None:
    service = service_section(name)
    assert service["ExecReload"] == "/bin/kill -HUP $MAINPID"
    assert service["Restart"] == "always" and service["RestartSec"] == "3"
    assert service["NoNewPrivileges"] == "yes" and service["ProtectSystem"] == "strict"
    assert int(service["LimitNOFILE"]) >= 65536
    secrets_file = service["ExecStart"].split("--secrets ", 1)[1].split()[0]
    assert str(Path(secrets_file).parent) in service["ReadWritePaths"].split()
    assert "EnvironmentFile" not in service  # a token from the environment cannot be rotated
