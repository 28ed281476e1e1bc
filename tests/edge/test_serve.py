"""`serve()` on real loopback sockets: start-up order, the body limit on the wire, drain on stop."""

from __future__ import annotations

import json
import logging
import socket
import struct
from functools import partial
from pathlib import Path

import httpx
import hypercorn.protocol
import hypercorn.trio
import pytest
import trio
import trio.testing
from hypercorn.config import Config
from hypercorn.protocol.h11 import H11Protocol

from cluster.launcher import free_port
from edge.main import serve
from edge.web.server import GatewayConfig, GatewayH11Protocol
from shared.contract import Code, envelope
from shared.http_server import HTTP1Protocol
from tests.edge.conftest import PHOTO, PHOTO_BODY, make_settings
from tests.shared.http_attacks import PREFACE, SETTINGS_FRAME, exchange, hypercorns_own_classes, installed_by_serve

# One free port per test process (a fixed one clashed when two runs of the suite met).
GATEWAY_PORT = free_port()
MEASURE = "/api/v1/hair/measure"


class InProcessWorker:
    """A worker on a real socket whose /health and jobs wait for the test's say-so."""

    def __init__(self) -> None:
        self.health_open = trio.Event()
        self.job_started = trio.Event()
        self.job_may_finish = trio.Event()
        self.job_may_finish.set()
        self.jobs = 0
        self.url = ""
        self.blob_bytes = 0  # a job's answer carries this many bytes more

    async def app(self, scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        while (await receive()).get("more_body"):
            pass
        if scope["path"] == "/health":
            await self.health_open.wait()
            payload = b'{"status": "ok"}'
        else:
            self.jobs += 1
            self.job_started.set()
            await self.job_may_finish.wait()
            request_id = dict(scope["headers"])[b"x-request-id"].decode()  # the gateway checks it comes back
            data = {"done": True, "blob": "b" * self.blob_bytes} if self.blob_bytes else {"done": True}
            payload = json.dumps(envelope(Code.OK, request_id, data)).encode()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": payload})

    async def start(self, nursery: trio.Nursery) -> None:
        config = Config()
        config.bind = ["127.0.0.1:0"]
        config.accesslog = None
        self.url = (await nursery.start(partial(hypercorn.trio.serve, self.app, config)))[0]


async def port_accepts(port: int) -> bool:
    try:
        stream = await trio.open_tcp_stream("127.0.0.1", port)
    except OSError:
        return False
    await stream.aclose()
    return True


@pytest.fixture
async def worker(nursery) -> InProcessWorker:
    worker = InProcessWorker()
    await worker.start(nursery)
    return worker


def settings_for(tmp_path: Path, worker: InProcessWorker, **edge):
    return make_settings(
        tmp_path,
        bind=f"127.0.0.1:{GATEWAY_PORT}",
        pool={"workers": [worker.url], "primary_workers": []},
        health_check={"interval_seconds": 0.5, "timeout_seconds": 5},
        **edge,
    )


async def test_port_accepts_only_after_the_first_probe_round(tmp_path: Path, worker: InProcessWorker, caplog) -> None:
    caplog.set_level(logging.INFO)
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve, settings_for(tmp_path, worker), stop.wait)
        await trio.sleep(0.3)  # give a wrong implementation time to open the port early
        assert not await port_accepts(GATEWAY_PORT)
        assert not any("池初始化完成" in r.getMessage() for r in caplog.records)
        worker.health_open.set()
        with trio.fail_after(5):
            while not await port_accepts(GATEWAY_PORT):
                await trio.sleep(0.02)
        ready = [r.getMessage() for r in caplog.records if "池初始化完成" in r.getMessage()]
        assert ready == ["Worker 池初始化完成 | 总数=1 | 在线=1 | 主worker=1"]
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{GATEWAY_PORT}") as client:
            assert (await client.get("/monitor")).status_code == 200
        stop.set()


