"""SIGHUP's settings reload, in process: what changes live, what keeps its value, bad files."""

from __future__ import annotations

import logging
from pathlib import Path

import httpx
import pytest

from edge.gateway import build_gateway
from edge.app import create_app
from edge.pool.forward import ForwardRequest
from edge.main import _reload
from edge.pool.prober import Prober
from edge.reload import apply_settings
from shared.settings import SettingsError
from tests.edge.conftest import TOKEN, WORKERS, bring_online, make_settings


class RecordingUpstream:
    def __init__(self) -> None:
        self.token = TOKEN

    def set_token(self, token: str) -> None:
        self.token = token

    async def forward(self, url: str, request: ForwardRequest, timeout: float):  # pragma: no cover - unused
        raise AssertionError

    async def probe(self, url: str, timeout: float):  # pragma: no cover - unused
        raise AssertionError


@pytest.fixture
async def parts(tmp_path: Path):
    gateway = build_gateway(make_settings(tmp_path), upstream=RecordingUpstream())
    bring_online(gateway, 0, 1, 2)
    prober = Prober(gateway.dispatcher, gateway.upstream.probe, path="/health", interval_seconds=8, timeout_seconds=3)
    return gateway, create_app(gateway), prober


def reloaded(tmp_path: Path, **edge) -> object:
    settings = make_settings(tmp_path, **edge)
    return settings.model_copy(update={"auth": settings.auth.model_copy(update={"shared_password": "rotated-token-1234567"})})


async def test_workers_token_limits_and_timings_change_live(tmp_path: Path, parts, caplog) -> None:
    gateway, router, prober = parts
    new = reloaded(
        tmp_path,
        pool={"workers": [WORKERS[0], "http://127.0.0.1:18193"], "primary_workers": []},
        max_body_bytes=123,
        dispatch={"queue_wait_seconds": 7},
        rate_limit={"enabled": True, "requests_per_minute": 60, "burst": 2},
    )
    apply_settings(gateway, router, prober, new)
    assert [w.url for w in gateway.pool.active] == [WORKERS[0], "http://127.0.0.1:18193"]
    assert not gateway.pool.workers[3].online, "a new worker waits for its first probe"
    assert gateway.pool.workers[1].retired and gateway.pool.workers[2].retired
    assert gateway.upstream.token == "rotated-token-1234567"
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=router), base_url="http://gw") as client:
        answer = (await client.post("/api/v1/hair/measure", content=b"x" * 124)).json()
    assert answer["code"] == 1003 and "123" in answer["message"], "the new body limit applies"
    assert gateway.admission.limiter is not None
    assert gateway.dispatcher._queue_wait_seconds == 7
    assert gateway.settings.auth.shared_password == "rotated-token-1234567"


async def test_keys_that_need_a_restart_keep_their_value_with_one_warning(tmp_path: Path, parts, caplog) -> None:
    gateway, router, prober = parts
    old_bind = gateway.settings.edge.bind
    with caplog.at_level(logging.WARNING, logger="edge.reload"):
        apply_settings(gateway, router, prober, reloaded(tmp_path, bind="127.0.0.1:1", static_dir="/elsewhere"))
    assert gateway.settings.edge.bind == old_bind
    assert gateway.settings.edge.static_dir != "/elsewhere"
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "edge.bind" in warning and "edge.static_dir" in warning


async def test_an_unchanged_rate_limit_keeps_its_buckets(tmp_path: Path, parts) -> None:
    gateway, router, prober = parts
    limiter = gateway.admission.limiter
    apply_settings(gateway, router, prober, reloaded(tmp_path))
    assert gateway.admission.limiter is limiter


async def test_invalid_new_settings_keep_the_old_ones_with_one_error_line(parts, caplog) -> None:
    gateway, router, prober = parts
    before = gateway.settings

    def broken() -> object:
        raise SettingsError("unknown settings key: edge.dispatch.queue_wait_secs")

    with caplog.at_level(logging.ERROR):
        await _reload(gateway, router, prober, broken)
    assert gateway.settings is before
    (line,) = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert "edge.dispatch.queue_wait_secs" in line
