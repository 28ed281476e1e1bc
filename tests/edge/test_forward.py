"""The gateway's client to the workers against real sockets on loopback: headers, failure
kinds, and how it keeps connections."""

from __future__ import annotations

import json
import threading
import socket
from functools import partial

import h11
import hypercorn.trio
import pytest
import trio
from hypercorn.config import Config

import edge.pool.forward as forward_module
from edge.pool.forward import (
    FailureKind,
    ForwardRequest,
    RetryPolicy,
    Upstream,
    WorkerBusy,
    WorkerFailure,
    WorkerRefusal,
    deadline_milliseconds,
)
from shared.contract import Code, envelope

TOKEN = "forward-test-token"


async def worker_app(scope, receive, send) -> None:
    """A worker with one behaviour per path; `/echo` returns the headers it received."""
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    path = scope["path"]
    status, payload, content_type = 200, b"", b"application/json"
    if path == "/echo":
        headers = {k.decode(): v.decode() for k, v in scope["headers"]}
        data = {"headers": headers, "body": body.decode(), "query": scope["query_string"].decode()}
        payload = json.dumps(envelope(Code.OK, "rid", data)).encode()
    elif path == "/status":
        status = int(scope["query_string"].decode())
        payload = b"<html>error</html>"
        content_type = b"text/html"
    elif path == "/not-json":
        payload = b"<html>ok</html>"
    elif path == "/large":  # an answer with megabytes of images
        payload = json.dumps(envelope(Code.OK, "rid", {"mask_image_base64": "A" * 2_000_000})).encode()
    elif path == "/not-envelope":
        payload = b'{"result": 1}'
    elif path == "/slow":
        await trio.sleep(5)
    elif path == "/busy":  # what a GPU host answers while another gateway's job runs
        status, payload = 503, b'{"code": 1007, "message": "busy", "busy": true}'
    elif path == "/health":
        payload = b'{"status": "ok", "busy": false}'
    await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", content_type)]})
    await send({"type": "http.response.body", "body": payload})


@pytest.fixture
async def worker_url(nursery) -> str:
    config = Config()
    config.bind = ["127.0.0.1:0"]
    config.accesslog = None
    urls = await nursery.start(partial(hypercorn.trio.serve, worker_app, config))
    return urls[0]


@pytest.fixture
async def upstream():
    client = Upstream(TOKEN, keepalive_connections=4)
    yield client
    await client.aclose()


def request(target: str = "/echo", body: bytes = b'{"image_base64": "AAAA"}') -> ForwardRequest:
    path, _, query = target.partition("?")
    return ForwardRequest("POST", path, query, body, "application/json", "req-42", "198.51.100.1, 127.0.0.1", "exec_1723456789012_000_00007")


async def test_forward_sends_exactly_the_whitelisted_headers(upstream: Upstream, worker_url: str) -> None:
    answer = await upstream.forward(worker_url, request("/echo?a=1&b=2"), 5)
    data = answer.envelope["data"]
    headers = data["headers"]
    assert headers["x-internal-token"] == TOKEN
    assert headers["x-request-id"] == "req-42"
    assert headers["x-execution-id"] == "exec_1723456789012_000_00007", "the audit row's id reaches the host"
    assert headers["x-forwarded-for"] == "198.51.100.1, 127.0.0.1"
    assert headers["content-type"] == "application/json"
    assert headers["x-request-timeout-ms"] == "5000", "the attempt's timeout reaches the host"
    assert set(headers) == {
        "host", "content-length", "x-internal-token", "x-request-id", "x-forwarded-for", "content-type",
        "x-request-timeout-ms", "x-execution-id",
    }  # fmt: skip
    assert (data["body"], data["query"]) == ('{"image_base64": "AAAA"}', "a=1&b=2")


@pytest.mark.parametrize(
    ("target", "kind"),
    [
        ("/status?500", FailureKind.BAD_STATUS),
        ("/status?503", FailureKind.BAD_STATUS),
        ("/status?401", FailureKind.BAD_STATUS),
        ("/not-json", FailureKind.UNUSABLE_BODY),
        ("/not-envelope", FailureKind.UNUSABLE_BODY),
    ],
)
async def test_bad_answers(upstream: Upstream, worker_url: str, target: str, kind: FailureKind) -> None:
    with pytest.raises(WorkerFailure) as caught:
        await upstream.forward(worker_url, request(target), 5)
    assert caught.value.kind is kind


