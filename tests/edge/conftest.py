"""Fixtures for the gateway's in-process unit tests: settings, a gateway graph, a client of its router."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from edge.app import create_app
from edge.gateway import Gateway, build_gateway
from edge.pool.pool import ProbeResult
from shared.settings import Settings
from tests.fakes.fake_worker import PNG_BASE64
from tests.fakes.redis_server import redis_server  # noqa: F401  (fixture: the shared-state tests)
from tests.postgres import postgres, postgres_dsn  # noqa: F401  (fixtures: the audit trail's tests)

TOKEN = "unit-test-token-3f9a"
# A request body the gateway's own checks accept (an image with PNG magic bytes); what the
# fake workers answer does not depend on it.
PHOTO = {"image_base64": PNG_BASE64}
PHOTO_BODY = json.dumps(PHOTO).encode()
WORKERS = ["http://127.0.0.1:18190", "http://127.0.0.1:18191", "http://127.0.0.1:18192"]
# Every request-log line's keys (gateway.md § The request log, docs/edge.md): the unit tests
# and the real process's end-to-end test hold the log to this one list.
REQUEST_LOG_FIELDS = frozenset(
    {
        "ts",
        "request_id",
        "method",
        "path",
        "client_ip",
        "worker",
        "attempts",
        "queue_ms",
        "duration_ms",
        "http_status",
        "code",
        "bytes_in",
        "bytes_out",
        "idempotent_replay",
        "rate_limited",
        "early_refusal",
        "failed_workers",
        "error_type",
        "model_version",
    }
)


def make_settings(tmp_path: Path, **edge: object) -> Settings:
    section = {
        "static_dir": str(tmp_path / "static"),
        "request_log": str(tmp_path / "request_log.jsonl"),
        "public_base_url": "http://gateway.test",
        "pool": {"workers": WORKERS, "primary_workers": WORKERS[:2]},
        "metrics_bind": "",
        "rate_limit": {"enabled": False},
        "idempotency": {"enabled": False},
        "audit": {"path": str(tmp_path / "audit.sqlite3")},
        "cpu": {"start_workers_at_start": False},
        **edge,
    }
    # The hosts' inference timeout must sit below the gateway's request timeout (checked).
    host = {"inference_timeout_seconds": 0.5}
    return Settings.model_validate({"auth": {"shared_password": TOKEN}, "edge": section, "gpu_host": host})


def bring_online(gateway: Gateway, *indexes: int) -> None:
    for index in indexes:
        gateway.dispatcher.record_probe(index, ProbeResult(0.0, ok=True))


@pytest.fixture
def gateway(tmp_path: Path) -> Gateway:
    return build_gateway(make_settings(tmp_path))


@pytest.fixture
def client(gateway: Gateway) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=create_app(gateway))
    return httpx.AsyncClient(transport=transport, base_url="http://gateway.test")
