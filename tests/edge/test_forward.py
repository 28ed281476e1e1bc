"""The gateway's client to the workers against real sockets on loopback: headers, failure
kinds, and how it keeps connections."""

from __future__ import annotations

import json
import socket
import threading
from functools import partial

import h11
import httpx
import hypercorn.trio
import pytest
import trio
from hypercorn.config import Config

import edge.pool.failures as failures_module
from edge.app import create_app
from edge.gateway import Gateway, build_gateway
from edge.pool.errors import (
    AmbiguousFraming,
    AnswerTooLarge,
    BadStatus,
    ConnectError,
    ConnectionClosed,
    RequestNotSent,
    UnusableAnswer,
    UpstreamTimeout,
    WorkerBusy,
    WorkerFailure,
    WorkerRefusal,
)
from edge.pool.failures import RetryPolicy, forwarded
from edge.pool.upstream import ForwardRequest, Upstream, UpstreamLimits, deadline_milliseconds
from shared.contract import HEADER_HOST_WANTED, Code, envelope
from tests.edge.conftest import PHOTO_BODY, bring_online, make_settings
from tests.fakes.raw_host import Misbehaviour, RawHost, response

TOKEN = "forward-test-token"
MEASURE = "/api/v1/hair/measure"


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
    rid = dict(scope["headers"]).get(b"x-request-id", b"").decode()  # echoed, as a host does
    status, payload, content_type = 200, b"", b"application/json"
    if path == "/echo":
        headers = {k.decode(): v.decode() for k, v in scope["headers"]}
        data = {"headers": headers, "body": body.decode(), "query": scope["query_string"].decode()}
        payload = json.dumps(envelope(Code.OK, rid, data)).encode()
    elif path == "/status":
        status = int(scope["query_string"].decode())
        payload = b"<html>error</html>"
        content_type = b"text/html"
    elif path == "/not-json":
        payload = b"<html>ok</html>"
    elif path == "/large":  # an answer with megabytes of images
        payload = json.dumps(envelope(Code.OK, rid, {"mask_image_base64": "A" * 2_000_000})).encode()
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
    client = Upstream(TOKEN, UpstreamLimits(keepalive_connections=4))
    yield client
    await client.aclose()


def request(
    target: str = "/echo", body: bytes = b'{"image_base64": "AAAA"}', request_id: str = "req-42"
) -> ForwardRequest:
    path, _, query = target.partition("?")
    return ForwardRequest(
        "POST",
        path,
        query,
        body,
        "application/json",
        request_id,
        "198.51.100.1, 127.0.0.1",
        "exec_1723456789012_000_00007",
    )


async def test_forward_sends_exactly_the_whitelisted_headers(upstream: Upstream, worker_url: str, mock_clock) -> None:
    # mock_clock: time stands still unless jumped, so the whole attempt timeout remains
    answer = await forwarded(upstream, worker_url, request("/echo?a=1&b=2"), 5)
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


async def test_the_deadline_sent_is_what_remains_after_connecting(
    upstream: Upstream, worker_url: str, mock_clock, monkeypatch
) -> None:
    # a TLS handshake to a far host takes part of the attempt's timeout: the host must not
    # be told it has the whole of it (it would work on past the gateway's deadline)
    connect = Upstream._connect

    async def slow_connect(self: Upstream, origin):
        mock_clock.jump(1.5)
        return await connect(self, origin)

    monkeypatch.setattr(Upstream, "_connect", slow_connect)
    first = await forwarded(upstream, worker_url, request(), 5)
    again = await forwarded(upstream, worker_url, request(), 5)  # the kept connection: no connect
    sent = [answer.envelope["data"]["headers"]["x-request-timeout-ms"] for answer in (first, again)]
    assert sent == ["3500", "5000"]


@pytest.mark.parametrize(
    ("target", "kind"),
    [
        ("/status?500", BadStatus),
        ("/status?503", BadStatus),
        ("/status?401", BadStatus),
        ("/not-json", UnusableAnswer),
        ("/not-envelope", UnusableAnswer),
    ],
)
async def test_bad_answers(upstream: Upstream, worker_url: str, target: str, kind: type[WorkerFailure]) -> None:
    with pytest.raises(kind):
        await forwarded(upstream, worker_url, request(target), 5)


