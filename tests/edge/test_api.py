"""`/api/` end to end inside one process: the ASGI front, dispatch, retries, rewrite, log.

The workers are a fake `Upstream` (the seam the gateway's real client (`edge.pool.upstream`) plugs into):
per-URL behaviours, a record of every forward, and an overlap counter.
"""

from __future__ import annotations

import base64
import io
import json
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from functools import partial
from pathlib import Path

import httpx
import pytest
import trio
import trio.testing
from PIL import Image

from edge.admission.idempotency import open_idempotency
from edge.app import create_app
from edge.gateway import Gateway, build_gateway
from edge.pool.dispatch import IMPATIENT_FRACTION, LEASE_RECHECK_SECONDS
from edge.pool.errors import ConnectionClosed, UpstreamTimeout
from edge.pool.host_leases import HostLeased
from edge.pool.pool import ProbeResult
from edge.pool.upstream import ForwardRequest, RawAnswer
from shared.contract import MSG_BACKEND_BUSY, MSG_BACKEND_UNAVAILABLE, Code, envelope
from tests.edge.conftest import PHOTO, PHOTO_BODY, REQUEST_LOG_FIELDS, WORKERS, bring_online, make_settings
from tests.fakes.fake_worker import PNG_BASE64

MEASURE, GROW = "/api/v1/hair/measure", "/api/v1/hair/grow"


def png_base64() -> str:
    buffer = io.BytesIO()
    Image.new("L", (2, 2)).save(buffer, "PNG")
    return base64.b64encode(buffer.getvalue()).decode()


class FakeUpstream:
    """Workers by URL: "ok", "ok_image", "bad_image", "http500", "closed", "refuse431", "hang" or "slow"."""

    def __init__(self) -> None:
        self.behaviour = dict.fromkeys(WORKERS, "ok")
        self.forwards: list[tuple[str, ForwardRequest]] = []
        self.active: set[str] = set()
        self.overlaps = 0
        self.delay = dict.fromkeys(WORKERS, 0.0)  # seconds before any behaviour

    @asynccontextmanager
    async def forward(self, url: str, request: ForwardRequest, timeout: float) -> AsyncIterator[RawAnswer]:
        self.forwards.append((url, request))
        self.overlaps += url in self.active
        self.active.add(url)
        try:
            await trio.sleep(self.delay[url])
            answer = await self._answer(self.behaviour[url], request, timeout)
        finally:
            self.active.discard(url)
        yield answer  # judged by the gateway's policy, as a real answer is

    async def _answer(self, behaviour: str, request: ForwardRequest, timeout: float) -> RawAnswer:
        data: dict = {"echo_path": request.target}
        if behaviour == "slow":
            await trio.sleep(1)
        elif behaviour == "hang":
            await trio.sleep(timeout)
            raise UpstreamTimeout("no answer")
        elif behaviour == "http500":
            return RawAnswer(500, (), b"<html>error</html>")
        elif behaviour == "closed":
            raise ConnectionClosed("connection reset")
        elif behaviour == "refuse431":
            return RawAnswer(431, (), b"")
        elif behaviour == "busy":  # another gateway's job runs there
            return RawAnswer(503, (), b'{"code": 1007, "message": "busy", "busy": true}')
        elif behaviour == "ok_image":
            data["mask_image_base64"] = png_base64()
        elif behaviour == "bad_image":
            data["mask_image_base64"] = "bm90IGEgcG5n"
        return RawAnswer(200, (), json.dumps(envelope(Code.OK, request.request_id, data)).encode())


@pytest.fixture
def upstream() -> FakeUpstream:
    return FakeUpstream()


@pytest.fixture
async def gateway(tmp_path: Path, upstream: FakeUpstream) -> Gateway:
    settings = make_settings(
        tmp_path,
        max_body_bytes=1000,
        pool={"workers": WORKERS[:2], "primary_workers": []},
        dispatch={"queue_wait_seconds": 5, "request_timeout_seconds": 10, "slow_request_timeout_seconds": 30},
    )
    gateway = build_gateway(settings, upstream=upstream)
    bring_online(gateway, 0, 1)
    return gateway


