"""The admission settings of issue 8 (operations.md § Settings): defaults, and errors naming the key."""

from pathlib import Path

import pytest

from shared.settings import SettingsError, load_settings
from tests.shared.test_settings import REPO_SETTINGS, load_text


def test_committed_settings_name_every_admission_key_with_the_documented_defaults():
    edge = load_settings(REPO_SETTINGS, environ={}).edge
    assert edge.metrics_bind == "127.0.0.1:9464"
    assert edge.shared_state.redis_url == ""
    assert edge.shared_state.lease_seconds == 3
    limit = edge.rate_limit
    assert (limit.enabled, limit.requests_per_minute, limit.burst, limit.key_header) == (True, 120, 30, "")
    assert limit.trusted_proxies == ("127.0.0.1", "::1")
    assert edge.idempotency.max_entries == 100000
    text = REPO_SETTINGS.read_text()
    for key in (
        "metrics_bind",
        "redis_url",
        "lease_seconds",
        "requests_per_minute",
        "burst",
        "key_header",
        "trusted_proxies",
        "max_entries",
    ):
        assert f"\n{key} = " in text, f"{key} belongs in settings.toml, commented"


@pytest.mark.parametrize("url", ["redis://10.0.0.5:6379/0", "rediss://:pw@cache.internal:6380/1", ""])
def test_redis_urls_accepted(tmp_path: Path, url: str):
    load_text(tmp_path, f'[edge.shared_state]\nredis_url = "{url}"\n')


def test_a_redis_url_of_another_scheme_is_named_without_echoing_it(tmp_path: Path):
    with pytest.raises(SettingsError, match=r"edge\.shared_state\.redis_url.*redis://") as caught:
        load_text(tmp_path, '[edge.shared_state]\nredis_url = "http://:secret-pw@10.0.0.5:6379"\n')
    assert "secret-pw" not in str(caught.value)


@pytest.mark.parametrize(
    ("section", "line", "key"),
    [
        ("edge.rate_limit", "requests_per_minute = 0", "edge.rate_limit.requests_per_minute"),
        ("edge.rate_limit", "burst = 0", "edge.rate_limit.burst"),
        ("edge.rate_limit", 'trusted_proxies = ["nginx.local"]', "edge.rate_limit.trusted_proxies"),
        ("edge.rate_limit", "per_second = 3", "edge.rate_limit.per_second"),
        ("edge.idempotency", "max_entries = 0", "edge.idempotency.max_entries"),
        # a renewal may wait 1 s for Redis and a kept lease 0.5 s more: shorter lapses under a live forward
        ("edge.shared_state", "lease_seconds = 2", "edge.shared_state.lease_seconds"),
        # longer: a dead gateway blocks its hosts for minutes again (issue 39)
        ("edge.shared_state", "lease_seconds = 61", "edge.shared_state.lease_seconds"),
    ],
)
def test_bad_admission_values_are_named(tmp_path: Path, section: str, line: str, key: str):
    with pytest.raises(SettingsError, match=key.replace(".", r"\.")):
        load_text(tmp_path, f"[{section}]\n{line}\n")


def test_trusted_proxies_may_be_networks(tmp_path: Path):
    load_text(tmp_path, '[edge.rate_limit]\ntrusted_proxies = ["10.0.0.0/8", "fd00::/8", "127.0.0.1"]\n')
