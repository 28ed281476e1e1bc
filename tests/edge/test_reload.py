"""SIGHUP's settings reload, in process: what changes live, what keeps its value, bad files."""

from __future__ import annotations

import hashlib
import logging
import os
import time
from dataclasses import fields
from pathlib import Path
from typing import NamedTuple

import httpx
import pytest
from pydantic import BaseModel
from quart_trio import QuartTrio

from edge.app import create_app
from edge.gateway import Gateway, build_gateway
from edge.main import _reload
from edge.pool.prober import Prober
from edge.pool.scheduling import SchedulingPolicy
from edge.pool.upstream import ForwardRequest, Timeouts
from edge.reload import EDGE_SETTINGS, LIVE, RESTART, apply_settings
from edge.web.server import GatewayConfig
from shared.contract import Code
from shared.settings import AnalysisSettings, EdgeSettings, Settings, SettingsError
from tests.edge.conftest import TOKEN, WORKERS, bring_online, make_settings

MEASURE = "/api/v1/hair/measure"


class RecordingUpstream:
    def __init__(self) -> None:
        self.token = TOKEN

    def set_token(self, token: str) -> None:
        self.token = token

    async def forward(self, url: str, request: ForwardRequest, timeout: float):  # pragma: no cover - unused
        raise AssertionError

    async def probe(self, url: str, timeout: float, wanted: bool = False):  # pragma: no cover - unused
        raise AssertionError


class Parts(NamedTuple):
    """What a reload applies to (`apply_settings(*parts, new)`)."""

    gateway: Gateway
    app: QuartTrio
    prober: Prober
    listener: GatewayConfig


@pytest.fixture
async def parts(tmp_path: Path) -> Parts:
    gateway = build_gateway(make_settings(tmp_path), upstream=RecordingUpstream())  # type: ignore[arg-type]
    bring_online(gateway, 0, 1, 2)
    prober = Prober(gateway.dispatcher, gateway.upstream.probe, path="/health", interval_seconds=8, timeout_seconds=3)
    return Parts(gateway, create_app(gateway), prober, GatewayConfig(gateway.settings.edge))


def reloaded(tmp_path: Path, **edge: object) -> Settings:
    settings = make_settings(tmp_path, **edge)
    return settings.model_copy(
        update={"auth": settings.auth.model_copy(update={"shared_password": "rotated-token-1234567"})}
    )


async def test_workers_token_limits_and_timings_change_live(tmp_path: Path, parts, caplog) -> None:
    gateway = parts.gateway
    new = reloaded(
        tmp_path,
        pool={"workers": [WORKERS[0], "http://127.0.0.1:18193"], "primary_workers": []},
        max_body_bytes=123,
        dispatch={"queue_wait_seconds": 7, "reserved_fast_workers": 2, "slow_priority_offset_seconds": 0.5},
        rate_limit={"enabled": True, "requests_per_minute": 60, "burst": 2},
    )
    apply_settings(*parts, new)
    assert [w.url for w in gateway.pool.active] == [WORKERS[0], "http://127.0.0.1:18193"]
    assert not gateway.pool.workers[3].online, "a new worker waits for its first probe"
    assert gateway.pool.workers[1].retired and gateway.pool.workers[2].retired
    assert gateway.upstream.token == "rotated-token-1234567"
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=parts.app), base_url="http://gw") as client:
        answer = (await client.post(MEASURE, content=b"x" * 124)).json()
    assert answer["code"] == 1003 and "123" in answer["message"], "the new body limit applies"
    assert gateway.admission.limiter is not None
    assert gateway.dispatcher._queue_wait_seconds == 7
    assert gateway.dispatcher.policy == SchedulingPolicy(reserved_fast_workers=2, slow_priority_offset_seconds=0.5)
    assert gateway.settings.auth.shared_password == "rotated-token-1234567"


async def test_keys_that_need_a_restart_keep_their_value_with_one_warning(tmp_path: Path, parts, caplog) -> None:
    gateway = parts.gateway
    old_bind = gateway.settings.edge.bind
    with caplog.at_level(logging.WARNING, logger="edge.reload"):
        apply_settings(*parts, reloaded(tmp_path, bind="127.0.0.1:1", static_dir="/elsewhere"))
    assert gateway.settings.edge.bind == old_bind
    assert gateway.settings.edge.static_dir != "/elsewhere"
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "edge.bind" in warning and "edge.static_dir" in warning


