"""The strict settings loader: every bad key is named, secrets never come from settings.toml."""

from pathlib import Path

import pytest

from shared.settings import ENV_ACCEPT_PASSWORDS, ENV_SHARED_PASSWORD, SettingsError, load_settings

REPO_SETTINGS = Path(__file__).parents[2] / "settings.toml"


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def load_text(directory: Path, text: str) -> None:
    """Load `text` as the settings file, with no secrets and an empty environment."""
    load_settings(write(directory / "s.toml", text), environ={})


def test_committed_settings_load_and_hold_no_secret():
    settings = load_settings(REPO_SETTINGS, environ={})
    assert settings.edge.pool.workers == ("http://127.0.0.1:28187",)
    assert settings.auth.shared_password == ""


def test_unknown_key_is_named(tmp_path):
    with pytest.raises(SettingsError, match=r"unknown settings key: edge\.dispatch\.queue_wait_secs"):
        load_text(tmp_path, "[edge.dispatch]\nqueue_wait_secs = 3\n")


def test_bad_value_is_named_without_echoing_it(tmp_path):
    with pytest.raises(SettingsError, match=r"edge\.health_check\.interval_seconds"):
        load_text(tmp_path, "[edge.health_check]\ninterval_seconds = -1\n")


def test_invalid_toml_names_the_file(tmp_path):
    with pytest.raises(SettingsError, match="not valid TOML"):
        load_text(tmp_path, "[edge\n")


def test_a_file_that_is_not_utf8_or_not_readable_is_a_settings_error(tmp_path):
    # a SIGHUP reload catches SettingsError only: anything else would end the service
    latin1 = tmp_path / "latin1.toml"
    latin1.write_bytes("[edge]\nbind = 'caf\u00e9'\n".encode("latin-1"))
    with pytest.raises(SettingsError, match="not UTF-8"):
        load_settings(latin1, environ={})
    with pytest.raises(SettingsError, match="cannot be read"):
        load_settings(tmp_path, environ={})  # a directory


@pytest.mark.parametrize("section", ["[auth]\nshared_password = 'x'", "[edge.features]\napi_key = 'k'"])
def test_secret_in_settings_file_is_refused(tmp_path, section):
    config = write(tmp_path / "s.toml", section + "\n")
    with pytest.raises(SettingsError, match="is a secret") as caught:
        load_settings(config, environ={})
    assert "'x'" not in str(caught.value) and "'k'" not in str(caught.value)


def test_secrets_file_beside_config_is_merged(tmp_path):
    config = write(tmp_path / "s.toml", "[edge]\nmax_body_bytes = 10\n")
    write(tmp_path / "secrets.toml", "[auth]\nshared_password = 'p1'\naccept_passwords = ['p1', 'p0']\n")
    settings = load_settings(config, environ={})
    assert settings.auth.shared_password == "p1"
    assert settings.auth.accept_passwords == ("p1", "p0")
    assert settings.edge.max_body_bytes == 10


def test_named_secrets_file_must_exist(tmp_path):
    config = write(tmp_path / "s.toml", "")
    with pytest.raises(SettingsError, match="secrets file not found"):
        load_settings(config, tmp_path / "missing.toml", environ={})


def test_environment_wins_over_secrets_file(tmp_path):
    config = write(tmp_path / "s.toml", "")
    secrets = write(tmp_path / "other.toml", "[auth]\nshared_password = 'file'\n")
    environ = {ENV_SHARED_PASSWORD: "env", ENV_ACCEPT_PASSWORDS: "a, b"}
    settings = load_settings(config, secrets, environ=environ)
    assert settings.auth.shared_password == "env"
    assert settings.auth.accept_passwords == ("a", "b")


def test_primary_must_be_a_worker(tmp_path):
    with pytest.raises(SettingsError, match=r"edge\.pool"):
        load_text(tmp_path, "[edge.pool]\nworkers = ['http://a:1']\nprimary_workers = ['http://b:1']\n")


def test_worker_urls_need_a_scheme(tmp_path):
    with pytest.raises(SettingsError, match=r"edge\.pool\.workers"):
        load_text(tmp_path, "[edge.pool]\nworkers = ['127.0.0.1:1']\n")