@pytest.mark.parametrize("status", [400, 404, 413, 431])
async def test_a_4xx_other_than_401_is_a_refusal_not_a_failure(
    upstream: Upstream, worker_url: str, status: int
) -> None:
    # e.g. 431: the client's header block did not fit the host; the host itself is fine
    with pytest.raises(WorkerRefusal) as caught:
        await forwarded(upstream, worker_url, request(f"/status?{status}"), 5)
    assert caught.value.status == status


async def test_timeout_bounds_the_whole_exchange(upstream: Upstream, worker_url: str) -> None:
    started = trio.current_time()
    with pytest.raises(UpstreamTimeout):
        await forwarded(upstream, worker_url, request("/slow"), 0.3)
    assert trio.current_time() - started < 2


async def test_refused_connection_is_a_connect_failure(upstream: Upstream) -> None:
    with socket.socket() as placeholder:
        placeholder.bind(("127.0.0.1", 0))
        port = placeholder.getsockname()[1]
    with pytest.raises(ConnectError):
        await forwarded(upstream, f"http://127.0.0.1:{port}", request(), 2)


async def test_connection_closed_before_an_answer(upstream: Upstream, nursery) -> None:
    async def hang_up(stream: trio.SocketStream) -> None:
        await stream.receive_some(65536)  # the worker process "dies" mid-request
        await stream.aclose()

    listeners = await nursery.start(partial(trio.serve_tcp, hang_up, 0, host="127.0.0.1"))
    port = listeners[0].socket.getsockname()[1]
    with pytest.raises(ConnectionClosed):
        await forwarded(upstream, f"http://127.0.0.1:{port}", request(), 2)


async def test_a_probe_that_wants_the_host_says_so_in_its_header(upstream: Upstream, worker_url: str) -> None:
    told = {}
    for wanted in (False, True):
        answer = await upstream.probe(worker_url + "/echo", 2, wanted)
        told[wanted] = json.loads(answer.body)["data"]["headers"].get(HEADER_HOST_WANTED.lower())
    assert told == {False: None, True: "1"}


async def test_probe_returns_status_and_body(upstream: Upstream, worker_url: str) -> None:
    answer = await upstream.probe(worker_url + "/health", 2)
    assert (answer.status, json.loads(answer.body)["busy"]) == (200, False)


@pytest.mark.parametrize(
    ("kind", "path", "attempts", "allowed"),
    [
        (ConnectError, "/api/v1/hair/grow", 1, True),
        (ConnectionClosed, "/api/v1/hair/grow", 1, True),
        (BadStatus, "/api/v1/hair/grow", 1, True),
        (UpstreamTimeout, "/api/v1/hair/measure", 1, True),
        (UpstreamTimeout, "/api/v1/hair/grow", 1, False),  # the job may still run there
        (BadStatus, "/api/v1/hair/measure", 2, False),  # max_retries=1 used up
    ],
)
def test_retry_policy(kind: type[WorkerFailure], path: str, attempts: int, allowed: bool) -> None:
    policy = RetryPolicy(retry_on_failure=True, max_retries=1, slow_paths=frozenset({"/api/v1/hair/grow"}))
    assert policy.allows_retry(kind("x"), path, attempts) is allowed
    disabled = RetryPolicy(retry_on_failure=False, max_retries=1, slow_paths=frozenset())
    assert not disabled.allows_retry(kind("x"), path, attempts)


async def test_a_url_of_another_scheme_is_a_connect_failure(upstream: Upstream) -> None:
    # UnsupportedProtocol escaped the failure mapping: a traceback instead of an ejection
    with pytest.raises(ConnectError):
        await forwarded(upstream, "ftp://127.0.0.1:1", request(), 5)


async def test_503_busy_is_busy_elsewhere_and_a_plain_503_a_failure(upstream: Upstream, worker_url: str) -> None:
    with pytest.raises(WorkerBusy):
        await forwarded(upstream, worker_url, request("/busy"), 5)
    with pytest.raises(BadStatus):
        await forwarded(upstream, worker_url, request("/status?503"), 5)