async def test_an_unchanged_rate_limit_keeps_its_buckets(tmp_path: Path, parts) -> None:
    gateway = parts.gateway
    limiter = gateway.admission.limiter
    apply_settings(*parts, reloaded(tmp_path))
    assert gateway.admission.limiter is limiter


async def test_invalid_new_settings_keep_the_old_ones(parts) -> None:
    """The SettingsError reaches the signal loop, which logs it as one line naming the key
    (tests/shared/test_serving.py; the real gateway's line: tests/edge/e2e/test_e2e_reload.py)."""
    gateway = parts.gateway
    before = gateway.settings

    def broken() -> object:
        raise SettingsError("unknown settings key: edge.dispatch.queue_wait_secs")

    with pytest.raises(SettingsError, match=r"edge\.dispatch\.queue_wait_secs"):
        await _reload(*parts, broken)
    assert gateway.settings is before


def setting_paths(model: type[BaseModel], prefix: str = "") -> list[str]:
    """Every leaf setting below `model`, dotted."""
    paths = []
    for name, field in model.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            paths += setting_paths(annotation, f"{prefix}{name}.")
        else:
            paths.append(prefix + name)
    return paths


def test_every_edge_setting_is_either_live_or_restart_only() -> None:
    undecided = []
    for path in setting_paths(EdgeSettings):
        parts = path.split(".")
        decided = [".".join(parts[:n]) for n in range(len(parts), 0, -1) if ".".join(parts[:n]) in EDGE_SETTINGS]
        if not decided:
            undecided.append(path)
    assert undecided == [], "add these to edge.reload.EDGE_SETTINGS"
    known = set(setting_paths(EdgeSettings))
    stale = [key for key in EDGE_SETTINGS if key not in known and not any(p.startswith(key + ".") for p in known)]
    assert stale == [], "EDGE_SETTINGS names settings that do not exist"
    assert set(EDGE_SETTINGS.values()) <= {LIVE, RESTART}


async def test_a_nested_restart_only_setting_keeps_its_value(tmp_path: Path, parts, caplog) -> None:
    gateway = parts.gateway
    with caplog.at_level(logging.WARNING, logger="edge.reload"):
        apply_settings(*parts, reloaded(tmp_path, pool={"workers": WORKERS, "ca_file": "/new/ca.pem"}))
    assert gateway.settings.edge.pool.ca_file == ""
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "edge.pool.ca_file" in warning and "edge.pool.workers" not in warning


async def test_the_shutdown_grace_follows_reloaded_request_timeouts(tmp_path: Path, parts) -> None:
    apply_settings(
        *parts,
        reloaded(tmp_path, dispatch={"request_timeout_seconds": 7, "slow_request_timeout_seconds": 90}),
    )
    assert parts.listener.graceful_timeout == 90, "SIGTERM lets the longest request, as now configured, finish"
    apply_settings(*parts, reloaded(tmp_path, max_header_bytes=20_000))
    assert parts.listener.h11_max_incomplete_size > 20_000


async def test_a_reload_hands_the_forward_service_its_timeouts_whole(tmp_path: Path, parts, monkeypatch) -> None:
    told: list[tuple] = []
    monkeypatch.setattr(parts.gateway.api, "reconfigure", lambda *args, **kwargs: told.append(args))
    apply_settings(
        *parts,
        reloaded(tmp_path, dispatch={"request_timeout_seconds": 7, "slow_request_timeout_seconds": 90}),
    )
    ((_images, _policy, timeouts),) = told
    assert timeouts == Timeouts(request_seconds=7, slow_request_seconds=90)


# --- a reload reaches each component it configures (edge.reload pushes; none reads settings itself)


async def test_a_reload_reaches_the_static_cleanup(tmp_path: Path, parts) -> None:
    gateway = parts.gateway
    folder = Path(gateway.settings.edge.static_dir) / "annotations"
    folder.mkdir(parents=True)
    five_hours_old = folder / "five.png"
    five_hours_old.write_bytes(b"\x89PNG")
    os.utime(five_hours_old, (time.time() - 5 * 3600,) * 2)
    await gateway.static_cleanup.sweep_once()
    assert five_hours_old.exists(), "72 hours by default"
    apply_settings(*parts, reloaded(tmp_path, static_cleanup={"max_age_hours": 4}))
    await gateway.static_cleanup.sweep_once()
    assert not five_hours_old.exists()


