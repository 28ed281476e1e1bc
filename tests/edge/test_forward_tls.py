"""The gateway's `Upstream` against an https worker: verified against `edge.pool.ca_file`,
and a certificate it cannot verify is a CONNECT failure at once, never a hang."""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from functools import partial
from pathlib import Path

import hypercorn.trio
import pytest
import trio
from hypercorn.config import Config

from edge.pool.failures import FailureKind, WorkerFailure
from edge.pool.upstream import ForwardRequest, Upstream
from tests.fakes.fake_worker import FakeWorker, create_app
from tests.fakes.raw_host import Misbehaviour, RawHost
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


@pytest.mark.parametrize(
    ("misbehaviour", "connections"),
    [(Misbehaviour.NONE, 1), (Misbehaviour.SECOND_RESPONSE_SAME_WRITE, 8), (Misbehaviour.SECOND_RESPONSE_LATER, 8)],
)
async def test_an_unsolicited_response_over_tls_never_reaches_the_next_client(
    worker_tls: TlsFiles, nursery, misbehaviour: Misbehaviour, connections: int
) -> None:
    # NONE: the look into the TLS layer for bytes read off the socket with the answer's
    # end (a receive in a cancelled scope) leaves a kept connection usable
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(worker_tls.certfile, worker_tls.keyfile)
    host = RawHost(misbehaviour, tls=server)
    url = await host.start(nursery)
    upstream = Upstream(TOKEN, keepalive_connections=2, ca_file=str(worker_tls.ca_file))
    answered = []
    try:
        for number in range(8):
            later_write = host.later_write_done
            request = ForwardRequest("POST", "/api/v1/hair/measure", "", b"{}", None, f"client-{number}", "127.0.0.1")
            answered.append((await upstream.forward(url, request, 5)).envelope["request_id"])
            if misbehaviour is Misbehaviour.SECOND_RESPONSE_LATER:
                await later_write.wait()
    finally:
        await upstream.aclose()
    assert answered == [f"client-{n}" for n in range(8)]
    assert (host.stale_sent, host.connections) == (0 if misbehaviour is Misbehaviour.NONE else 8, connections)