@pytest.mark.parametrize(("target", "off_the_loop"), [("/echo", False), ("/large", True)])
async def test_a_large_answer_is_parsed_off_the_event_loop(
    upstream: Upstream, worker_url: str, monkeypatch, target: str, off_the_loop: bool
) -> None:
    # parsing 12 MB of JSON held the loop (every other request, /monitor) for ~13 ms
    threads: list[bool] = []
    parse = failures_module._parse_envelope

    def recording(raw: bytes):
        threads.append(threading.current_thread() is not threading.main_thread())
        return parse(raw)

    monkeypatch.setattr(failures_module, "_parse_envelope", recording)
    await forwarded(upstream, worker_url, request(target), 5)
    assert threads == [off_the_loop]


async def test_an_answer_over_the_cap_is_unusable_not_held(worker_url: str) -> None:
    upstream = Upstream(TOKEN, UpstreamLimits(keepalive_connections=4, max_answer_bytes=1000))
    with pytest.raises(AnswerTooLarge) as caught:
        await forwarded(upstream, worker_url, request("/large"), 5)
    assert caught.value.reason == "unusable_body"


async def test_a_header_h11_refuses_is_not_sent_and_not_the_workers_fault(worker_url: str) -> None:
    # it was a CONNECT failure: the gateway's own bad header ejected a healthy worker.
    # h11's own message quotes the value: here, the shared password
    upstream = Upstream("secret-token-with-newline\n", UpstreamLimits(keepalive_connections=2))
    try:
        with pytest.raises(RequestNotSent) as caught:
            await forwarded(upstream, worker_url, request(), 5)
    finally:
        await upstream.aclose()
    assert caught.value.code is Code.SYSTEM_ERROR
    assert "secret-token" not in str(caught.value) + caught.value.message


async def test_a_query_h11_refuses_is_the_clients_fault(upstream: Upstream, scripted) -> None:
    worker, url = scripted
    with pytest.raises(RequestNotSent) as caught:
        await forwarded(upstream, url, request("/echo?a b"), 5)
    assert caught.value.code is Code.INVALID_PARAMETER
    assert worker.connections <= 1 and (await forwarded(upstream, url, request(), 5)).envelope["code"] == Code.OK


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
        await forwarded(upstream, f"http://127.0.0.1:{port}", request(), 30)
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
            elif isinstance(event, h11.Request):
                request_id = dict(event.headers).get(b"x-request-id", b"").decode()
            elif isinstance(event, h11.EndOfMessage):
                await stream.send_all(self._answer(protocol, request_id))
                if protocol.our_state is h11.MUST_CLOSE or self.hang_up_when_idle:
                    await stream.aclose()
                    self.hung_up.set()
                    return
                protocol.start_next_cycle()

    def _answer(self, protocol: h11.Connection, request_id: str) -> bytes:
        body = json.dumps(envelope(Code.OK, request_id, {"framing": "chunked" if self.chunked else "length"})).encode()
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
        assert (await forwarded(upstream, url, request(), 5)).envelope["code"] == Code.OK
    assert worker.connections == 1


async def test_a_worker_that_says_close_gets_the_next_forward_on_a_new_connection(upstream: Upstream, scripted) -> None:
    worker, url = scripted
    worker.close_after_answer = True
    for _ in range(2):
        assert (await forwarded(upstream, url, request(), 5)).envelope["code"] == Code.OK
    assert worker.connections == 2


async def test_an_idle_connection_the_worker_closed_is_not_sent_on(upstream: Upstream, scripted) -> None:
    # a forward on it would fail as "closed" and eject a healthy worker
    worker, url = scripted
    worker.hang_up_when_idle = True
    await forwarded(upstream, url, request(), 5)
    await worker.hung_up.wait()
    assert (await forwarded(upstream, url, request(), 5)).envelope["code"] == Code.OK
    assert worker.connections == 2


async def test_a_connection_idle_past_the_keepalive_expiry_is_replaced(scripted) -> None:
    # below the worker's own keep-alive timeout, so that it is never the one closing it mid-send
    worker, url = scripted
    upstream = Upstream(TOKEN, UpstreamLimits(keepalive_connections=4, keepalive_expiry_seconds=0.0))
    for _ in range(2):
        await forwarded(upstream, url, request(), 5)
    await upstream.aclose()
    assert worker.connections == 2


