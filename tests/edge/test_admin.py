"""The gateway's admin routes, through the app: the token switch, the pool listing, and
the lock a switch shares with a settings reload."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import trio

from edge.app import create_app
from edge.gateway import Gateway, build_gateway
from edge.pool.prober import Prober
from edge.reload import reload_settings
from edge.web.server import GatewayConfig
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
    """Stands in for `edge.pool.upstream.Upstream`: records the token it is told to send."""

    def __init__(self) -> None:
        self.tokens: list[str] = []

    def set_token(self, token: str) -> None:
        self.tokens.append(token)

    async def probe(self, url: str, timeout: float, wanted: bool = False):  # pragma: no cover - no probe runs here
        raise AssertionError

    async def aclose(self) -> None:
        pass


async def set_token(gateway: Gateway, body: bytes, secrets: SecretsSource | None) -> tuple[int, dict]:
    gateway.secrets = secrets
    response = (
        await create_app(gateway)
        .test_client()
        .post("/admin/token", data=body, headers={"X-Internal-Token": gateway.settings.auth.shared_password})
    )
    return response.status_code, json.loads(await response.get_data())


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


# what a probe reported: none here
NO_CHECKS = {"checks": {}, "inference_timeout_seconds": None, "model_version": None}


async def test_workers_lists_every_worker_with_its_state(gateway: Gateway, secrets: SecretsSource) -> None:
    bring_online(gateway, 0, 2)
    response = await create_app(gateway).test_client().get("/admin/workers", headers={"X-Internal-Token": TOKEN})
    assert response.status_code == 200
    assert json.loads(await response.get_data()) == {
        "workers": [
            {"index": 0, "url": WORKERS[0], "online": True, "primary": True, **NO_CHECKS},
            {"index": 1, "url": WORKERS[1], "online": False, "primary": True, **NO_CHECKS},
            {"index": 2, "url": WORKERS[2], "online": True, "primary": False, **NO_CHECKS},
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
    status, answer = await set_token(gateway, token_body(NEW_TOKEN), secrets)
    assert (status, answer) == (200, {"status": "ok", "fingerprint": token_fingerprint(NEW_TOKEN)})
    assert gateway.settings.auth.shared_password == NEW_TOKEN  # the record a reload starts from
    assert gateway.entrance.token == NEW_TOKEN  # what the router checks from now on
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
    for _ in range(2):
        status, _ = await set_token(gateway, token_body(NEW_TOKEN), secrets)
        assert status == 200
    assert gateway.settings.auth.shared_password == NEW_TOKEN


async def test_token_from_the_environment_is_refused_and_nothing_changes(
    gateway: Gateway, secrets: SecretsSource, upstream: RecordingUpstream
) -> None:
    from_env = SecretsSource(secrets.path, ENV_SHARED_PASSWORD, from_environment=True)
    status, answer = await set_token(gateway, token_body(NEW_TOKEN), from_env)
    assert status == 409
    assert ENV_SHARED_PASSWORD in answer["message"]
    assert gateway.settings.auth.shared_password == TOKEN and upstream.tokens == []
    assert secrets.path.read_text() == SECRETS


async def test_a_failed_write_changes_nothing(gateway: Gateway, upstream: RecordingUpstream, tmp_path: Path) -> None:
    nowhere = SecretsSource(tmp_path / "missing-dir" / "secrets.toml", ENV_SHARED_PASSWORD, from_environment=False)
    status, answer = await set_token(gateway, token_body(NEW_TOKEN), nowhere)
    assert status == 500
    assert NEW_TOKEN not in json.dumps(answer)
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
        token_body("a" * 16),  # long enough, but one distinct character (gateway.md: at least 8)
        token_body("has a space in it, long enough"),
        token_body("non-ascii-token-\u00e9\u00e9\u00e9\u00e9"),
        token_body("line-break-token\r\nX-Injected: 1"),
    ],
)
async def test_bad_bodies_are_400_and_change_nothing(
    gateway: Gateway, secrets: SecretsSource, upstream: RecordingUpstream, body: bytes
) -> None:
    status, _ = await set_token(gateway, body, secrets)
    assert status == 400
    assert gateway.settings.auth.shared_password == TOKEN and upstream.tokens == []
    assert secrets.path.read_text() == SECRETS


async def test_a_switch_and_a_reload_do_not_undo_each_other(
    gateway: Gateway, secrets: SecretsSource, upstream: RecordingUpstream, tmp_path: Path
) -> None:
    # A SIGHUP that read the secrets file before the switch wrote it, and applied them
    # after the switch, put the old token back in memory (and the file kept the new one).
    read_started, may_finish = trio.Event(), trio.Event()
    settings_file = tmp_path / "settings.toml"
    settings_file.write_text("")

    def read_settings():
        before = load_settings(settings_file, secrets.path, environ={})
        trio.from_thread.run_sync(read_started.set)
        trio.from_thread.run(may_finish.wait)
        return before.model_copy(update={"edge": gateway.settings.edge})

    prober = Prober(gateway.dispatcher, gateway.upstream.probe, path="/health", interval_seconds=8, timeout_seconds=3)
    app = create_app(gateway)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(reload_settings, gateway, app, prober, GatewayConfig(gateway.settings.edge), read_settings)
        await read_started.wait()
        nursery.start_soon(set_token, gateway, token_body(NEW_TOKEN), secrets)
        with trio.fail_after(5):  # the switch is done, or waits for the reload
            while not upstream.tokens and not gateway.settings_lock.statistics().tasks_waiting:
                await trio.sleep(0.01)
        may_finish.set()
    assert gateway.settings.auth.shared_password == NEW_TOKEN, "the reload did not undo the switch"
    reloaded = load_settings(settings_file, secrets.path, environ={})
    assert reloaded.auth.shared_password == NEW_TOKEN
