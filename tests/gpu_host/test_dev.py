"""`hairgate dev`'s files: valid settings for both roles, a private token, working commands."""

from __future__ import annotations

from pathlib import Path

from gpu_host.dev import banner, prepare
from shared.settings import load_settings
from tests.gpu_host.processes import REPO_ROOT


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