@pytest.fixture
def client(gateway: Gateway) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=create_app(gateway), client=("203.0.113.7", 5555))
    return httpx.AsyncClient(transport=transport, base_url="http://gateway.test")


async def logged(gateway: Gateway) -> list[dict]:
    await gateway.request_log.flush()
    return [json.loads(line) for line in gateway.request_log.path.read_text().splitlines()]


async def test_success_passes_through_with_request_id(client, upstream: FakeUpstream, gateway: Gateway) -> None:
    response = await client.post(
        MEASURE + "?debug=1",
        json={"image_base64": PNG_BASE64},
        headers={"X-Request-ID": "client-id.1", "X-Internal-Token": "client-guess", "X-Forwarded-For": "198.51.100.1"},
    )
    assert response.status_code == 200
    assert response.headers["X-Request-ID"] == "client-id.1"
    assert response.json() == {
        "code": 0,
        "message": "成功",
        "request_id": "client-id.1",
        "data": {"echo_path": MEASURE + "?debug=1"},
    }
    ((_, forwarded),) = upstream.forwards
    assert forwarded.request_id == "client-id.1"
    assert forwarded.forwarded_for == "198.51.100.1, 203.0.113.7"
    assert forwarded.content_type == "application/json"
    assert json.loads(forwarded.body) == {"image_base64": PNG_BASE64}
    (entry,) = await logged(gateway)
    assert {
        k: entry[k] for k in ("request_id", "method", "path", "client_ip", "worker", "attempts", "http_status", "code")
    } == {
        "request_id": "client-id.1",
        "method": "POST",
        "path": MEASURE,
        "client_ip": "203.0.113.7",
        "worker": entry["worker"],
        "attempts": 1,
        "http_status": 200,
        "code": 0,
    }
    assert entry["worker"] in (0, 1) and entry["bytes_out"] == len(response.content)
    assert set(entry) == REQUEST_LOG_FIELDS
    assert PNG_BASE64 not in gateway.request_log.path.read_text()


@pytest.mark.parametrize("given", [None, "", "has space", "x" * 65, "a/b", "id;drop"])
async def test_invalid_request_id_is_replaced(client, given) -> None:
    headers = {"X-Request-ID": given} if given is not None else {}
    response = await client.post(MEASURE, json=PHOTO, headers=headers)
    generated = response.headers["X-Request-ID"]
    assert generated != given and 1 <= len(generated) <= 64
    assert response.json()["request_id"] == generated


@pytest.mark.parametrize("failure", ["http500", "closed", "bad_image"])
async def test_failed_worker_is_ejected_and_request_retried_elsewhere(client, upstream, gateway, failure) -> None:
    upstream.behaviour[WORKERS[0]] = failure
    upstream.behaviour[WORKERS[1]] = "ok"
    gateway.pool.workers[1].idle_since = 1.0  # make worker 0 the first choice
    response = await client.post(MEASURE, json=PHOTO)
    assert response.json()["code"] == 0
    assert [url for url, _ in upstream.forwards] == WORKERS[:2]
    assert [w.online for w in gateway.pool.workers] == [False, True]
    assert not list(Path(gateway.settings.edge.static_dir).rglob("*.png"))
    assert (await logged(gateway))[0]["attempts"] == 2


async def test_retries_exhausted_answer_unavailable(client, upstream, gateway) -> None:
    upstream.behaviour = dict.fromkeys(WORKERS, "http500")
    response = await client.post(MEASURE, json=PHOTO, headers={"X-Request-ID": "doomed"})
    assert response.json() == {"code": 1007, "message": MSG_BACKEND_UNAVAILABLE, "request_id": "doomed", "data": None}
    # nothing online any more, and both ejected: not back before their cooldown (60 s), though
    # the probe interval is 8 s (that was the Retry-After, and retries found nothing for 60 s)
    assert response.headers["Retry-After"] == "60"
    assert len(upstream.forwards) == 2


@pytest.mark.parametrize(("path", "retried"), [(MEASURE, True), (GROW, False)])
async def test_timeout_is_retried_except_on_slow_paths(
    autojump_clock, client, upstream, gateway, path, retried
) -> None:
    upstream.behaviour[WORKERS[0]] = "hang"
    gateway.pool.workers[1].idle_since = 1.0
    response = await client.post(path, json=PHOTO)
    assert response.json()["code"] == (0 if retried else 1007)
    assert len(upstream.forwards) == (2 if retried else 1)
    assert not gateway.pool.workers[0].online, "a timeout ejects the worker either way"