@pytest.mark.parametrize("status", [400, 404, 413, 431])
async def test_a_4xx_other_than_401_is_a_refusal_not_a_failure(upstream: Upstream, worker_url: str, status: int) -> None:
    # e.g. 431: the client's header block did not fit the host; the host itself is fine
    with pytest.raises(WorkerRefusal) as caught:
        await upstream.forward(worker_url, request(f"/status?{status}"), 5)
    assert caught.value.status == status


async def test_timeout_bounds_the_whole_exchange(upstream: Upstream, worker_url: str) -> None:
    started = trio.current_time()
    with pytest.raises(WorkerFailure) as caught:
        await upstream.forward(worker_url, request("/slow"), 0.3)
    assert caught.value.kind is FailureKind.TIMEOUT
    assert trio.current_time() - started < 2


async def test_refused_connection_is_a_connect_failure(upstream: Upstream) -> None:
    with socket.socket() as placeholder:
        placeholder.bind(("127.0.0.1", 0))
        port = placeholder.getsockname()[1]
    with pytest.raises(WorkerFailure) as caught:
        await upstream.forward(f"http://127.0.0.1:{port}", request(), 2)
    assert caught.value.kind is FailureKind.CONNECT


async def test_connection_closed_before_an_answer(upstream: Upstream, nursery) -> None:
    async def hang_up(stream: trio.SocketStream) -> None:
        await stream.receive_some(65536)  # the worker process "dies" mid-request
        await stream.aclose()

    listeners = await nursery.start(partial(trio.serve_tcp, hang_up, 0, host="127.0.0.1"))
    port = listeners[0].socket.getsockname()[1]
    with pytest.raises(WorkerFailure) as caught:
        await upstream.forward(f"http://127.0.0.1:{port}", request(), 2)
    assert caught.value.kind is FailureKind.CLOSED


async def test_probe_returns_status_and_body(upstream: Upstream, worker_url: str) -> None:
    answer = await upstream.probe(worker_url + "/health", 2)
    assert (answer.status, json.loads(answer.body)["busy"]) == (200, False)


@pytest.mark.parametrize(
    ("kind", "path", "attempts", "allowed"),
    [
        (FailureKind.CONNECT, "/api/v1/hair/grow", 1, True),
        (FailureKind.CLOSED, "/api/v1/hair/grow", 1, True),
        (FailureKind.BAD_STATUS, "/api/v1/hair/grow", 1, True),
        (FailureKind.TIMEOUT, "/api/v1/hair/measure", 1, True),
        (FailureKind.TIMEOUT, "/api/v1/hair/grow", 1, False),  # the job may still run there
        (FailureKind.BAD_STATUS, "/api/v1/hair/measure", 2, False),  # max_retries=1 used up
    ],
)
def test_retry_policy(kind: FailureKind, path: str, attempts: int, allowed: bool) -> None:
    policy = RetryPolicy(retry_on_failure=True, max_retries=1, slow_paths=frozenset({"/api/v1/hair/grow"}))
    assert policy.allows_retry(WorkerFailure(kind, "x"), path, attempts) is allowed
    disabled = RetryPolicy(retry_on_failure=False, max_retries=1, slow_paths=frozenset())
    assert not disabled.allows_retry(WorkerFailure(kind, "x"), path, attempts)


async def test_a_url_of_another_scheme_is_a_connect_failure(upstream: Upstream) -> None:
    # UnsupportedProtocol escaped the failure mapping: a traceback instead of an ejection
    with pytest.raises(WorkerFailure) as caught:
        await upstream.forward("ftp://127.0.0.1:1", request(), 5)
    assert caught.value.kind is FailureKind.CONNECT



