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

from edge.pool.errors import ConnectError
from edge.pool.failures import forwarded
from edge.pool.upstream import ForwardRequest, Upstream, UpstreamLimits, tls_holds_bytes
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
    upstream = Upstream(TOKEN, UpstreamLimits(keepalive_connections=2), ca_file=str(worker_tls.ca_file))
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
    upstream = Upstream(TOKEN, UpstreamLimits(keepalive_connections=2), ca_file=ca_file)
    started = trio.current_time()
    try:
        with pytest.raises(ConnectError):
            await upstream.probe(https_worker + "/health", PROBE_TIMEOUT_SECONDS)
    finally:
        await upstream.aclose()
    assert trio.current_time() - started < PROBE_TIMEOUT_SECONDS  # refused by the handshake, not timed out


async def test_the_failure_names_the_certificate_problem(https_worker: str, tmp_path: Path) -> None:
    upstream = Upstream(
        TOKEN, UpstreamLimits(keepalive_connections=2), ca_file=str(tls_files(tmp_path, "other").ca_file)
    )
    try:
        with pytest.raises(ConnectError) as failure:
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
    upstream = Upstream(TOKEN, UpstreamLimits(keepalive_connections=2), ca_file=str(worker_tls.ca_file))
    answered = []
    try:
        for number in range(8):
            later_write = host.later_write_done
            request = ForwardRequest("POST", "/api/v1/hair/measure", "", b"{}", None, f"client-{number}", "127.0.0.1")
            answered.append((await forwarded(upstream, url, request, 5)).envelope["request_id"])
            if misbehaviour is Misbehaviour.SECOND_RESPONSE_LATER:
                await later_write.wait()
    finally:
        await upstream.aclose()
    assert answered == [f"client-{n}" for n in range(8)]
    assert (host.stale_sent, host.connections) == (0 if misbehaviour is Misbehaviour.NONE else 8, connections)


async def test_bytes_a_tls_record_brought_beyond_the_answer_keep_the_connection_out_of_reuse(
    worker_tls: TlsFiles,
) -> None:
    # one TLS record holds the answer and bytes after it: the socket then reads as quiet while
    # the TLS object holds them; a receive in a cancelled scope never saw them (trio checks
    # for cancellation first), so such a connection was kept and its stale bytes read as the
    # next request's answer
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_context.load_cert_chain(worker_tls.certfile, worker_tls.keyfile)
    client_context = ssl.create_default_context(cafile=str(worker_tls.ca_file))
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    sent = trio.Event()

    async def serve(stream: trio.SocketStream) -> None:
        tls = trio.SSLStream(stream, server_context, server_side=True)
        await tls.do_handshake()
        await tls.send_all(b"ANSWER" + b"STALE")
        sent.set()
        await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.serve_listeners, serve, listeners)
        client = trio.SSLStream(
            await trio.open_tcp_stream("127.0.0.1", port), client_context, server_hostname="127.0.0.1"
        )
        await client.do_handshake()
        await sent.wait()
        assert await client.receive_some(len(b"ANSWER")) == b"ANSWER"
        assert tls_holds_bytes(client), "the stale bytes wait in the TLS layer"
        assert await client.receive_some(100) == b"STALE"
        assert not tls_holds_bytes(client)
        nursery.cancel_scope.cancel()