async def test_a_chunked_answer_is_read_whole(upstream: Upstream, scripted) -> None:
    worker, url = scripted
    worker.chunked = True
    assert (await forwarded(upstream, url, request(), 5)).envelope["data"] == {"framing": "chunked"}


async def test_no_more_idle_connections_are_kept_than_allowed(scripted) -> None:
    worker, url = scripted
    upstream = Upstream(TOKEN, UpstreamLimits(keepalive_connections=0))
    for _ in range(2):
        await forwarded(upstream, url, request(), 5)
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
        await forwarded(upstream, f"http://127.0.0.1:{port}", request(body=b"x" * 8_000_000), 5)
    assert caught.value.status == 413


# --- a host that misbehaves at the byte level (tests/fakes/raw_host.py) --------------------


@pytest.fixture
async def raw_host(nursery) -> RawHost:
    host = RawHost()
    await host.start(nursery)
    return host


async def answered_ids(upstream: Upstream, host: RawHost, clients: int, between=None) -> list[str]:
    """The request_id of the answer each of `clients` sequential forwards got."""
    ids = []
    for number in range(clients):
        later_write = host.later_write_done
        answer = await forwarded(upstream, host.url, request(request_id=f"client-{number}"), 5)
        ids.append(answer.envelope["request_id"])
        if host.misbehaviour is Misbehaviour.SECOND_RESPONSE_LATER:
            await later_write.wait()  # the unsolicited answer was written: it waits unread
    return ids


@pytest.mark.parametrize("misbehaviour", [Misbehaviour.SECOND_RESPONSE_SAME_WRITE, Misbehaviour.SECOND_RESPONSE_LATER])
async def test_an_unsolicited_second_response_never_reaches_the_next_client(
    upstream: Upstream, raw_host: RawHost, misbehaviour: Misbehaviour
) -> None:
    # it did: the connection was kept with the stale answer buffered (7 of 8 clients got
    # another request's answer in the attack; 1 of 8 when it came 200 ms later)
    raw_host.misbehaviour = misbehaviour
    assert await answered_ids(upstream, raw_host, 8) == [f"client-{n}" for n in range(8)]
    assert (raw_host.stale_sent, raw_host.connections) == (8, 8), "every stale answer's connection was dropped"
    assert raw_host.requests == [f"client-{n}" for n in range(8)], "each sent once: nothing failed"


@pytest.mark.parametrize("misbehaviour", [Misbehaviour.SECOND_RESPONSE_SAME_WRITE, Misbehaviour.SECOND_RESPONSE_LATER])
async def test_an_unsolicited_response_after_health_never_reaches_a_forward(
    upstream: Upstream, raw_host: RawHost, misbehaviour: Misbehaviour
) -> None:
    # probes and forwards share the idle connections
    raw_host.misbehaviour = misbehaviour
    later_write = raw_host.later_write_done
    assert (await upstream.probe(raw_host.url + "/health", 5)).status == 200
    if misbehaviour is Misbehaviour.SECOND_RESPONSE_LATER:
        await later_write.wait()
    raw_host.misbehaviour = Misbehaviour.NONE
    assert (await forwarded(upstream, raw_host.url, request(request_id="after-health"), 5)).envelope[
        "request_id"
    ] == "after-health"
    assert (raw_host.requests, raw_host.connections) == (["health", "after-health"], 2)


async def test_bytes_past_a_short_content_length_never_break_the_next_exchange(
    upstream: Upstream, raw_host: RawHost
) -> None:
    # the 3 bytes left were read as the start of the next answer: a CLOSED failure that
    # ejected the host for an answer it gave right
    raw_host.misbehaviour = Misbehaviour.SHORT_CONTENT_LENGTH
    assert await answered_ids(upstream, raw_host, 3) == ["client-0", "client-1", "client-2"]
    assert raw_host.connections == 3
    await upstream.probe(raw_host.url + "/health", 5)  # a probe after one, too
    raw_host.misbehaviour = Misbehaviour.NONE
    assert await answered_ids(upstream, raw_host, 2) == ["client-0", "client-1"]
    assert raw_host.connections == 5, "the probe's connection had 3 bytes left: not reused"


