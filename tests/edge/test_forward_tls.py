"""The gateway's `Upstream` against an https worker: verified against `edge.pool.ca_file`,
and a certificate it cannot verify is a CONNECT failure at once, never a hang."""

from __future__ import annotations

from collections.abc import AsyncIterator
from functools import partial
from pathlib import Path

import hypercorn.trio
import pytest
import trio
from hypercorn.config import Config

from edge.pool.forward import FailureKind, Upstream, WorkerFailure
from tests.fakes.fake_worker import FakeWorker, create_app
from tests.fakes.tls import TlsFiles, tls_files

TOKEN = "tls-test-token-0123456789"
PROBE_TIMEOUT_SECONDS = 5.0


@pytest.fixture
def worker_tls(tmp_path: Path) -> TlsFiles:
    return tls_files(tmp_path, "worker")


@pytest.fixture
async def https_worker(worker_tls: TlsFiles) -> AsyncIterator[str]:
    config = Config()
    config.bind = ["127.0.0.1:0"]
    config.certfile, config.keyfile = str(worker_tls.certfile), str(worker_tls.keyfile)
    config.accesslog = None
    async with trio.open_nursery() as nursery:
        urls = await nursery.start(partial(hypercorn.trio.serve, create_app(FakeWorker(TOKEN, 0.0)), config))
        assert urls[0].startswith("https://")
        yield urls[0]
        nursery.cancel_scope.cancel()


async def test_worker_signed_by_the_configured_ca_is_verified(https_worker: str, worker_tls: TlsFiles) -> None:
    upstream = Upstream(TOKEN, keepalive_connections=2, ca_file=str(worker_tls.ca_file))
    try:
        answer = await upstream.probe(https_worker + "/health", PROBE_TIMEOUT_SECONDS)
    finally:
        await upstream.aclose()
    assert answer.status == 200


@pytest.mark.parametrize("ca", ["other CA", "system store"])
async def test_unverifiable_certificate_is_a_connect_failure_not_a_hang(
    https_worker: str, tmp_path: Path, ca: str
) -> None:
    ca_file = str(tls_files(tmp_path / "other", "other").ca_file) if ca == "other CA" else ""
    upstream = Upstream(TOKEN, keepalive_connections=2, ca_file=ca_file)
    started = trio.current_time()
    try:
        with pytest.raises(WorkerFailure) as failure:
            await upstream.probe(https_worker + "/health", PROBE_TIMEOUT_SECONDS)
    finally:
        await upstream.aclose()
    assert failure.value.kind is FailureKind.CONNECT
    assert trio.current_time() - started < PROBE_TIMEOUT_SECONDS  # refused by the handshake, not timed out


async def test_the_failure_names_the_certificate_problem(https_worker: str, tmp_path: Path) -> None:
    upstream = Upstream(TOKEN, keepalive_connections=2, ca_file=str(tls_files(tmp_path, "other").ca_file))
    try:
        with pytest.raises(WorkerFailure) as failure:
            await upstream.probe(https_worker + "/health", PROBE_TIMEOUT_SECONDS)
    finally:
        await upstream.aclose()
    assert "CERTIFICATE_VERIFY_FAILED" in str(failure.value)  # what the offline warning logs