async def test_a_reload_reaches_admission_and_the_audit_trail(tmp_path: Path, parts) -> None:
    gateway = parts.gateway
    rate_limit = {"enabled": True, "requests_per_minute": 1, "burst": 1, "key_header": "X-Api-Key"}
    apply_settings(*parts, reloaded(tmp_path, max_body_bytes=10, rate_limit=rate_limit))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=parts.app), base_url="http://gw") as client:
        answers = [(await client.post(MEASURE, content=b"x" * 11, headers={"X-Api-Key": "k"})) for _ in range(2)]
    assert [answer.json()["code"] for answer in answers] == [Code.TOO_LARGE, Code.SYSTEM_ERROR], (
        "the first takes the key's one token (and is too large), the second finds its bucket empty"
    )
    assert "Retry-After" in answers[1].headers
    await gateway.audit.flush()
    assert gateway.audit.reader is not None
    users = gateway.audit.reader.query("SELECT user_id FROM audit_log", ())
    assert [user for (user,) in users] == [hashlib.sha256(b"k").hexdigest()[:16]] * 2, "the trail knows the key header"


async def test_a_reload_reaches_what_the_http_layer_checks_and_states(tmp_path: Path, parts) -> None:
    # the token, the header limit, the alternative entrance, the document's facts: pushed to
    # `Gateway.entrance` (no request reads them off the settings)
    padded = {"X-Padding": "x" * 2100}  # a header block the default 16 KiB allows, 2 KiB not
    old_token, new_token = {"X-Internal-Token": TOKEN}, {"X-Internal-Token": "rotated-token-1234567"}
    rate_limit = {"enabled": True, "requests_per_minute": 1, "burst": 1, "key_header": "X-Api-Key"}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=parts.app), base_url="http://gw") as client:
        assert (await client.get("/admin/stats", headers={**old_token, **padded})).status_code == 200
        apply_settings(
            *parts,
            reloaded(
                tmp_path,
                max_header_bytes=2048,
                max_body_bytes=10,
                public_base_url="https://moved.test",
                rate_limit=rate_limit,
                failures={"alternative_endpoint": "https://low-res.test"},
            ),
        )
        assert (await client.get("/admin/stats", headers=old_token)).status_code == 401
        assert (await client.get("/admin/stats", headers=new_token)).status_code == 200
        assert (await client.get("/admin/stats", headers={**new_token, **padded})).status_code == 431
        # the key's one token goes to the first (too large), the second is told to retry
        answers = [(await client.post(MEASURE, content=b"x" * 11, headers={"X-Api-Key": "k"})) for _ in range(2)]
        document = (await client.get("/openapi.json")).json()
    assert "X-Alternative-Endpoint" not in answers[0].headers
    assert answers[1].headers["X-Alternative-Endpoint"] == "https://low-res.test"
    assert document["servers"] == [{"url": "https://moved.test"}]
    assert "x-api-key" in {parameter["name"] for parameter in document["paths"][MEASURE]["post"]["parameters"]}


async def test_a_reload_reaches_the_endpoints_the_gateway_answers_itself(tmp_path: Path, parts) -> None:
    gateway = parts.gateway
    new = reloaded(tmp_path, features={"base_url": "http://llm.test/v1", "model": "m"})
    new = new.model_copy(update={"analysis": AnalysisSettings(max_image_bytes=1234)})
    apply_settings(*parts, new)
    assert (gateway.features.settings.base_url, gateway.features.settings.model) == ("http://llm.test/v1", "m")
    assert gateway.features.limits.max_image_bytes == gateway.special_points.limits.max_image_bytes == 1234


async def test_a_reload_reconfigures_every_component_that_can_be(tmp_path: Path, parts, monkeypatch) -> None:
    # A component given `reconfigure()` is told every reload: one that edge.reload forgot fails here.
    gateway = parts.gateway
    components = {field.name: getattr(gateway, field.name) for field in fields(gateway)}
    components.update(prober=parts.prober, listener=parts.listener)
    reconfigurable = sorted(name for name, component in components.items() if hasattr(component, "reconfigure"))
    told: list[str] = []
    for name in reconfigurable:
        original = components[name].reconfigure

        def record(*args: object, _name: str = name, _original=original, **kwargs: object) -> None:
            told.append(_name)
            _original(*args, **kwargs)

        monkeypatch.setattr(components[name], "reconfigure", record)
    apply_settings(*parts, reloaded(tmp_path))
    assert sorted(told) == reconfigurable, "each told once"
    known = {
        "entrance",
        "dispatcher",
        "api",
        "admission",
        "audit",
        "features",
        "special_points",
        "static_cleanup",
        "static_downloads",
        "prober",
        "listener",
    }
    assert known <= set(reconfigurable)
