"""`shared.http_server`: what it overrides in Hypercorn still exists where it is looked up, and a
connection whose handling raises ends alone, logged once per kind (a real server on loopback)."""

from __future__ import annotations

import contextlib
import inspect
import itertools
import logging
import subprocess
import sys
import tomllib
from collections import defaultdict
from collections.abc import Awaitable, Callable
from functools import partial
from importlib.metadata import version

import hypercorn.protocol
import hypercorn.trio
import hypercorn.trio.run
import hypercorn.trio.task_group
import pytest
import trio
import trio.testing
from hypercorn.config import Config
from hypercorn.protocol import ProtocolWrapper
from hypercorn.protocol.h11 import H11Protocol
from hypercorn.protocol.http_stream import HTTPStream
from hypercorn.trio.tcp_server import TCPServer

from cluster.launcher import REPO_ROOT
from shared import http_server
from shared.http_server import ContainedTCPServer, HTTP1Protocol, http1_only
from shared.logs import FailureLog
from tests.shared.http_attacks import (
    PREFACE,
    SETTINGS_FRAME,
    exchange,
    hypercorns_own_classes,
    read_answer,
    read_answers,
)

OK = b"GET /ok HTTP/1.1\r\nHost: t\r\n\r\n"


def test_hypercorn_is_the_pinned_version_whose_names_are_overridden() -> None:
    pins = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert f"hypercorn=={version('hypercorn')}" in pins


def test_the_overridden_names_are_where_hypercorn_looks_them_up() -> None:
    # ProtocolWrapper instantiates `H11Protocol` from its module for each connection,
    # worker_serve hands each accepted one to `TCPServer` from its own, awaiting it runs `run`
    http_server.install()
    assert "H11Protocol" in ProtocolWrapper.__init__.__code__.co_names
    assert issubclass(hypercorn.protocol.H11Protocol, HTTP1Protocol)
    assert "TCPServer" in hypercorn.trio.run.worker_serve.__code__.co_names
    assert hypercorn.trio.run.TCPServer is ContainedTCPServer
    assert "run" in TCPServer.__await__.__code__.co_names
    # ContainedTCPServer.protocol_send replaces the writes Hypercorn hands the protocol
    assert "protocol_send" in TCPServer.run.__code__.co_names
    # and its _close is every close of the stream: a protocol's `Closed`, the connection's end
    assert "_close" in TCPServer.protocol_send.__code__.co_names and "_close" in TCPServer.run.__code__.co_names
    assert {"send_lock", "stream"} <= set(TCPServer.__init__.__code__.co_names)
    # the HTTP/2 switch HTTP1Protocol replaces, called for each request head
    assert "_check_protocol" in H11Protocol._handle_events.__code__.co_names
    # the app's queue HTTP1Protocol wraps (_AppInbox), set when a stream's request arrives
    assert "app_put" in HTTPStream.handle.__code__.co_names
    assert list(inspect.signature(H11Protocol._check_protocol).parameters) == ["self", "event"]
    assert HTTP1Protocol._check_protocol is not H11Protocol._check_protocol


def test_importing_the_services_patches_nothing() -> None:
    # in a fresh process: this one has run install() (the tests' servers, the services' serve())
    check = (
        "import hypercorn.protocol, hypercorn.trio.run\n"
        "from hypercorn.protocol.h11 import H11Protocol\n"
        "from hypercorn.trio.tcp_server import TCPServer\n"
        "import shared.http_server, edge.web.server, edge.main, gpu_host.main\n"
        "assert hypercorn.protocol.H11Protocol is H11Protocol, hypercorn.protocol.H11Protocol\n"
        "assert hypercorn.trio.run.TCPServer is TCPServer, hypercorn.trio.run.TCPServer\n"
    )
    run = subprocess.run([sys.executable, "-c", check], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]