async def test_503_busy_is_busy_elsewhere_and_a_plain_503_a_failure(upstream: Upstream, worker_url: str) -> None:
    with pytest.raises(WorkerBusy):
        await upstream.forward(worker_url, request("/busy"), 5)
    with pytest.raises(WorkerFailure):
        await upstream.forward(worker_url, request("/status?503"), 5)



@pytest.mark.parametrize(("target", "off_the_loop"), [("/echo", False), ("/large", True)])
async def test_a_large_answer_is_parsed_off_the_event_loop(
    upstream: Upstream, worker_url: str, monkeypatch, target: str, off_the_loop: bool
) -> None:
    # parsing 12 MB of JSON held the loop (every other request, /monitor) for ~13 ms
    threads: list[bool] = []
    parse = forward_module._parse_envelope

    def recording(raw: bytes):
        threads.append(threading.current_thread() is not threading.main_thread())
        return parse(raw)

    monkeypatch.setattr(forward_module, "_parse_envelope", recording)
    await upstream.forward(worker_url, request(target), 5)
    assert threads == [off_the_loop]


async def test_an_answer_over_the_cap_is_unusable_not_held(upstream: Upstream, worker_url: str, monkeypatch) -> None:
    monkeypatch.setattr(forward_module, "MAX_ANSWER_BYTES", 1000)
    with pytest.raises(WorkerFailure) as caught:
        await upstream.forward(worker_url, request("/large"), 5)
    assert caught.value.kind is FailureKind.UNUSABLE_BODY


async def test_a_header_h11_refuses_is_not_quoted_in_the_failure(worker_url: str) -> None:
    # h11's own message quotes the value: here, the shared password
    upstream = Upstream("secret-token-with-newline\n", keepalive_connections=2)
    try:
        with pytest.raises(WorkerFailure) as caught:
            await upstream.forward(worker_url, request(), 5)
    finally:
        await upstream.aclose()
    assert "secret-token" not in str(caught.value)


async def test_a_cancelled_forward_closes_the_upstream_connection(upstream: Upstream, nursery) -> None:
    """A client that leaves mid-forward: the host must see the close (and stop), not a
    connection kept open for an answer nobody reads."""
    closed = trio.Event()

    async def holds_until_closed(stream: trio.SocketStream) -> None:
        await stream.receive_some(65536)  # the request arrived; never answer it
        while await stream.receive_some(65536):
            pass
        closed.set()  # end of stream: the gateway closed its side

    listeners = await nursery.start(partial(trio.serve_tcp, holds_until_closed, 0, host="127.0.0.1"))
    port = listeners[0].socket.getsockname()[1]
    with trio.move_on_after(0.2):
        await upstream.forward(f"http://127.0.0.1:{port}", request(), 30)
    with trio.fail_after(2):
        await closed.wait()


@pytest.mark.parametrize(
    ("timeout_seconds", "milliseconds"), [(180, 180000), (2.5, 2500), (1.0009, 1000), (1.001, 1001), (0.0019, 1)]
)
def test_the_deadline_header_is_whole_milliseconds_rounded_down(timeout_seconds: float, milliseconds: int) -> None:
    # a pure function: a real forward with a 1.9 ms deadline times out before the host answers
    assert deadline_milliseconds(timeout_seconds) == milliseconds