async def test_image_is_rewritten_to_a_url(client, upstream, gateway) -> None:
    upstream.behaviour = dict.fromkeys(WORKERS, "ok_image")
    data = (await client.post(MEASURE, json=PHOTO)).json()["data"]
    assert data["mask_image_url"].startswith("http://gateway.test/static/annotations/")
    served = await client.get(data["mask_image_url"].removeprefix("http://gateway.test"))
    assert served.status_code == 200 and served.content.startswith(b"\x89PNG")


async def test_queue_timeout_answers_busy(autojump_clock, client, upstream, gateway) -> None:
    upstream.behaviour = dict.fromkeys(WORKERS, "hang")
    async with trio.open_nursery() as nursery:
        for _ in range(2):
            nursery.start_soon(partial(client.post, GROW, json=PHOTO))
        await trio.testing.wait_all_tasks_blocked()
        response = await client.post(MEASURE, json=PHOTO)
        assert response.json()["message"] == MSG_BACKEND_BUSY
        assert response.headers["Retry-After"] == "2"
        nursery.cancel_scope.cancel()


async def test_burst_never_overlaps_on_a_worker(autojump_clock, client, upstream) -> None:
    upstream.behaviour = dict.fromkeys(WORKERS, "slow")
    codes = []

    async def one() -> None:
        codes.append((await client.post(MEASURE, json=PHOTO)).json()["code"])

    async with trio.open_nursery() as nursery:
        for _ in range(8):
            nursery.start_soon(one)
    assert codes == [0] * 8 and upstream.overlaps == 0


