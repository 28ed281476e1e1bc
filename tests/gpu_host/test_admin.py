"""`GET/POST /admin/tokens` of a GPU host, mounted behind the host's token check."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpu_host.admin import AdminRefusal, HostTokens
from gpu_host.auth import TokenGuard
from shared.contract import HEADER_TOKEN
from shared.secrets_file import SecretsSource, read_secret
from shared.settings import ENV_ACCEPT_PASSWORDS, token_fingerprint
from tests.fakes.admin_host import host_app

OLD = "old-host-token-0123456789"
NEW = "new-host-token-abcdefghij"
SECRETS = f'# host secrets\n[auth]\naccept_passwords = ["{OLD}"]  # managed by /admin/tokens\n'


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def secrets(tmp_path: Path) -> SecretsSource:
    path = tmp_path / "secrets.toml"
    path.write_text(SECRETS)
    return SecretsSource(path, ENV_ACCEPT_PASSWORDS, from_environment=False)


@pytest.fixture
def guard() -> TokenGuard:
    return TokenGuard((OLD,))


@pytest.fixture
def tokens(guard: TokenGuard, secrets: SecretsSource, clock: Clock) -> HostTokens:
    return HostTokens(guard, (OLD,), secrets, clock=clock)


@pytest.fixture
def client(guard: TokenGuard, tokens: HostTokens) -> Any:
    return host_app(guard, tokens).test_client()


async def call(client: Any, token: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
    headers = {HEADER_TOKEN: token}
    if body is None:
        response = await client.get("/admin/tokens", headers=headers)
    else:
        response = await client.post("/admin/tokens", headers=headers, json=body)
    return response.status_code, await response.get_json()


async def test_listing_reports_last_use_per_token(client: Any, clock: Clock) -> None:
    status, body = await call(client, OLD)
    assert status == 200
    assert body == {"tokens": [{"fingerprint": token_fingerprint(OLD), "last_used_seconds_ago": 0.0}]}
    clock.now += 3.25
    await call(client, OLD, {"add": NEW})
    clock.now += 2
    _, body = await call(client, NEW)
    assert body["tokens"] == [
        {"fingerprint": token_fingerprint(OLD), "last_used_seconds_ago": 2.0},
        {"fingerprint": token_fingerprint(NEW), "last_used_seconds_ago": 0.0},
    ]


async def test_unused_token_reports_null(tokens: HostTokens) -> None:
    assert tokens.listing() == [{"fingerprint": token_fingerprint(OLD), "last_used_seconds_ago": None}]


async def test_add_then_remove_rotates_the_guard_and_the_file(
    client: Any, guard: TokenGuard, secrets: SecretsSource
) -> None:
    status, body = await call(client, OLD, {"add": NEW})
    assert status == 200 and [t["fingerprint"] for t in body["tokens"]] == [
        token_fingerprint(OLD),
        token_fingerprint(NEW),
    ]
    assert guard.is_accepted(NEW) and guard.is_accepted(OLD)
    assert read_secret(secrets.path, "auth.accept_passwords") == [OLD, NEW]
    status, body = await call(client, NEW, {"remove": token_fingerprint(OLD)})
    assert status == 200 and [t["fingerprint"] for t in body["tokens"]] == [token_fingerprint(NEW)]
    assert not guard.is_accepted(OLD)
    assert (await call(client, OLD))[0] == 401
    assert read_secret(secrets.path, "auth.accept_passwords") == [NEW]
    assert "# managed by /admin/tokens" in secrets.path.read_text()


async def test_add_and_remove_are_idempotent(client: Any, secrets: SecretsSource) -> None:
    for _ in range(2):
        assert (await call(client, OLD, {"add": NEW}))[0] == 200
    for _ in range(2):
        assert (await call(client, NEW, {"remove": token_fingerprint(OLD)}))[0] == 200
    assert read_secret(secrets.path, "auth.accept_passwords") == [NEW]


async def test_removing_the_callers_own_token_is_refused(client: Any, guard: TokenGuard) -> None:
    await call(client, OLD, {"add": NEW})
    status, body = await call(client, OLD, {"remove": token_fingerprint(OLD)})
    assert status == 409 and "authenticated with" in body["message"]
    assert guard.is_accepted(OLD)


async def test_removing_the_last_token_is_refused(guard: TokenGuard, secrets: SecretsSource, clock: Clock) -> None:
    tokens = HostTokens(guard, (OLD,), secrets, clock=clock)
    with pytest.raises(AdminRefusal, match="last accepted token"):
        await tokens.remove(token_fingerprint(OLD), caller_token=NEW)
    assert guard.is_accepted(OLD)


async def test_tokens_from_the_environment_cannot_change(guard: TokenGuard, secrets: SecretsSource) -> None:
    from_env = SecretsSource(secrets.path, ENV_ACCEPT_PASSWORDS, from_environment=True)
    client = host_app(guard, HostTokens(guard, (OLD,), from_env)).test_client()
    status, body = await call(client, OLD, {"add": NEW})
    assert status == 409 and ENV_ACCEPT_PASSWORDS in body["message"]
    assert not guard.is_accepted(NEW)
    assert secrets.path.read_text() == SECRETS


@pytest.mark.parametrize(
    "body",
    [{"add": "short-token"}, {"add": "with spaces inside it"}, {"add": 1234567890123456789}, {"drop": "x"}, {}],
)
async def test_bad_bodies_are_1001_style_400(client: Any, guard: TokenGuard, body: dict[str, Any]) -> None:
    status, answer = await call(client, OLD, body)
    assert status == 400 and answer["code"] == 1001
    assert (await call(client, OLD))[1]["tokens"] == [
        {"fingerprint": token_fingerprint(OLD), "last_used_seconds_ago": 0.0}
    ]


async def test_without_a_token_no_admin_logic_runs(client: Any, guard: TokenGuard) -> None:
    status, _ = await call(client, "wrong-token-0123456789", {"add": NEW})
    assert status == 401 and not guard.is_accepted(NEW)


async def test_sighup_reload_keeps_usage_of_tokens_still_accepted(tokens: HostTokens, clock: Clock) -> None:
    tokens.authenticated(OLD)
    clock.now += 5
    tokens.reload((OLD, NEW))
    assert tokens.listing() == [
        {"fingerprint": token_fingerprint(OLD), "last_used_seconds_ago": 5.0},
        {"fingerprint": token_fingerprint(NEW), "last_used_seconds_ago": None},
    ]


async def test_a_token_of_few_distinct_characters_is_refused_saying_why(client: Any, guard: TokenGuard) -> None:
    # issue 15 item 13: 16 identical characters are 16 characters and no secret
    status, answer = await call(client, OLD, {"add": "a" * 16})
    assert status == 400 and answer["code"] == 1001 and "8" in answer["message"]
    assert "a" * 16 not in answer["message"]
    assert not guard.is_accepted("a" * 16)


async def test_json_nested_deeper_than_the_parser_goes_is_a_400_not_a_traceback(client: Any, guard: TokenGuard) -> None:
    # issue 15 item 15: 50,000-deep JSON used to end in a RecursionError and HTTP 500
    deep = b"[" * 50_000 + b"]" * 50_000
    response = await client.post("/admin/tokens", headers={HEADER_TOKEN: OLD}, data=deep)
    answer = await response.get_json()
    assert response.status_code == 400 and answer["code"] == 1001
    assert "Traceback" not in await response.get_data(as_text=True)