def test_install_is_idempotent_and_keeps_the_more_derived_protocol(monkeypatch: pytest.MonkeyPatch) -> None:
    hypercorns_own_classes(monkeypatch)

    class Derived(HTTP1Protocol):
        pass

    class Unrelated(HTTP1Protocol):
        pass

    http_server.install()
    http_server.install()
    assert hypercorn.protocol.H11Protocol is HTTP1Protocol and hypercorn.trio.run.TCPServer is ContainedTCPServer
    http_server.install(Derived)
    http_server.install()  # a service that serves with the base, in the same process: the subclass stays
    assert hypercorn.protocol.H11Protocol is Derived
    with pytest.raises(RuntimeError, match="Derived is installed already"):
        http_server.install(Unrelated)
    assert hypercorn.protocol.H11Protocol is Derived


async def test_a_server_hypercorn_runs_before_install_speaks_http_2_and_after_it_refuses_it(
    nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch
) -> None:
    # what the services' serve path tests (tests/gpu_host/test_malformed.py,
    # tests/edge/test_serve.py) tell apart: Hypercorn's own answer to the preface, and ours
    hypercorns_own_classes(monkeypatch)
    port, stop = await serving(nursery, app, install=False)
    spoken = await exchange(port, PREFACE + SETTINGS_FRAME)
    http_server.install()
    refused = await exchange(port, PREFACE + SETTINGS_FRAME)  # a new connection takes what is installed
    stop.set()
    assert spoken.status is None  # HTTP/2 frames, which an HTTP/1.1 client cannot read
    assert (refused.status, refused.closed) == (505, True)


def test_tls_offers_http_1_1_alone() -> None:
    assert http1_only(Config()).alpn_protocols == ["http/1.1"]


async def app(scope, receive, send) -> None:
    if scope["type"] == "http" and scope["path"] == "/unread":
        # answers without reading its body, once Hypercorn waits on its full queue (as after
        # quart-trio's answer: it stops receiving then)
        await trio.testing.wait_all_tasks_blocked()
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


async def serving(
    nursery: trio.Nursery, served: Callable[..., Awaitable[None]], *, install: bool = True
) -> tuple[int, trio.Event]:
    """`served` on a loopback port through Hypercorn with `shared.http_server` (installed, as
    each service's serve() does, unless `install` is False): the port, and the event that
    stops it."""
    if install:
        http_server.install()
    config = http1_only(Config())
    config.bind = ["127.0.0.1:0"]
    config.accesslog = None
    config.errorlog = logging.getLogger("hypercorn.error")  # an app's exception is an ERROR there
    stop = trio.Event()
    url = (await nursery.start(partial(hypercorn.trio.serve, served, config, shutdown_trigger=stop.wait)))[0]
    return int(url.rsplit(":", 1)[1]), stop