async def test_a_worker_given_back_to_a_waiting_request_forwards_it_before_the_freeing_answer_returns(
    autojump_clock, tmp_path: Path, upstream: FakeUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the GPU's next job first: the request handed the worker is sent before the answer that
    # freed it is built and written (that answer waits a step), so no host idles meanwhile
    gateway = build_gateway(
        make_settings(tmp_path, pool={"workers": WORKERS[:1], "primary_workers": []}), upstream=upstream
    )
    bring_online(gateway, 0)
    upstream.delay[WORKERS[0]] = 1.0
    order: list[str] = []
    forward = upstream.forward

    def recorded(url: str, request: ForwardRequest, timeout: float) -> AbstractAsyncContextManager[RawAnswer]:
        order.append(f"sent {request.request_id}")
        return forward(url, request, timeout)

    monkeypatch.setattr(upstream, "forward", recorded)

    async def one(request_id: str) -> None:
        answer = await gateway.api.handle(
            ForwardRequest("POST", MEASURE, "", PHOTO_BODY, "application/json", request_id, "203.0.113.7")
        )
        assert answer.log_facts.code == Code.OK
        order.append(f"answered {request_id}")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(one, "first")
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(one, "second")  # waits for the one worker
    assert order == ["sent first", "sent second", "answered first", "answered second"]


async def test_endpoint_4_unconfigured_answers_here_and_is_never_forwarded(client, upstream) -> None:
    response = await client.post("/api/v1/face/features", json=PHOTO)
    assert (response.json()["code"], response.json()["message"]) == (1007, "面部特征分析未配置")
    assert "Retry-After" in response.headers
    assert upstream.forwards == []


@pytest.mark.parametrize("path", ["/api/v1/face/features", "/api/v1/face/special-points"])
async def test_endpoints_answered_here_take_post_only(client, upstream, path) -> None:
    response = await client.get(path)
    assert response.status_code == 200 and response.json()["code"] == 1001
    assert upstream.forwards == []


@pytest.mark.parametrize(("method", "path"), [("POST", "/api/v1/nope"), ("GET", MEASURE), ("PUT", GROW)])
async def test_unknown_endpoint_or_method_is_1001(client, upstream, method, path) -> None:
    response = await client.request(method, path)
    assert response.status_code == 200 and response.json()["code"] == 1001
    assert upstream.forwards == []


async def test_body_over_the_limit_is_1003_without_touching_a_worker(client, upstream, gateway) -> None:
    response = await client.post(MEASURE, content=b"x" * 1001)
    assert response.json()["code"] == 1003 and "1000" in response.json()["message"]
    assert upstream.forwards == []
    at_the_limit = PHOTO_BODY[:-1] + b" " * (1000 - len(PHOTO_BODY)) + b"}"
    headers = {"Content-Type": "application/json"}
    assert (await client.post(MEASURE, content=at_the_limit, headers=headers)).json()["code"] == 0


async def test_chunked_body_over_the_limit_is_1003(client, upstream) -> None:
    async def chunks():
        for _ in range(5):
            yield b"y" * 300

    response = await client.post(MEASURE, content=chunks())
    assert response.json()["code"] == 1003
    assert upstream.forwards == []


async def test_no_online_worker_answers_unavailable_at_once(autojump_clock, client, gateway) -> None:
    for index in (0, 1):
        gateway.dispatcher.eject(index, "test")
    started = trio.current_time()
    response = await client.post(MEASURE, json=PHOTO)
    assert response.json()["message"] == MSG_BACKEND_UNAVAILABLE
    assert trio.current_time() == started


async def test_only_api_requests_are_logged(client, gateway) -> None:
    for path in ("/health", "/gateway-health", "/monitor", "/static/annotations/x.png"):
        await client.get(path)
    await client.post(MEASURE, json=PHOTO)
    assert [entry["path"] for entry in await logged(gateway)] == [MEASURE]


async def test_a_worker_refusing_the_request_is_not_ejected_nor_retried(client, upstream, gateway) -> None:
    # e.g. a host answering 431 to a header block the gateway let through: the client's fault
    upstream.behaviour = dict.fromkeys(WORKERS, "refuse431")
    body = (await client.post(MEASURE, json=PHOTO)).json()
    assert body["code"] == Code.INVALID_PARAMETER and "431" in body["message"]
    assert len(upstream.forwards) == 1
    assert all(worker.online for worker in gateway.pool.workers)


async def test_a_bad_image_ejects_its_worker_before_anyone_else_is_handed_it(
    autojump_clock, client, upstream, gateway
) -> None:
    upstream.behaviour[WORKERS[0]] = "bad_image"
    upstream.delay.update({WORKERS[0]: 1.0, WORKERS[1]: 2.0})
    answers: dict[str, dict] = {}

    async def post(name: str) -> None:
        answers[name] = (await client.post(MEASURE, json=PHOTO)).json()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(post, "first")  # to worker 0, which answers a broken image
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(post, "second")  # to worker 1
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(post, "waiting")  # queued until a worker is free
    sent_to_bad = [url for url, _ in upstream.forwards].count(WORKERS[0])
    assert sent_to_bad == 1, "the broken worker was handed to the waiting request"
    assert {name: answer["code"] for name, answer in answers.items()} == {"first": 0, "second": 0, "waiting": 0}


async def test_a_worker_busy_with_another_gateways_job_is_skipped_not_ejected(
    autojump_clock, client, upstream, gateway
) -> None:
    upstream.behaviour[WORKERS[0]] = "busy"
    response = await client.post(MEASURE, json=PHOTO)
    assert response.json()["code"] == Code.OK
    assert [url for url, _ in upstream.forwards] == [WORKERS[0], WORKERS[1]]
    assert gateway.pool.workers[0].online, "busy elsewhere is not a failure"
    (entry,) = await logged(gateway)
    assert (entry["worker"], entry["attempts"]) == (1, 1), "no retry spent"


async def test_when_every_worker_is_busy_elsewhere_the_request_waits_then_runs(
    autojump_clock, client, upstream, gateway
) -> None:
    upstream.behaviour = dict.fromkeys(WORKERS, "busy")

    async def free_them_later() -> None:
        await trio.sleep(2.5)
        upstream.behaviour = dict.fromkeys(WORKERS, "ok")
        for index in (0, 1):  # what the prober following a busy worker then sees
            gateway.dispatcher.record_probe(index, ProbeResult(trio.current_time(), ok=True, busy=False))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(free_them_later)
        response = await client.post(MEASURE, json=PHOTO)
    assert response.json()["code"] == Code.OK
    assert trio.current_time() == 2.5, "served when a probe said a worker is free"
    # the 1 s hold ended by time alone and sent the whole upload to both busy hosts each second
    assert len(upstream.forwards) == 3, "one busy answer per host, then the forward that ran"
    assert all(worker.online for worker in gateway.pool.workers[:2])


async def test_workers_busy_elsewhere_for_longer_than_the_queue_wait_answer_busy(
    autojump_clock, client, upstream, gateway
) -> None:
    # each re-wait used to start a fresh queue wait: a host running another gateway's 60 s
    # job held the request (and its slot) for the whole job
    upstream.behaviour = dict.fromkeys(WORKERS, "busy")
    started = trio.current_time()
    with trio.fail_after(60):  # virtual time: without the bound this loops until the job ends
        response = await client.post(MEASURE, json=PHOTO)
    assert response.json()["message"] == MSG_BACKEND_BUSY
    assert trio.current_time() - started <= 5 + 2, "queue_wait_seconds (5) plus the holds it overran by"


class HostsLeasedUntilWanted:
    """Another gateway holds every host and keeps it across its own hand-overs: a host is
    given up only to a gateway impatient enough to mark it wanted (as Redis's script does)."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.asked: list[tuple[float, bool]] = []  # (when, impatient) of each lease asked for

    @asynccontextmanager
    async def hold(self, url: str, timeout_seconds: float) -> AsyncIterator[None]:
        impatient = self.gateway.dispatcher.turn(url).impatient
        self.asked.append((trio.current_time(), impatient))
        if not impatient:
            raise HostLeased(30.0)
        yield


async def test_a_request_sent_back_by_other_gateways_leases_grows_impatient_and_gets_a_host(
    autojump_clock, client, upstream, gateway
) -> None:
    # each lease refused sent the request back to the queue as a newcomer: it never grew
    # impatient, never marked a host wanted, and a gateway beside one that keeps every host
    # served nothing (bench_gateways 2x2 with Redis: 0 of 126)
    leases = HostsLeasedUntilWanted(gateway)
    gateway.api._host_leases = leases
    gateway.pool.leases_shared = True
    started = trio.current_time()
    response = await client.post(MEASURE, json=PHOTO)
    assert response.json()["code"] == Code.OK
    impatient_at = IMPATIENT_FRACTION * gateway.dispatcher.queue_wait_seconds
    assert [impatient for _, impatient in leases.asked].count(True) == 1
    assert leases.asked[-1][0] - started <= impatient_at + LEASE_RECHECK_SECONDS
    # the hosts were asked once each per recheck, not in a loop
    assert len(leases.asked) <= 2 * (impatient_at / LEASE_RECHECK_SECONDS + 2)
    assert len(upstream.forwards) == 1, "no upload before the lease"


async def test_a_replay_names_the_request_whose_answer_it_is(tmp_path: Path, upstream: FakeUpstream) -> None:
    # the header said the retry's own id while the replayed body carried the first one's
    settings = make_settings(tmp_path, idempotency={"enabled": True, "path": str(tmp_path / "keys.sqlite3")})
    idempotency = await open_idempotency(settings.edge.idempotency, None)
    gateway = build_gateway(settings, upstream=upstream, idempotency=idempotency)
    bring_online(gateway, 0, 1)
    transport = httpx.ASGITransport(app=create_app(gateway))
    try:
        async with (
            trio.open_nursery() as nursery,
            httpx.AsyncClient(transport=transport, base_url="http://gw") as client,
        ):
            await nursery.start(idempotency.run)
            answers = [
                await client.post(MEASURE, json=PHOTO, headers={"Idempotency-Key": "k-1", "X-Request-ID": rid})
                for rid in ("first", "retry")
            ]
            nursery.cancel_scope.cancel()
    finally:
        await idempotency.aclose()
    replay = answers[1]
    assert replay.headers["Idempotency-Replayed"] == "true" and len(upstream.forwards) == 1
    assert replay.json()["request_id"] == "first"
    assert replay.headers["X-Request-ID"] == "first", "the header follows the replayed body"
