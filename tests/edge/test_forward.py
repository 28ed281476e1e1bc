"""The real httpcore client against real sockets on loopback: headers and failure kinds."""

from __future__ import annotations

import json
import threading
import socket
from functools import partial

import hypercorn.trio
import pytest
import trio
from hypercorn.config import Config

import edge.pool.forward as forward_module
from edge.pool.forward import FailureKind, ForwardRequest, RetryPolicy, Upstream, WorkerBusy, WorkerFailure, WorkerRefusal
from shared.contract import envelope

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
        payload = json.dumps(envelope(0, "rid", data)).encode()
    elif path == "/status":
        status = int(scope["query_string"].decode())
        payload = b"<html>error</html>"
        content_type = b"text/html"
    elif path == "/not-json":
        payload = b"<html>ok</html>"
    elif path == "/large":  # an answer with megabytes of images
        payload = json.dumps(envelope(0, "rid", {"mask_image_base64": "A" * 2_000_000})).encode()
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
    return ForwardRequest("POST", path, query, body, "application/json", "req-42", "198.51.100.1, 127.0.0.1")


async def test_forward_sends_exactly_the_whitelisted_headers(upstream: Upstream, worker_url: str) -> None:
    answer = await upstream.forward(worker_url, request("/echo?a=1&b=2"), 5)
    data = answer.envelope["data"]
    headers = data["headers"]
    assert headers["x-internal-token"] == TOKEN
    assert headers["x-request-id"] == "req-42"
    assert headers["x-forwarded-for"] == "198.51.100.1, 127.0.0.1"
    assert headers["content-type"] == "application/json"
    assert set(headers) == {"host", "content-length", "x-internal-token", "x-request-id", "x-forwarded-for", "content-type"}
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


async def test_a_url_httpcore_cannot_send_to_is_a_connect_failure(upstream: Upstream) -> None:
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
