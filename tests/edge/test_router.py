"""The app's request policy, driven with Quart's test connections: what the client sends, and when.

A test connection (`app.test_client().request(...)`) lets the test trickle a body, stop
sending, or leave mid-request — what httpx's ASGI transport cannot do.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio
import trio.testing
from quart_trio import QuartTrio
from werkzeug.datastructures import Headers

from edge.app import create_app
from edge.gateway import Gateway, build_gateway
from edge.web.http import GatewayBody
from shared.contract import (
    MSG_BODY_TOO_SLOW,
    MSG_HEADERS_TOO_LARGE,
    MSG_METHOD_NOT_ALLOWED,
    MSG_UNKNOWN_ENDPOINT,
    Code,
)
from tests.edge.conftest import PHOTO_BODY, WORKERS, bring_online, make_settings
from tests.edge.test_api import FakeUpstream

MEASURE = "/api/v1/hair/measure"
CLIENT = {"client": ("203.0.113.9", 4000)}


@pytest.fixture
def upstream() -> FakeUpstream:
    return FakeUpstream()


@pytest.fixture
async def gateway(tmp_path: Path, upstream: FakeUpstream) -> Gateway:
    settings = make_settings(
        tmp_path,
        max_header_bytes=4096,
        body_idle_timeout_seconds=5,
        body_timeout_seconds=30,
        pool={"workers": WORKERS[:1], "primary_workers": []},
        dispatch={"queue_wait_seconds": 60, "max_queue_wait_seconds": 60, "request_timeout_seconds": 100},
    )
    gateway = build_gateway(settings, upstream=upstream)
    bring_online(gateway, 0)
    return gateway


@pytest.fixture
def app(gateway: Gateway) -> QuartTrio:
    return create_app(gateway)


def connect(app: QuartTrio, path: str = MEASURE, headers: dict[str, str] | None = None, query: str = ""):
    given = {"Content-Type": "application/json", **(headers or {})}
    target = f"{path}?{query}" if query else path
    return app.test_client().request(target, method="POST", headers=given, scope_base=CLIENT)


async def post(app: QuartTrio, body: bytes, **kwargs) -> tuple[int, Headers, dict]:
    async with connect(app, **kwargs) as connection:
        await connection.send(body)
        await connection.send_complete()
        response = await connection.as_response()
    return response.status_code, response.headers, json.loads(await response.get_data())


async def logged(gateway: Gateway) -> list[dict]:
    await gateway.request_log.flush()
    return [json.loads(line) for line in gateway.request_log.path.read_text().splitlines()]


async def test_a_client_that_leaves_while_queued_frees_its_place_and_its_job_never_runs(
    autojump_clock, app: QuartTrio, gateway: Gateway, upstream: FakeUpstream
) -> None:
    upstream.delay[WORKERS[0]] = 10.0
    # Quart's test connection waits for an answer when it closes: this client is played by
    # hand, as the server would (its messages in, what the app sends recorded).
    messages, receive = trio.open_memory_channel[dict](4)
    sent: list[dict] = []

    async def record(message: dict) -> None:
        sent.append(message)

    scope = {
        "type": "http", "http_version": "1.1", "scheme": "http", "method": "POST", "path": MEASURE,
        "raw_path": MEASURE.encode(), "query_string": b"", "root_path": "",
        "headers": [(b"content-type", b"application/json")], **CLIENT,
    }  # fmt: skip
    async with trio.open_nursery() as nursery:
        nursery.start_soon(post, app, PHOTO_BODY)  # holds the only worker for 10 s
        await trio.testing.wait_all_tasks_blocked()
        left = trio.Event()

        async def leaver() -> None:
            await app(scope, receive.receive, record)
            left.set()

        nursery.start_soon(leaver)
        messages.send_nowait({"type": "http.request", "body": PHOTO_BODY, "more_body": False})
        await trio.testing.wait_all_tasks_blocked()
        assert gateway.dispatcher.statistics().waiting_for_worker == 1
        messages.send_nowait({"type": "http.disconnect"})
        await left.wait()
        assert trio.current_time() < 10, "the queued request ended when its client left"
        stats = gateway.dispatcher.statistics()
        assert (stats.waiting_for_worker, stats.slots_in_use) == (0, 1), "place and slot given back"
    assert sent == [], "nothing is sent to a client that left"
    assert len(upstream.forwards) == 1, "the departed client's job was forwarded for nobody"
    statuses = sorted(entry["http_status"] for entry in await logged(gateway))
    assert statuses == [200, 499]


async def test_a_body_that_stalls_is_refused_after_the_idle_timeout(autojump_clock, app: QuartTrio, upstream) -> None:
    async with connect(app) as connection:
        await connection.send(b'{"partial":')  # … and then nothing
        response = await connection.as_response()
    assert trio.current_time() == pytest.approx(5)
    body = json.loads(await response.get_data())
    assert (body["code"], body["message"]) == (Code.INVALID_PARAMETER, MSG_BODY_TOO_SLOW.format(seconds=5))
    assert response.headers["Connection"] == "close"
    assert upstream.forwards == []


async def test_a_body_that_trickles_is_refused_after_the_whole_timeout(
    autojump_clock, app: QuartTrio, upstream
) -> None:
    async with connect(app) as connection:

        async def trickle() -> None:
            while True:
                await connection.send(b" ")  # one byte every 4 s: never idle 5 s
                await trio.sleep(4)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(trickle)
            response = await connection.as_response()
            nursery.cancel_scope.cancel()
    assert 30 <= trio.current_time() < 35
    body = json.loads(await response.get_data())
    # the message named the idle bound (5 s) when the whole-body bound (30 s) had fired
    assert (body["code"], body["message"]) == (Code.INVALID_PARAMETER, MSG_BODY_TOO_SLOW.format(seconds=30))
    assert upstream.forwards == []


async def test_an_oversized_header_block_is_refused_before_any_worker(
    app: QuartTrio, gateway: Gateway, upstream
) -> None:
    # the gateway adds headers: a client head that fits the gateway but not a host's read
    # limit got a 431 from every host in turn and ejected them all
    status, headers, body = await post(app, PHOTO_BODY, headers={"X-Forwarded-For": "198.51.100.1, " * 400})
    assert (status, body["code"]) == (200, Code.INVALID_PARAMETER)
    assert body["message"] == MSG_HEADERS_TOO_LARGE.format(limit_bytes=4096)
    assert headers["Connection"] == "close"
    assert upstream.forwards == [] and gateway.pool.workers[0].online


async def test_an_oversized_query_string_counts_too(app: QuartTrio, upstream) -> None:
    _status, _, body = await post(app, PHOTO_BODY, query="q=" + "x" * 5000)
    assert body["code"] == Code.INVALID_PARAMETER and upstream.forwards == []


async def test_a_head_too_large_elsewhere_is_431(app: QuartTrio) -> None:
    response = await app.test_client().get("/monitor", headers={"X-Padding": "x" * 5000})
    assert response.status_code == 431 and response.headers["Connection"] == "close"


async def test_a_post_to_an_unknown_endpoint_says_it_does_not_exist(app: QuartTrio, upstream) -> None:
    _, _, body = await post(app, PHOTO_BODY, path="/api/v1/hair/nothing")
    assert body["message"] == MSG_UNKNOWN_ENDPOINT.format(method="POST", path="/api/v1/hair/nothing")
    assert "POST）" not in body["message"], "a POST is not told that endpoints take POST"


@pytest.mark.parametrize("method", ["GET", "PUT", "OPTIONS", "HEAD"])
async def test_a_wrong_method_on_a_real_endpoint_says_which_it_takes(app: QuartTrio, upstream, method: str) -> None:
    response = await app.test_client().open(MEASURE, method=method)
    assert response.status_code == 200 and response.headers["Allow"] == "POST"
    if method != "HEAD":
        body = json.loads(await response.get_data())
        assert body["code"] == Code.INVALID_PARAMETER
        assert body["message"] == MSG_METHOD_NOT_ALLOWED.format(path=MEASURE, method=method, allowed="POST")
    assert upstream.forwards == []


async def test_a_raising_handler_is_a_1007_envelope_logged_as_answered(
    app: QuartTrio, gateway: Gateway, upstream, caplog
) -> None:
    async def broken(*args, **kwargs):
        raise RuntimeError("a bug")

    gateway.special_points.answer = broken  # type: ignore[method-assign]
    status, headers, body = await post(
        app, PHOTO_BODY, path="/api/v1/face/special-points", headers={"X-Request-ID": "bug-1"}
    )
    assert (status, body["code"], body["request_id"]) == (200, Code.SYSTEM_ERROR, "bug-1")
    assert "Retry-After" in headers
    assert any("bug-1" in r.getMessage() and r.exc_info for r in caplog.records), "the traceback is logged"
    (entry,) = await logged(gateway)
    assert (entry["http_status"], entry["code"]) == (200, 1007)


async def test_expect_100_continue_over_the_limit_is_refused_without_a_continue(
    app: QuartTrio, gateway: Gateway, upstream
) -> None:
    headers = {"Expect": "100-continue", "Content-Length": str(gateway.settings.edge.max_body_bytes + 1)}
    async with connect(app, headers=headers) as connection:
        response = await connection.as_response()  # the body is never sent
    assert json.loads(await response.get_data())["code"] == Code.TOO_LARGE
    assert response.headers["Connection"] == "close"


class _Wakeups(trio.abc.Instrument):
    """How many times a task ran (each a wake-up, its first step included)."""

    def __init__(self, task: trio.lowlevel.Task) -> None:
        self.task, self.count = task, 0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self.count += task is self.task


async def test_a_body_read_wakes_its_reader_once_however_many_chunks_arrive(autojump_clock) -> None:
    # a chunk only moves the idle bound of the reader's wait: a photo of a hundred chunks is
    # one wake-up of the handler, not a hundred (and the bounds still hold: the tests above)
    body = GatewayBody(None, None)
    read: list[bytes] = []

    async def reader(task_status: trio.TaskStatus[trio.lowlevel.Task]) -> None:
        task_status.started(trio.lowlevel.current_task())
        read.append(await body.read(60, 5))

    async with trio.open_nursery() as nursery:
        wakeups = _Wakeups(await nursery.start(reader))
        trio.lowlevel.add_instrument(wakeups)
        for _ in range(10):
            await trio.sleep(4)  # never idle for 5 s, 40 s in all (the whole body may take 60 s)
            body.append(b"x")
        body.set_complete()
    trio.lowlevel.remove_instrument(wakeups)
    assert wakeups.count == 1
    assert read == [b"x" * 10]