async def test_client_writing_a_huge_body_before_reading_gets_1003(tmp_path: Path, worker: InProcessWorker) -> None:
    worker.health_open.set()
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        await nursery.start(serve, settings_for(tmp_path, worker, max_body_bytes=1024), stop.wait)
        body = b"z" * (3 * 1024 * 1024)
        head = (
            f"POST {MEASURE} HTTP/1.1\r\nHost: gw\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        stream = await trio.open_tcp_stream("127.0.0.1", GATEWAY_PORT)
        await stream.send_all(head.encode() + body)  # all of it, before reading a byte
        answer = b""
        with trio.fail_after(10):
            while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(b"}"):
                answer += await stream.receive_some(65536)
        await stream.aclose()
        assert answer.startswith(b"HTTP/1.1 200")
        assert json.loads(answer.split(b"\r\n\r\n", 1)[1])["code"] == 1003
        assert not worker.job_started.is_set(), "an over-limit body never reaches a worker"
        stop.set()


async def test_stop_drains_in_flight_requests_then_returns(tmp_path: Path, worker: InProcessWorker) -> None:
    worker.health_open.set()
    worker.job_may_finish = trio.Event()
    stop, answers = trio.Event(), []

    async def client_request() -> None:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{GATEWAY_PORT}", timeout=10) as client:
            answers.append((await client.post(MEASURE, json=PHOTO)).json())

    with trio.fail_after(15):
        async with trio.open_nursery() as nursery:
            await nursery.start(serve, settings_for(tmp_path, worker), stop.wait)
            nursery.start_soon(client_request)
            await worker.job_started.wait()
            stop.set()  # SIGTERM arrives while the request runs
            with trio.fail_after(5):
                while await port_accepts(GATEWAY_PORT):
                    await trio.sleep(0.02)
            worker.job_may_finish.set()
    assert [(answer["code"], answer["data"]) for answer in answers] == [(0, {"done": True})]
    log_lines = (tmp_path / "request_log.jsonl").read_text().splitlines()
    assert [json.loads(line)["code"] for line in log_lines] == [0], "the log is flushed on the way out"


async def test_refused_fault_request_closes_the_connection_at_once(tmp_path: Path, worker: InProcessWorker) -> None:
    # The token is checked before the body is read; the unread body would leave the
    # keep-alive connection unusable, so it is closed right after the 401, not left hanging.
    worker.health_open.set()
    stop = trio.Event()
    head = "POST /monitor/fault HTTP/1.1\r\nHost: gw\r\nX-Internal-Token: no\r\nContent-Length: 17\r\n\r\n"
    async with trio.open_nursery() as nursery:
        await nursery.start(serve, settings_for(tmp_path, worker), stop.wait)
        stream = await trio.open_tcp_stream("127.0.0.1", GATEWAY_PORT)
        await stream.send_all(head.encode())
        received = b""
        with trio.fail_after(5):
            while chunk := await stream.receive_some(65536):  # until the gateway closes
                received += chunk
        await stream.aclose()
        assert received.startswith(b"HTTP/1.1 401") and b"connection: close" in received.lower()
        stop.set()


async def receive_until_closed(stream: trio.SocketStream) -> bytes:
    received = b""
    with trio.fail_after(5):
        while chunk := await stream.receive_some(65536):
            received += chunk
    return received


async def test_a_client_that_leaves_while_queued_never_reaches_a_worker(
    tmp_path: Path, worker: InProcessWorker
) -> None:
    # Hypercorn does not cancel an app whose client left: before the fix this job ran
    # on the worker once it was free, for nobody
    worker.health_open.set()
    worker.job_may_finish = trio.Event()
    stop = trio.Event()
    head = (
        f"POST {MEASURE} HTTP/1.1\r\nHost: gw\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(PHOTO_BODY)}\r\n\r\n"
    )
    request = head.encode() + PHOTO_BODY
    async with trio.open_nursery() as nursery:
        await nursery.start(serve, settings_for(tmp_path, worker), stop.wait)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{GATEWAY_PORT}") as client:
            nursery.start_soon(partial(client.post, MEASURE, json=PHOTO))  # holds the only worker
            await worker.job_started.wait()
            leaver = await trio.open_tcp_stream("127.0.0.1", GATEWAY_PORT)
            await leaver.send_all(request)
            await trio.testing.wait_all_tasks_blocked()  # queued behind the first
            await leaver.aclose()
            await trio.testing.wait_all_tasks_blocked()  # the gateway saw the disconnect
            worker.job_may_finish.set()
            assert (await client.get("/monitor")).status_code == 200
            await trio.testing.wait_all_tasks_blocked()
        assert worker.jobs == 1
        stop.set()
    logged = [json.loads(line) for line in (tmp_path / "request_log.jsonl").read_text().splitlines()]
    assert sorted(entry["http_status"] for entry in logged) == [200, 499]


async def test_a_trickling_body_is_cut_off(tmp_path: Path, worker: InProcessWorker) -> None:
    worker.health_open.set()
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        settings = settings_for(tmp_path, worker, body_idle_timeout_seconds=0.3, body_timeout_seconds=1)
        await nursery.start(serve, settings, stop.wait)
        stream = await trio.open_tcp_stream("127.0.0.1", GATEWAY_PORT)
        await stream.send_all(f"POST {MEASURE} HTTP/1.1\r\nHost: gw\r\nContent-Length: 1000\r\n\r\n{{".encode())
        received = await receive_until_closed(stream)  # the gateway answers, then closes
        await stream.aclose()
        assert received.startswith(b"HTTP/1.1 200")
        assert json.loads(received.partition(b"\r\n\r\n")[2])["code"] == 1001
        assert worker.jobs == 0
        stop.set()


async def test_an_oversized_header_block_is_refused_and_every_worker_stays_online(
    tmp_path: Path, worker: InProcessWorker
) -> None:
    worker.health_open.set()
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        await nursery.start(serve, settings_for(tmp_path, worker), stop.wait)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{GATEWAY_PORT}") as client:
            huge = {"X-Forwarded-For": ", ".join(["198.51.100.1"] * 4000)}  # ~56 KB
            answer = await client.post(MEASURE, json=PHOTO, headers=huge)
            assert answer.json()["code"] == 1001
            assert (await client.get("/monitor")).status_code == 200
            assert (await client.post(MEASURE, json=PHOTO)).json()["code"] == 0
        assert worker.jobs == 1
        stop.set()


@pytest.mark.parametrize(
    ("path", "version", "connection"),
    [
        ("/static/annotations/nope.png", "1.1", "close"),
        ("/nowhere", "1.1", "close"),
        ("/monitor", "1.0", None),
        ("/nowhere", "1.0", None),
    ],
)
async def test_connection_close_and_http_1_0_are_honoured(
    tmp_path: Path, worker: InProcessWorker, path: str, version: str, connection: str | None
) -> None:
    worker.health_open.set()
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        await nursery.start(serve, settings_for(tmp_path, worker), stop.wait)
        stream = await trio.open_tcp_stream("127.0.0.1", GATEWAY_PORT)
        extra = f"Connection: {connection}\r\n" if connection else ""
        await stream.send_all(f"GET {path} HTTP/{version}\r\nHost: gw\r\n{extra}\r\n".encode())
        received = await receive_until_closed(stream)
        await stream.aclose()
        assert received.startswith(b"HTTP/1.1 ")
        stop.set()


@pytest.mark.parametrize(("length", "first_answer"), [(2048, b"HTTP/1.1 200"), (512, b"HTTP/1.1 100")])
async def test_expect_100_continue_over_the_limit_gets_the_1003_instead_of_a_continue(
    tmp_path: Path, worker: InProcessWorker, length: int, first_answer: bytes
) -> None:
    # curl sends `Expect: 100-continue` for large bodies and waits: a 100 made it send
    # megabytes only to be refused
    worker.health_open.set()
    stop = trio.Event()
    head = f"POST {MEASURE} HTTP/1.1\r\nHost: gw\r\nExpect: 100-continue\r\nContent-Length: {length}\r\n\r\n"
    async with trio.open_nursery() as nursery:
        await nursery.start(serve, settings_for(tmp_path, worker, max_body_bytes=1024), stop.wait)
        stream = await trio.open_tcp_stream("127.0.0.1", GATEWAY_PORT)
        await stream.send_all(head.encode())  # the head alone: the body waits for the 100
        with trio.fail_after(5):
            received = await stream.receive_some(65536)
        assert received.startswith(first_answer)
        if length > 1024:
            received += await receive_until_closed(stream)
            assert json.loads(received.partition(b"\r\n\r\n")[2])["code"] == 1003
        await stream.aclose()
        stop.set()


async def test_a_head_the_setting_allows_is_not_refused_by_the_server(tmp_path: Path, worker: InProcessWorker) -> None:
    # h11's own limit was 16 KiB while edge.max_header_bytes allowed up to 32 KiB: a head in
    # between, arriving in pieces, got a bare 431 from Hypercorn
    worker.health_open.set()
    stop = trio.Event()
    padding = "x" * (24 * 1024)
    head = f"POST {MEASURE} HTTP/1.1\r\nHost: gw\r\nX-Padding: {padding}\r\nContent-Type: application/json\r\n"
    head += f"Content-Length: {len(PHOTO_BODY)}\r\n\r\n"
    async with trio.open_nursery() as nursery:
        await nursery.start(serve, settings_for(tmp_path, worker, max_header_bytes=32 * 1024), stop.wait)
        stream = await trio.open_tcp_stream("127.0.0.1", GATEWAY_PORT)
        await stream.send_all(head[:20_000].encode())
        await trio.testing.wait_all_tasks_blocked()  # the server has buffered the first piece
        await stream.send_all(head[20_000:].encode() + PHOTO_BODY)
        with trio.fail_after(5):
            received = await stream.receive_some(65536)
        await stream.aclose()
        assert received.startswith(b"HTTP/1.1 200"), received[:40]
        stop.set()


def test_the_gateway_listener_offers_http_1_1_alone_and_its_protocol_overrides_existing_names(tmp_path: Path) -> None:
    # GatewayH11Protocol extends two methods of Hypercorn's (pinned: tests/test_framework_pins.py);
    # they must still be the ones its protocol calls where it sends `100 Continue`
    config = GatewayConfig(make_settings(tmp_path).edge)
    assert config.alpn_protocols == ["http/1.1"]
    assert issubclass(GatewayH11Protocol, HTTP1Protocol)
    assert {"_create_stream", "_send_h11_event"} <= set(H11Protocol._handle_events.__code__.co_names)


async def test_the_gateways_serve_installs_its_http_1_1_only_protocol_itself(
    tmp_path: Path, worker: InProcessWorker, monkeypatch
) -> None:
    # as in a process that imported nothing that could install it: serve() must (edge.main)
    hypercorns_own_classes(monkeypatch)
    worker.health_open.set()
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        await nursery.start(serve, settings_for(tmp_path, worker), stop.wait)
        assert installed_by_serve(), "edge.main.serve did not call shared.http_server.install()"
        preface = await exchange(GATEWAY_PORT, PREFACE + SETTINGS_FRAME)
        stop.set()
    assert (preface.status, preface.closed) == (505, True)
    assert hypercorn.protocol.H11Protocol is GatewayH11Protocol


BIG_ANSWER_BYTES = 24 * 1024 * 1024  # more than loopback's socket buffers hold


async def test_a_client_that_stops_reading_is_cut_off_and_logged_with_what_it_was_sent(
    tmp_path: Path, worker: InProcessWorker, monkeypatch
) -> None:
    # Hypercorn shields each socket write with no deadline, and the deadline the gateway put
    # on a shield around it bounded nothing: a reader that stopped held its handler, and a
    # graceful stop, forever; and a client that left mid-answer was logged 200, all bytes
    monkeypatch.setattr("shared.http_server.SEND_LIMIT_SECONDS", 1.0)
    worker.health_open.set()
    worker.blob_bytes = BIG_ANSWER_BYTES
    stop = trio.Event()
    head = (
        f"POST {MEASURE} HTTP/1.1\r\nHost: gw\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(PHOTO_BODY)}\r\n\r\n"
    )
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(serve, settings_for(tmp_path, worker), stop.wait)
            stalled = await trio.open_tcp_stream("127.0.0.1", GATEWAY_PORT)
            await stalled.send_all(head.encode() + PHOTO_BODY)
            first = await stalled.receive_some(65536)  # the answer started; then nothing is read
            logged = await request_log_lines(tmp_path, 1)  # written once the gateway gave up on it
            await receive_until_closed(stalled)  # and closed the connection
            stop.set()  # and a graceful stop is not held by it
    assert first.startswith(b"HTTP/1.1 200")
    ((status, sent),) = [(entry["http_status"], entry["bytes_out"]) for entry in logged]
    assert status == 499 and 0 < sent < BIG_ANSWER_BYTES, (status, sent)


async def test_a_client_that_leaves_mid_answer_is_logged_499_with_the_bytes_sent(
    tmp_path: Path, worker: InProcessWorker
) -> None:
    worker.health_open.set()
    worker.blob_bytes = BIG_ANSWER_BYTES
    stop = trio.Event()
    head = (
        f"POST {MEASURE} HTTP/1.1\r\nHost: gw\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(PHOTO_BODY)}\r\n\r\n"
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(serve, settings_for(tmp_path, worker), stop.wait)
        leaver = await trio.open_tcp_stream("127.0.0.1", GATEWAY_PORT)
        await leaver.send_all(head.encode() + PHOTO_BODY)
        assert (await leaver.receive_some(65536)).startswith(b"HTTP/1.1 200")
        leaver.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        await leaver.aclose()  # a reset, as a phone that lost its network mid-download
        logged = await request_log_lines(tmp_path, 1)
        stop.set()
    ((status, sent),) = [(entry["http_status"], entry["bytes_out"]) for entry in logged]
    assert status == 499 and 0 < sent < BIG_ANSWER_BYTES, (status, sent)


async def request_log_lines(directory: Path, count: int) -> list[dict]:
    """The request log once it holds `count` lines (it is written in batches: polled)."""
    path = directory / "request_log.jsonl"
    with trio.fail_after(15):
        while len(lines := path.read_text().splitlines() if path.exists() else []) < count:
            await trio.sleep(0.05)
    return [json.loads(line) for line in lines]
