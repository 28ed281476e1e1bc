"""The router's own policy, driven with scripted ASGI messages: what the client sends, and when.

httpx's ASGI transport cannot leave mid-request nor trickle a body, so these tests play
the server's part themselves: each `Exchange` feeds the router the messages a client's
connection would produce and records what the router sends back.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio
import trio.testing

from edge.gateway import Gateway, build_gateway
from edge.app import create_app
from shared.contract import MSG_BODY_TOO_SLOW, MSG_HEADERS_TOO_LARGE, Code
from tests.edge.conftest import PHOTO_BODY, WORKERS, bring_online, make_settings
from tests.edge.test_api import FakeUpstream

MEASURE = "/api/v1/hair/measure"


class Exchange:
    """One request: the test pushes client messages in; the router's messages are recorded."""

    def __init__(self, path: str = MEASURE, headers: list[tuple[bytes, bytes]] | None = None) -> None:
        self.scope = {
            "type": "http", "method": "POST", "path": path, "raw_path": path.encode(), "query_string": b"",
            "headers": headers or [(b"content-type", b"application/json")], "client": ("203.0.113.9", 4000),
        }
        self._push, self._pull = trio.open_memory_channel[dict](16)
        self.sent: list[dict] = []
        self.done = trio.Event()

    def client_sends(self, body: bytes, more: bool = False) -> None:
        self._push.send_nowait({"type": "http.request", "body": body, "more_body": more})

    def client_leaves(self) -> None:
        self._push.send_nowait({"type": "http.disconnect"})

    async def run(self, app) -> None:
        await app(self.scope, self._pull.receive, self._record)
        self.done.set()

    async def _record(self, message: dict) -> None:
        self.sent.append(message)

    @property
    def status(self) -> int | None:
        return next((m["status"] for m in self.sent if m["type"] == "http.response.start"), None)

    @property
    def headers(self) -> dict[bytes, bytes]:
        start = next(m for m in self.sent if m["type"] == "http.response.start")
        return dict(start["headers"])

    def json(self) -> dict:
        return json.loads(b"".join(m.get("body", b"") for m in self.sent if m["type"] == "http.response.body"))


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


async def logged(gateway: Gateway) -> list[dict]:
    await gateway.request_log.flush()
    return [json.loads(line) for line in gateway.request_log.path.read_text().splitlines()]


async def test_a_client_that_leaves_while_queued_frees_its_place_and_its_job_never_runs(
    autojump_clock, gateway: Gateway, upstream: FakeUpstream
) -> None:
    app = create_app(gateway)
    upstream.delay[WORKERS[0]] = 10.0
    busy, leaver = Exchange(), Exchange()
    async with trio.open_nursery() as nursery:
        busy.client_sends(PHOTO_BODY)
        nursery.start_soon(busy.run, app)  # holds the only worker for 10 s
        await trio.testing.wait_all_tasks_blocked()
        leaver.client_sends(PHOTO_BODY)
        nursery.start_soon(leaver.run, app)
        await trio.testing.wait_all_tasks_blocked()
        assert gateway.dispatcher.statistics().waiting_for_worker == 1
        leaver.client_leaves()
        await leaver.done.wait()
        assert trio.current_time() < 10, "the queued request ended when its client left"
        stats = gateway.dispatcher.statistics()
        assert (stats.waiting_for_worker, stats.slots_in_use) == (0, 1), "place and slot given back"
    assert len(upstream.forwards) == 1, "the departed client's job was forwarded for nobody"
    assert leaver.status is None, "nothing is sent to a client that left"
    statuses = sorted(entry["http_status"] for entry in await logged(gateway))
    assert statuses == [200, 499]


async def test_a_client_that_leaves_during_its_forward_lets_it_finish(
    autojump_clock, gateway: Gateway, upstream: FakeUpstream
) -> None:
    # the worker's state must stay true: it is busy until its answer arrives
    app = create_app(gateway)
    upstream.delay[WORKERS[0]] = 10.0
    exchange = Exchange()
    async with trio.open_nursery() as nursery:
        exchange.client_sends(PHOTO_BODY)
        nursery.start_soon(exchange.run, app)
        await trio.testing.wait_all_tasks_blocked()
        exchange.client_leaves()
        await trio.testing.wait_all_tasks_blocked()
        assert gateway.pool.workers[0].leased, "the forward goes on"
    assert trio.current_time() >= 10
    assert not gateway.pool.workers[0].leased and gateway.pool.workers[0].online
    assert len(upstream.forwards) == 1


async def test_a_body_that_stalls_is_refused_after_the_idle_timeout(autojump_clock, gateway: Gateway, upstream) -> None:
    exchange = Exchange()
    exchange.client_sends(b'{"partial":', more=True)  # … and then nothing
    await exchange.run(create_app(gateway))
    assert trio.current_time() == pytest.approx(5)
    assert exchange.json()["code"] == Code.INVALID_PARAMETER
    assert exchange.json()["message"] == MSG_BODY_TOO_SLOW.format(seconds=5)
    assert exchange.headers[b"connection"] == b"close"
    assert upstream.forwards == []


async def test_a_body_that_trickles_is_refused_after_the_whole_timeout(autojump_clock, gateway: Gateway, upstream) -> None:
    exchange = Exchange()

    async def trickle() -> None:
        while not exchange.done.is_set():
            exchange.client_sends(b" ", more=True)  # one byte every 4 s: never idle 5 s
            await trio.sleep(4)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(trickle)
        await exchange.run(create_app(gateway))
    assert 30 <= trio.current_time() < 35
    assert exchange.json()["code"] == Code.INVALID_PARAMETER
    assert upstream.forwards == []


async def test_an_oversized_header_block_is_refused_before_any_worker(gateway: Gateway, upstream) -> None:
    # the gateway adds headers: a client head that fits the gateway but not a host's read
    # limit got a 431 from every host in turn and ejected them all
    exchange = Exchange(headers=[(b"x-forwarded-for", b"198.51.100.1, " * 400)])
    exchange.client_sends(PHOTO_BODY)
    await exchange.run(create_app(gateway))
    assert exchange.json()["code"] == Code.INVALID_PARAMETER
    assert exchange.json()["message"] == MSG_HEADERS_TOO_LARGE.format(limit_bytes=4096)
    assert upstream.forwards == [] and gateway.pool.workers[0].online


async def test_an_oversized_query_string_counts_too(gateway: Gateway, upstream) -> None:
    exchange = Exchange()
    exchange.scope["query_string"] = b"q=" + b"x" * 5000
    exchange.client_sends(PHOTO_BODY)
    await exchange.run(create_app(gateway))
    assert exchange.json()["code"] == Code.INVALID_PARAMETER and upstream.forwards == []
