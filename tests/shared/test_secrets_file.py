"""`shared.secrets_file`: one key rewritten, comments kept, atomic, 0600, never a torn file."""

from __future__ import annotations

import os
import stat
import tomllib
from pathlib import Path

import pytest

from shared.secrets_file import (
    SecretsFileError,
    SecretsSource,
    check_token_strength,
    is_acceptable_token,
    read_secret,
    write_secret,
)
from shared.settings import ENV_SHARED_PASSWORD, load_settings

ORIGINAL = """\
# Secrets of this gateway: never commit.
[auth]
shared_password = "old-token-0123456789"  # rotated by scripts/rotate_token.py
accept_passwords = ["old-token-0123456789"]

[edge.features]
api_key = "sk-keep-me"
"""


def test_rewrites_one_key_and_keeps_everything_else(tmp_path: Path) -> None:
    path = tmp_path / "secrets.toml"
    path.write_text(ORIGINAL)
    write_secret(path, "auth.shared_password", "new-token-abcdefghij")
    text = path.read_text()
    assert "# Secrets of this gateway: never commit." in text
    assert "# rotated by scripts/rotate_token.py" in text
    parsed = tomllib.loads(text)
    assert parsed["auth"] == {
        "shared_password": "new-token-abcdefghij",
        "accept_passwords": ["old-token-0123456789"],
    }
    assert parsed["edge"]["features"]["api_key"] == "sk-keep-me"


def test_a_list_value_is_what_settings_then_load(tmp_path: Path) -> None:
    config = tmp_path / "settings.toml"
    config.write_text("")
    secrets = tmp_path / "secrets.toml"
    secrets.write_text(ORIGINAL)
    write_secret(secrets, "auth.accept_passwords", ["old-token-0123456789", "new-token-abcdefghij"])
    settings = load_settings(config, secrets, environ={})
    assert settings.auth.accept_passwords == ("old-token-0123456789", "new-token-abcdefghij")
    assert read_secret(secrets, "auth.accept_passwords") == ["old-token-0123456789", "new-token-abcdefghij"]


def test_file_is_0600_and_no_temp_file_is_left(tmp_path: Path) -> None:
    path = tmp_path / "secrets.toml"
    path.write_text(ORIGINAL)
    path.chmod(0o644)
    write_secret(path, "auth.shared_password", "new-token-abcdefghij")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert sorted(os.listdir(tmp_path)) == ["secrets.toml"]


def test_missing_file_is_created_with_the_key(tmp_path: Path) -> None:
    path = tmp_path / "secrets.toml"
    write_secret(path, "auth.shared_password", "first-token-0123456789")
    assert read_secret(path, "auth.shared_password") == "first-token-0123456789"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_the_rename_replaces_the_file_whole(tmp_path: Path) -> None:
    """A reader holding the old file keeps reading the old content: the inode was replaced."""
    path = tmp_path / "secrets.toml"
    path.write_text(ORIGINAL)
    with path.open() as old:
        write_secret(path, "auth.shared_password", "new-token-abcdefghij")
        assert "old-token-0123456789" in old.read().split("accept_passwords")[0]
    assert read_secret(path, "auth.shared_password") == "new-token-abcdefghij"


def test_a_write_that_cannot_happen_raises_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "gone" / "secrets.toml"  # its directory does not exist (also as root)
    with pytest.raises(SecretsFileError, match=r"cannot write beside the secrets file .*gone"):
        write_secret(path, "auth.shared_password", "new-token-abcdefghij")


def test_invalid_toml_error_does_not_quote_the_file(tmp_path: Path) -> None:
    path = tmp_path / "secrets.toml"
    path.write_text('[auth]\nshared_password = "secret-value-123456\n')
    with pytest.raises(SecretsFileError) as raised:
        write_secret(path, "auth.shared_password", "new-token-abcdefghij")
    assert "secret-value" not in str(raised.value)


def test_source_is_the_environment_only_when_its_variable_is_set(tmp_path: Path) -> None:
    config = tmp_path / "settings.toml"
    beside = SecretsSource.locate(config, None, ENV_SHARED_PASSWORD, environ={})
    assert beside.path == tmp_path / "secrets.toml" and not beside.from_environment
    named = SecretsSource.locate(config, tmp_path / "s.toml", ENV_SHARED_PASSWORD, environ={ENV_SHARED_PASSWORD: "x"})
    assert named.path == tmp_path / "s.toml" and named.from_environment


@pytest.mark.parametrize(
    ("token", "reason"),
    [
        ("a" * 16, "至少要有 8 个不同的字符"),  # issue 15: 16 identical characters were accepted
        ("abcdabcdabcdabcd", "至少要有 8 个不同的字符"),  # 4 distinct
        ("short-token", "至少 16 个字符"),
        ("has a space in it, long enough", "可打印 ASCII"),
        ("non-ascii-token-\u00e9\u00e9\u00e9\u00e9", "可打印 ASCII"),
    ],
)
def test_a_weak_token_is_refused_with_its_reason(token: str, reason: str) -> None:
    refusal = check_token_strength(token)
    assert refusal is not None and reason in refusal
    assert token not in refusal, "the reason never quotes the token"
    assert not is_acceptable_token(token)


@pytest.mark.parametrize("token", ["abcdefgh" * 2, "a" * 9 + "bcdefgh", "0123456789abcdef0123"])
def test_a_token_with_eight_distinct_characters_is_taken(token: str) -> None:
    assert check_token_strength(token) is None
    assert is_acceptable_token(token)