async def test_an_answer_with_content_length_and_transfer_encoding_is_refused_and_closed(
    upstream: Upstream, raw_host: RawHost
) -> None:
    raw_host.misbehaviour = Misbehaviour.LENGTH_AND_CHUNKED
    with pytest.raises(AmbiguousFraming) as caught:
        await forwarded(upstream, raw_host.url, request(), 5)
    assert caught.value.reason == "unusable_body"
    raw_host.misbehaviour = Misbehaviour.NONE
    assert (await forwarded(upstream, raw_host.url, request(), 5)).envelope["request_id"] == "req-42"
    assert raw_host.connections == 2


async def test_an_answer_for_another_request_is_a_bad_answer_and_its_connection_dropped(
    upstream: Upstream, raw_host: RawHost
) -> None:
    # what no framing check can catch: a stale answer that arrives just after the request
    raw_host.misbehaviour = Misbehaviour.STALE_FIRST
    with pytest.raises(UnusableAnswer) as caught:
        await forwarded(upstream, raw_host.url, request(request_id="mine"), 5)
    assert "another request" in str(caught.value)
    raw_host.misbehaviour = Misbehaviour.NONE
    assert (await forwarded(upstream, raw_host.url, request(request_id="next"), 5)).envelope["request_id"] == "next"
    assert raw_host.connections == 2, "the real answer left behind was not read as the next one's"


async def test_a_busy_or_refusal_envelope_for_another_request_is_a_bad_answer(upstream: Upstream, nursery) -> None:
    async def stale_busy(stream: trio.SocketStream) -> None:
        await stream.receive_some(65536)
        body = json.dumps({**envelope(Code.SYSTEM_ERROR, "someone-else"), "busy": True}).encode()
        await stream.send_all(response(body, status=b"503 Service Unavailable"))

    listeners = await nursery.start(partial(trio.serve_tcp, stale_busy, 0, host="127.0.0.1"))
    with pytest.raises(UnusableAnswer):
        await forwarded(upstream, f"http://127.0.0.1:{listeners[0].socket.getsockname()[1]}", request(), 5)


def nested(depth: int) -> bytes:
    """An envelope `depth` objects deep, an image key at the bottom (built as text: the
    encoder itself stops near 1000 levels)."""
    data = '{"a":' * (depth - 2) + '{"mask_image_base64":null}' + "}" * (depth - 2)
    return b'{"code":0,"message":"ok","request_id":"req-42","data":%s}' % data.encode()


@pytest.mark.parametrize("depth", [500, 5000])
async def test_an_answer_nested_too_deep_is_a_bad_answer_not_a_recursion_error(
    upstream: Upstream, nursery, depth: int
) -> None:
    # ~500 levels with an image key: a RecursionError in the rewrite (a 1007 with a
    # 3,000-line traceback, the host not ejected)
    body = nested(depth)

    async def deep(stream: trio.SocketStream) -> None:
        await stream.receive_some(65536)
        await stream.send_all(response(body))

    listeners = await nursery.start(partial(trio.serve_tcp, deep, 0, host="127.0.0.1"))
    with pytest.raises(UnusableAnswer):
        await forwarded(upstream, f"http://127.0.0.1:{listeners[0].socket.getsockname()[1]}", request(), 5)


def test_nesting_is_measured_without_recursion() -> None:
    limit = failures_module.MAX_ANSWER_DEPTH
    assert failures_module.nested_within(json.loads(nested(limit)), limit)
    assert not failures_module.nested_within(json.loads(nested(limit + 1)), limit)
    deep: list = []
    for _ in range(100_000):  # far past the recursion limit
        deep = [deep]
    assert not failures_module.nested_within(deep, 10)
    assert failures_module.nested_within([[1, {"a": [2]}], "x"], 4) and not failures_module.nested_within(
        [[{"a": []}]], 3
    )


# --- the same hosts behind a real gateway: which answer each client got, ejections, retries


async def gateway_over(tmp_path, urls: list[str], primary: list[str]) -> tuple[Gateway, httpx.AsyncClient]:
    settings = make_settings(tmp_path, pool={"workers": urls, "primary_workers": primary})
    gateway = build_gateway(settings)  # the real Upstream
    bring_online(gateway, *range(len(urls)))
    transport = httpx.ASGITransport(app=create_app(gateway))
    return gateway, httpx.AsyncClient(transport=transport, base_url="http://gateway.test")