class ScriptedWorker:
    """A worker on raw sockets whose answers' framing a test chooses; counts connections."""

    def __init__(self) -> None:
        self.connections = 0
        self.close_after_answer = False  # says `Connection: close`
        self.hang_up_when_idle = False  # closes a keep-alive connection without a word
        self.chunked = False
        self.hung_up = trio.Event()

    async def serve(self, stream: trio.SocketStream) -> None:
        self.connections += 1
        protocol = h11.Connection(h11.SERVER)
        while True:
            event = protocol.next_event()
            if event is h11.NEED_DATA:
                if not (data := await stream.receive_some(65536)):
                    return
                protocol.receive_data(data)
            elif isinstance(event, h11.EndOfMessage):
                await stream.send_all(self._answer(protocol))
                if protocol.our_state is h11.MUST_CLOSE or self.hang_up_when_idle:
                    await stream.aclose()
                    self.hung_up.set()
                    return
                protocol.start_next_cycle()

    def _answer(self, protocol: h11.Connection) -> bytes:
        body = json.dumps(envelope(Code.OK, "rid", {"framing": "chunked" if self.chunked else "length"})).encode()
        headers = [("Content-Type", "application/json")]
        headers.append(("Transfer-Encoding", "chunked") if self.chunked else ("Content-Length", str(len(body))))
        if self.close_after_answer:
            headers.append(("Connection", "close"))
        halves = [body[: len(body) // 2], body[len(body) // 2 :]] if self.chunked else [body]
        events = [h11.Response(status_code=200, headers=headers), *(h11.Data(data=half) for half in halves)]
        return b"".join(protocol.send(event) or b"" for event in [*events, h11.EndOfMessage()])


@pytest.fixture
async def scripted(nursery) -> tuple[ScriptedWorker, str]:
    worker = ScriptedWorker()
    listeners = await nursery.start(partial(trio.serve_tcp, worker.serve, 0, host="127.0.0.1"))
    return worker, f"http://127.0.0.1:{listeners[0].socket.getsockname()[1]}"


async def test_forwards_to_one_worker_share_one_kept_connection(upstream: Upstream, scripted) -> None:
    worker, url = scripted
    for _ in range(3):
        assert (await upstream.forward(url, request(), 5)).envelope["code"] == Code.OK
    assert worker.connections == 1


async def test_a_worker_that_says_close_gets_the_next_forward_on_a_new_connection(upstream: Upstream, scripted) -> None:
    worker, url = scripted
    worker.close_after_answer = True
    for _ in range(2):
        assert (await upstream.forward(url, request(), 5)).envelope["code"] == Code.OK
    assert worker.connections == 2


async def test_an_idle_connection_the_worker_closed_is_not_sent_on(upstream: Upstream, scripted) -> None:
    # a forward on it would fail as "closed" and eject a healthy worker
    worker, url = scripted
    worker.hang_up_when_idle = True
    await upstream.forward(url, request(), 5)
    await worker.hung_up.wait()
    assert (await upstream.forward(url, request(), 5)).envelope["code"] == Code.OK
    assert worker.connections == 2


async def test_a_connection_idle_past_the_keepalive_expiry_is_replaced(
    upstream: Upstream, scripted, monkeypatch
) -> None:
    # below the worker's own keep-alive timeout, so that it is never the one closing it mid-send
    worker, url = scripted
    monkeypatch.setattr(forward_module, "KEEPALIVE_EXPIRY_SECONDS", 0.0)
    for _ in range(2):
        await upstream.forward(url, request(), 5)
    assert worker.connections == 2


async def test_a_chunked_answer_is_read_whole(upstream: Upstream, scripted) -> None:
    worker, url = scripted
    worker.chunked = True
    assert (await upstream.forward(url, request(), 5)).envelope["data"] == {"framing": "chunked"}


async def test_no_more_idle_connections_are_kept_than_allowed(scripted) -> None:
    worker, url = scripted
    upstream = Upstream(TOKEN, keepalive_connections=0)
    for _ in range(2):
        await upstream.forward(url, request(), 5)
    await upstream.aclose()
    assert worker.connections == 2


async def test_an_answer_sent_before_the_whole_body_was_read_is_the_answer(upstream: Upstream, nursery) -> None:
    # e.g. a host whose body limit is lower than the gateway's answers 413 after the head
    # and closes: that is a refusal of this request, not a broken host to eject
    async def refuses_early(stream: trio.SocketStream) -> None:
        received = b""
        while b"\r\n\r\n" not in received:
            received += await stream.receive_some(65536)
        await stream.send_all(b"HTTP/1.1 413 Payload Too Large\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        await stream.aclose()  # the rest of the body unread: the gateway's write fails

    listeners = await nursery.start(partial(trio.serve_tcp, refuses_early, 0, host="127.0.0.1"))
    port = listeners[0].socket.getsockname()[1]
    with pytest.raises(WorkerRefusal) as caught:
        await upstream.forward(f"http://127.0.0.1:{port}", request(body=b"x" * 8_000_000), 5)
    assert caught.value.status == 413