async def test_a_connection_that_raises_ends_alone_and_each_kind_is_logged_once(
    nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Hypercorn bugs (issue 23: binascii.Error, UnboundLocalError) left its connection task
    # and ended serve(): the process exited; stood in for here by two faults of our own
    failing = {b"/zero": ZeroDivisionError, b"/key": KeyError}
    original = HTTP1Protocol._check_protocol
    raised = itertools.count()

    async def faulty(self, event) -> None:
        if event.target in failing:
            raise failing[event.target](f"injected {next(raised)}")  # a kind is its type and line, not its words
        await original(self, event)

    monkeypatch.setattr(HTTP1Protocol, "_check_protocol", faulty)
    monkeypatch.setattr(
        ContainedTCPServer, "failures", defaultdict(lambda: FailureLog(logging.getLogger("t"), "contained"))
    )
    port, stop = await serving(nursery, app)
    answers = []
    for target in ("/zero", "/zero", "/key", "/zero"):
        answers.append(await exchange(port, f"GET {target} HTTP/1.1\r\nHost: t\r\n\r\n".encode()))
        answers.append(await exchange(port, OK))
    stop.set()
    assert [(a.status, a.closed) for a in answers[::2]] == [(None, True)] * 4  # each dropped alone
    assert [a.status for a in answers[1::2]] == [200] * 4  # and the server went on
    logged = [r.getMessage() for r in caplog.records if r.name == "t"]
    assert len(logged) == 2, logged  # once per kind: the repeats within the minute are counted
    assert "ZeroDivisionError at " in logged[0] and "'injected 0'" in logged[0] and "KeyError at " in logged[1]
    assert all("shared/http_server.py" not in line and "test_http_server.py" in line for line in logged)


async def test_a_body_the_app_left_unread_in_a_full_queue_is_dropped_and_the_next_request_served(
    nursery: trio.Nursery,
) -> None:
    # a body of many small chunks filled the app's queue (10 messages): Hypercorn's reading
    # waited on it, and the app's own end (its disconnect message) too, for good
    port, stop = await serving(nursery, app)
    head = b"POST /unread HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(head + b"1\r\na\r\n" * 100 + b"0\r\n\r\n" + OK)
        answers = await read_answers(stream, 2)
    stop.set()
    assert [(a.status, a.body) for a in answers] == [(200, b"ok"), (200, b"ok")]


REFUSAL_PIECES = 200  # the refusal's body in this many writes: its task writes while the client leaves


async def refusing_app(scope, receive, send) -> None:
    """Refuses every request before reading its body, as a host refuses one without its token."""
    if scope["type"] == "lifespan":
        await app(scope, receive, send)
        return
    length = str(REFUSAL_PIECES * 100).encode()
    await send({"type": "http.response.start", "status": 401, "headers": [(b"content-length", length)]})
    for _ in range(REFUSAL_PIECES):
        await send({"type": "http.response.body", "body": b"x" * 100, "more_body": True})
    await send({"type": "http.response.body", "body": b""})


async def trickle_then_leave(port: int) -> None:
    """An unauthenticated chunked POST: one chunk of its body, then the client leaves (EOF
    mid-body) once its refusal is being written, and reads what is left of that."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(b"POST /v1/measure HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n1\r\na\r\n")
        await stream.receive_some(1)  # the refusal has begun
        await stream.send_eof()
        with contextlib.suppress(trio.BrokenResourceError):
            while await stream.receive_some(65536):
                pass


async def test_a_client_leaving_mid_body_while_its_refusal_is_written_logs_no_error(
    nursery: trio.Nursery, caplog: pytest.LogCaptureFixture
) -> None:
    # issue 39: the reader saw the body cut short and closed the stream (send_eof) while the
    # app's task wrote the refusal; a write that began during the EOF's checkpoint raised
    # trio.BusyResourceError ("Error in ASGI Framework", an ERROR; 7 of these 20 before)
    port, stop = await serving(nursery, refusing_app)
    for _ in range(20):
        await trickle_then_leave(port)
    assert (await exchange(port, OK)).status == 401  # and the server serves on
    stop.set()
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


class Counted:
    """An app that answers every request at once and counts its answers; `flowing` is set at
    the `flowing_at`-th."""

    def __init__(self, flowing_at: int) -> None:
        self.answered = 0
        self.flowing_at = flowing_at
        self.flowing = trio.Event()

    async def __call__(self, scope, receive, send) -> None:
        await app(scope, receive, send)
        if scope["type"] == "http":
            self.answered += 1
            if self.answered == self.flowing_at:
                self.flowing.set()


PIPELINES, PIPELINED = 100, 40  # connections, and the GETs each sends before reading any answer


async def pipeline(port: int) -> int:
    """`PIPELINED` GETs sent at once on one connection; how many answers came back."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(OK * PIPELINED)
        return len(await read_answers(stream, PIPELINED))


async def test_pipelining_connections_do_not_starve_another_clients_request(nursery: trio.Nursery) -> None:
    # issue 39: 300 connections pipelining 2,000 GETs each kept a request of each runnable, and
    # a /health for anyone else waited behind all of them (~6 s). Counted in answers, not
    # seconds: how many pipelined requests were answered while one fresh request was served
    # (about 140 here before; at most a few rounds of PIPELINED_AT_ONCE now)
    counted = Counted(flowing_at=PIPELINES * 5)  # every pipeline flowing
    port, stop = await serving(nursery, counted)
    answered: list[int] = []

    async def pipeline_counted() -> None:
        answered.append(await pipeline(port))

    meanwhile = []
    async with trio.open_nursery() as clients:
        for _ in range(PIPELINES):
            clients.start_soon(pipeline_counted)
        await counted.flowing.wait()
        for _ in range(3):
            before = counted.answered
            assert (await exchange(port, OK)).status == 200
            meanwhile.append(counted.answered - before - 1)
    stop.set()
    assert answered == [PIPELINED] * PIPELINES  # each pipelined request still answered, in time
    assert sorted(meanwhile)[1] <= 4 * http_server.PIPELINED_AT_ONCE, meanwhile


KEEP_ALIVE_SECONDS = 0.3


async def slow_app(scope, receive, send) -> None:
    """`/slow` answers after twice the keep-alive timeout; anything else at once, as `app`."""
    if scope["type"] == "http" and scope["path"] == "/slow":
        await trio.sleep(2 * KEEP_ALIVE_SECONDS)
    await app(scope, receive, send)


async def test_a_connection_is_closed_once_idle_for_the_keep_alive_timeout_never_while_busy(
    nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch
) -> None:
    # KeepAliveTimer keeps Hypercorn's timer (TCPServer._idle_timeout) with one task per
    # connection: a request running past the deadline is answered and its connection kept;
    # idle past it, the connection is closed
    monkeypatch.setattr(Config, "keep_alive_timeout", KEEP_ALIVE_SECONDS)
    port, stop = await serving(nursery, slow_app)
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(OK)
        await trio.sleep(KEEP_ALIVE_SECONDS / 2)  # idle time, not enough to close
        await stream.send_all(OK.replace(b"/ok", b"/slow") + OK)
        answers = await read_answers(stream, 3)
        started_idle = trio.current_time()
        with trio.fail_after(5):
            left = await stream.receive_some(1024)
        idle_for = trio.current_time() - started_idle
    stop.set()
    assert [(a.status, a.body) for a in answers] == [(200, b"ok")] * 3
    assert left == b""  # closed by the server
    assert KEEP_ALIVE_SECONDS * 0.8 <= idle_for <= KEEP_ALIVE_SECONDS + 1


async def test_a_stopping_server_closes_an_idle_connection_at_once(nursery: trio.Nursery) -> None:
    port, stop = await serving(nursery, app)  # the keep-alive timeout: Hypercorn's 5 s
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(OK)
        assert (await read_answer(stream)).status == 200
        stop.set()
        with trio.fail_after(2):
            assert await stream.receive_some(1024) == b""


async def test_an_answer_is_one_write(nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch) -> None:
    # its head, body and end in one write: one loopback delivery, one wake-up of its client
    writes: list[bytes] = []
    original = ContainedTCPServer._write_bounded

    async def counted(self: ContainedTCPServer, data: bytes) -> bool:
        writes.append(data)
        return await original(self, data)

    monkeypatch.setattr(ContainedTCPServer, "_write_bounded", counted)
    port, stop = await serving(nursery, app)
    answer = await exchange(port, OK)
    stop.set()
    assert (answer.status, answer.body) == (200, b"ok")
    assert len(writes) == 1 and writes[0].startswith(b"HTTP/1.1 200 ") and writes[0].endswith(b"\r\n\r\nok")


class _Rounds(trio.abc.Instrument):
    """Scheduler rounds (each a look at the sockets) since `count` was last zeroed."""

    count = 0

    def before_io_wait(self, timeout: float) -> None:
        self.count += 1


async def test_an_answer_is_written_in_the_step_the_app_sends_it(
    nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch
) -> None:
    # with no other write under way the write lock is taken without a checkpoint: the answer
    # does not wait a scheduler round for nobody (one round on every answer's way out)
    rounds = _Rounds()
    before_write: list[int] = []
    original = ContainedTCPServer._write_bounded

    async def recorded(self: ContainedTCPServer, data: bytes) -> bool:
        before_write.append(rounds.count)
        return await original(self, data)

    async def answering(scope, receive, send) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        rounds.count = 0
        await send({"type": "http.response.body", "body": b"ok"})

    monkeypatch.setattr(ContainedTCPServer, "_write_bounded", recorded)
    port, stop = await serving(nursery, answering)
    trio.lowlevel.add_instrument(rounds)
    try:
        answer = await exchange(port, OK)
    finally:
        trio.lowlevel.remove_instrument(rounds)
        stop.set()
    assert (answer.status, answer.body) == (200, b"ok")
    assert before_write == [0]


async def test_a_message_the_apps_queue_has_room_for_is_handed_over_without_a_checkpoint() -> None:
    # the request's body goes to the app in the step that read it: no cancel scope, no
    # scheduler round (a full queue is still waited on: the unread-body test above)
    send, receive = trio.open_memory_channel[dict](2)
    inbox = http_server._AppInbox(send.send)
    with trio.CancelScope() as scope:
        scope.cancel()  # a checkpoint would raise here
        await inbox.put({"type": "http.request", "body": b"x", "more_body": True})
        await inbox.flush()
        await inbox.put({"type": "http.disconnect"})
    assert not scope.cancelled_caught
    assert [receive.receive_nowait() for _ in range(2)] == [
        {"type": "http.request", "body": b"x", "more_body": True},
        {"type": "http.disconnect"},
    ]


async def test_the_body_chunks_of_one_read_reach_the_app_as_one_message(nursery: trio.Nursery) -> None:
    # a small request's body and its end, read together, are one message (one wake-up of the
    # app's receiving task); a body whose end comes in a later read is handed over as it comes
    received: list[list[tuple[bytes, bool]]] = []
    more_sent = trio.Event()

    async def recording(scope, receive, send) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        messages: list[tuple[bytes, bool]] = []
        while not messages or messages[-1][1]:
            message = await receive()
            messages.append((message["body"], message["more_body"]))
            if scope["path"] == "/split" and len(messages) == 1:
                await more_sent.wait()
        received.append(messages)
        await app(scope, receive, send)

    port, stop = await serving(nursery, recording)
    head = b"POST /%s HTTP/1.1\r\nHost: t\r\nContent-Length: 6\r\n\r\n"
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(head % b"whole" + b"abcdef")
        assert (await read_answer(stream)).status == 200
        await stream.send_all(head % b"split" + b"abc")
        await trio.testing.wait_all_tasks_blocked()
        await stream.send_all(b"def")
        more_sent.set()
        assert (await read_answer(stream)).status == 200
    stop.set()
    assert received == [[(b"abcdef", False)], [(b"abc", True), (b"def", False)]]


async def test_hypercorns_app_queue_is_a_memory_channel_so_the_inbox_takes_its_fast_path() -> None:
    # _AppInbox hands a message over with `send_nowait` when `app_put` is a memory channel's
    # `send` (what Hypercorn's trio TaskGroup.spawn_app returns); anything else is awaited
    async def nothing(*args: object) -> None:
        return None

    async with hypercorn.trio.task_group.TaskGroup() as task_group:
        put = await task_group.spawn_app(nothing, Config(), {"type": "http"}, nothing)
        assert isinstance(getattr(put, "__self__", None), trio.MemorySendChannel)
        assert http_server._AppInbox(put)._put_nowait is not None


async def test_an_app_that_receives_after_its_answer_is_told_the_request_ended(nursery: trio.Nursery) -> None:
    # as ASGI says (http.disconnect once the answer is sent): quart-trio's receiving task then
    # ends on it instead of being cancelled, an exception through its nursery on every request
    told: list[dict] = []
    heard = trio.Event()

    async def listening(scope, receive, send) -> None:
        await app(scope, receive, send)
        if scope["type"] == "http":
            with trio.fail_after(5):
                while (message := await receive())["type"] == "http.request":
                    pass  # its (empty) body, unread before the answer
                told.append(message)
                heard.set()

    port, stop = await serving(nursery, listening)
    answer = await exchange(port, OK)
    with trio.fail_after(5):
        await heard.wait()
    stop.set()
    assert answer.status == 200
    assert told == [{"type": "http.disconnect"}]