def sample(gateway: Gateway, name: str, **labels: str) -> float:
    return gateway.metrics.registry.get_sample_value(name, labels) or 0.0


async def post_as(client: httpx.AsyncClient, request_id: str) -> httpx.Response:
    return await client.post(
        MEASURE, content=PHOTO_BODY, headers={"X-Request-ID": request_id, "Content-Type": "application/json"}
    )


async def test_behind_the_gateway_a_stale_answer_ejects_its_host_and_is_retried_elsewhere(tmp_path, nursery) -> None:
    stale, good = RawHost(Misbehaviour.STALE_FIRST), RawHost()
    urls = [await stale.start(nursery), await good.start(nursery)]
    gateway, client = await gateway_over(tmp_path, urls, primary=urls[:1])  # the stale host first
    try:
        answers = [(await post_as(client, f"client-{n}")).json() for n in range(8)]
    finally:
        await gateway.upstream.aclose()
    assert [a["request_id"] for a in answers] == [f"client-{n}" for n in range(8)]
    assert [a["data"]["answered"] for a in answers] == [f"client-{n}" for n in range(8)], "each its own answer"
    assert (stale.requests, good.requests) == (["client-0"], [f"client-{n}" for n in range(8)])
    assert sample(gateway, "hairgate_worker_ejections_total", worker="0", reason="unusable_body") == 1
    assert sample(gateway, "hairgate_retries_total", reason="unusable_body") == 1
    assert not gateway.dispatcher.pool.workers[0].online


async def test_behind_the_gateway_an_answer_nested_500_deep_ejects_its_host(tmp_path, nursery) -> None:
    # it was a RecursionError in the rewrite: a 1007 with a 3,000-line traceback, the host kept
    deep, good = RawHost(Misbehaviour.NESTED_DEEP), RawHost()
    urls = [await deep.start(nursery), await good.start(nursery)]
    gateway, client = await gateway_over(tmp_path, urls, primary=urls[:1])
    try:
        answer = (await post_as(client, "client-0")).json()
    finally:
        await gateway.upstream.aclose()
    assert (answer["code"], answer["data"]) == (Code.OK, {"answered": "client-0"})
    assert (deep.requests, good.requests) == (["client-0"], ["client-0"])
    assert sample(gateway, "hairgate_worker_ejections_total", worker="0", reason="unusable_body") == 1
    assert sample(gateway, "hairgate_retries_total", reason="unusable_body") == 1


async def test_behind_the_gateway_unsolicited_answers_reach_nobody(tmp_path, nursery) -> None:
    host = RawHost(Misbehaviour.SECOND_RESPONSE_SAME_WRITE)
    gateway, client = await gateway_over(tmp_path, [await host.start(nursery)], primary=[])
    try:
        answers = [(await post_as(client, f"client-{n}")).json() for n in range(8)]
    finally:
        await gateway.upstream.aclose()
    assert [a["data"]["answered"] for a in answers] == [f"client-{n}" for n in range(8)]
    assert (host.stale_sent, host.connections) == (8, 8)
    assert sample(gateway, "hairgate_worker_ejections_total", worker="0", reason="unusable_body") == 0
    assert gateway.dispatcher.pool.workers[0].online


async def test_behind_the_gateway_an_unsendable_head_is_a_1007_and_ejects_nobody(tmp_path, nursery) -> None:
    # a worker URL whose path h11 will not put in a request line: the gateway's settings,
    # not the host (it was a connect failure that ejected the healthy worker)
    host = RawHost()
    gateway, client = await gateway_over(tmp_path, [await host.start(nursery) + "/a b"], primary=[])
    try:
        response = await post_as(client, "client-0")
    finally:
        await gateway.upstream.aclose()
    assert response.json()["code"] == Code.SYSTEM_ERROR and "a b" not in response.text
    assert host.requests == [] and gateway.dispatcher.pool.workers[0].online
    assert sample(gateway, "hairgate_worker_ejections_total", worker="0", reason="connect") == 0