@pytest.mark.parametrize(
    ("host_seconds", "gateway_seconds", "ok"),
    [(60, 60, False), (59.5, 60, False), (57, 60, True), (50, 60, True), (5, 5.5, False), (4, 5, True)],
)
def test_host_inference_timeout_must_sit_below_the_gateway_request_timeout(tmp_path, host_seconds, gateway_seconds, ok):
    # equal timeouts: the gateway gives up first, ejects the host, retries a second one
    text = (
        f"[edge.dispatch]\nrequest_timeout_seconds = {gateway_seconds}\n"
        f"[gpu_host]\ninference_timeout_seconds = {host_seconds}\n"
    )
    if ok:
        load_text(tmp_path, text)
    else:
        with pytest.raises(
            SettingsError, match=r"gpu_host\.inference_timeout_seconds .* edge\.dispatch\.request_timeout_seconds"
        ):
            load_text(tmp_path, text)


def test_a_gateway_only_file_may_lower_its_timeouts(tmp_path):
    """Issue 15: a file without [gpu_host] was checked against that section's defaults (50 s)."""
    load_text(tmp_path, "[edge.dispatch]\nrequest_timeout_seconds = 20\nslow_request_timeout_seconds = 30\n")


def test_a_host_only_file_may_raise_its_timeouts(tmp_path):
    load_text(tmp_path, '[gpu_host]\ninference_timeout_seconds = 90\ncomfyui_url = "http://127.0.0.1:8188"\n')


def test_generation_time_must_fit_the_slow_request_timeout(tmp_path):
    text = (
        "[edge.dispatch]\nslow_request_timeout_seconds = 100\n"
        '[gpu_host]\ncomfyui_url = "http://127.0.0.1:8188"\ncomfyui_timeout_seconds = 60\n'
    )
    with pytest.raises(SettingsError, match=r"comfyui_timeout_seconds \(110\).*slow_request_timeout_seconds"):
        load_text(tmp_path, text)


def test_shipped_defaults_obey_the_timeout_rule():
    from shared.settings import Settings

    Settings.model_validate({"edge": {}, "gpu_host": {}})  # the model's defaults, both roles in one file
    load_settings(REPO_SETTINGS, environ={})


@pytest.mark.parametrize(
    ("section", "key"),
    [
        ("[edge.cpu]\nworkers = 0", r"edge\.cpu\.workers"),
        ("[edge.features]\nbase_url = 'ark.example/api/v3'\nmodel = 'm'", r"edge\.features\.base_url"),
        ("[edge.features]\nbase_url = 'https://ark.example/api/v3'", r"edge\.features: .*model must be named"),
    ],
)
def test_gateway_cpu_and_features_settings_are_checked(tmp_path, section, key):
    with pytest.raises(SettingsError, match=key):
        load_text(tmp_path, section + "\n")


@pytest.mark.parametrize(
    ("value", "accepted"),
    [
        ("max_concurrent = 0", False),
        ("max_concurrent = 1.5", False),
        ("stall_seconds = 0", False),
        ("stall_seconds = 301", False),  # past the server's own bound on a write: it would not apply
        ("max_concurrent = 1\nstall_seconds = 0.5", True),
    ],
)
def test_static_download_bounds_are_checked(tmp_path, value, accepted):
    text = f"[edge.static_downloads]\n{value}\n"
    if accepted:
        load_text(tmp_path, text)
        return
    with pytest.raises(SettingsError, match=r"edge\.static_downloads\.(max_concurrent|stall_seconds)"):
        load_text(tmp_path, text)


def test_features_api_key_comes_from_the_secrets_file(tmp_path):
    config = write(tmp_path / "s.toml", "[edge.features]\nbase_url = 'https://ark.example/api/v3/'\nmodel = 'm'\n")
    secrets = write(tmp_path / "secrets.toml", "[edge.features]\napi_key = 'sk-1'\n")
    features = load_settings(config, secrets, environ={}).edge.features
    assert (features.base_url, features.api_key) == ("https://ark.example/api/v3", "sk-1")
