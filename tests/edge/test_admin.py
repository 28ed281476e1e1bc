"""The gateway's admin handlers, called directly with a constructed `Request`.

(The router's token check in front of them is tested with the route table.)
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from edge.web.admin import TokenAdmin
from edge.gateway import Gateway, build_gateway
from edge.pool.dispatch import ClientWatch
from edge.web.http import Request
from shared.secrets_file import SecretsSource
from shared.settings import ENV_SHARED_PASSWORD, load_settings, token_fingerprint
from tests.edge.conftest import TOKEN, WORKERS, bring_online, make_settings

NEW_TOKEN = "new-gateway-token-7c1d2e"
SECRETS = f"""\
# this gateway's secrets
[auth]
shared_password = "{TOKEN}"  # rotate with scripts/rotate_token.py
"""


class RecordingUpstream:
    """Stands in for `edge.forward.Upstream`: records the token it is told to send."""

    def __init__(self) -> None:
        self.tokens: list[str] = []

    def set_token(self, token: str) -> None:
        self.tokens.append(token)

    async def aclose(self) -> None:
        pass


def request(body: bytes = b"", method: str = "POST", path: str = "/admin/token") -> Request:
    return Request(method, path, "", {}, "127.0.0.1", "req-1", body, ClientWatch())


def token_body(token: object) -> bytes:
    return json.dumps({"shared_password": token}).encode()


@pytest.fixture
def upstream() -> RecordingUpstream:
    return RecordingUpstream()


@pytest.fixture
def gateway(tmp_path: Path, upstream: RecordingUpstream) -> Gateway:
    return build_gateway(make_settings(tmp_path), upstream=upstream)  # type: ignore[arg-type]


@pytest.fixture
def secrets(tmp_path: Path) -> SecretsSource:
    path = tmp_path / "secrets.toml"
    path.write_text(SECRETS)
    return SecretsSource(path, ENV_SHARED_PASSWORD, from_environment=False)


async def test_workers_lists_every_worker_with_its_state(gateway: Gateway, secrets: SecretsSource) -> None:
    bring_online(gateway, 0, 2)
    response = await TokenAdmin(gateway, secrets).workers(request(method="GET", path="/admin/workers"))
    assert response.status == 200
    assert json.loads(response.body) == {
        "workers": [
            {"index": 0, "url": WORKERS[0], "online": True, "primary": True},
            {"index": 1, "url": WORKERS[1], "online": False, "primary": True},
            {"index": 2, "url": WORKERS[2], "online": True, "primary": False},
        ]
    }


async def test_set_token_persists_then_switches(
    gateway: Gateway,
    secrets: SecretsSource,
    upstream: RecordingUpstream,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    response = await TokenAdmin(gateway, secrets).set_token(request(token_body(NEW_TOKEN)))
    assert response.status == 200
    assert json.loads(response.body) == {"status": "ok", "fingerprint": token_fingerprint(NEW_TOKEN)}
    assert gateway.settings.auth.shared_password == NEW_TOKEN  # what the router checks from now on
    assert upstream.tokens == [NEW_TOKEN]  # what forwards and probes send from now on
    text = secrets.path.read_text()
    assert "# rotate with scripts/rotate_token.py" in text
    (tmp_path / "settings.toml").write_text("")
    reloaded = load_settings(tmp_path / "settings.toml", secrets.path, environ={})
    assert reloaded.auth.shared_password == NEW_TOKEN  # a restart keeps it
    logged = "\n".join(record.getMessage() for record in caplog.records)
    assert token_fingerprint(NEW_TOKEN) in logged
    assert NEW_TOKEN not in logged and TOKEN not in logged


async def test_the_same_token_again_is_harmless(gateway: Gateway, secrets: SecretsSource) -> None:
    admin = TokenAdmin(gateway, secrets)
    for _ in range(2):
        response = await admin.set_token(request(token_body(NEW_TOKEN)))
        assert response.status == 200
    assert gateway.settings.auth.shared_password == NEW_TOKEN


async def test_token_from_the_environment_is_refused_and_nothing_changes(
    gateway: Gateway, secrets: SecretsSource, upstream: RecordingUpstream
) -> None:
    from_env = SecretsSource(secrets.path, ENV_SHARED_PASSWORD, from_environment=True)
    response = await TokenAdmin(gateway, from_env).set_token(request(token_body(NEW_TOKEN)))
    assert response.status == 409
    assert ENV_SHARED_PASSWORD in json.loads(response.body)["message"]
    assert gateway.settings.auth.shared_password == TOKEN and upstream.tokens == []
    assert secrets.path.read_text() == SECRETS


async def test_a_failed_write_changes_nothing(
    gateway: Gateway, upstream: RecordingUpstream, tmp_path: Path
) -> None:
    nowhere = SecretsSource(tmp_path / "missing-dir" / "secrets.toml", ENV_SHARED_PASSWORD, from_environment=False)
    response = await TokenAdmin(gateway, nowhere).set_token(request(token_body(NEW_TOKEN)))
    assert response.status == 500
    assert NEW_TOKEN not in response.body.decode()
    assert gateway.settings.auth.shared_password == TOKEN and upstream.tokens == []


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"not json",
        b"[]",
        json.dumps({"password": NEW_TOKEN}).encode(),
        json.dumps({"shared_password": NEW_TOKEN, "extra": 1}).encode(),
        token_body(None),
        token_body(12345678901234567890),
        token_body("short-token"),  # 11 characters
        token_body("has a space in it, long enough"),
        token_body("non-ascii-token-\u00e9\u00e9\u00e9\u00e9"),
        token_body("line-break-token\r\nX-Injected: 1"),
    ],
)
async def test_bad_bodies_are_400_and_change_nothing(
    gateway: Gateway, secrets: SecretsSource, upstream: RecordingUpstream, body: bytes
) -> None:
    response = await TokenAdmin(gateway, secrets).set_token(request(body))
    assert response.status == 400
    assert gateway.settings.auth.shared_password == TOKEN and upstream.tokens == []
    assert secrets.path.read_text() == SECRETS
