"""Admission on the real gateway: Idempotency-Key under concurrency and over a shared Redis, the rate limit.

gateway.md § Idempotency and § Rate limiting. Every client here is 127.0.0.1, a trusted
proxy by default, so a test names its own client with `X-Forwarded-For` (the gateway
keys its buckets on it) and cannot share a bucket with another test.
"""

from __future__ import annotations

import httpx
import pytest
import trio

from cluster.launcher import Process
from shared.contract import (
    HEADER_IDEMPOTENCY_KEY,
    HEADER_IDEMPOTENCY_REPLAYED,
    HEADER_RETRY_AFTER,
    HEADER_TOKEN,
    MSG_BACKEND_UNAVAILABLE,
    MSG_RATE_LIMITED,
    Code,
)
from tests.edge.e2e.harness import MEASURE, Cluster, measure, metrics_listener, scrape, wait_until
from tests.fakes.launch import FakeWorkerProcess
from tests.fakes.redis_server import RedisServer

# Long enough that every concurrent duplicate arrives while the first is still on the worker.
JOB_MS = 300
STATUS_PAGES = ("/health", "/gateway-health", "/monitor")


async def _jobs(fakes: list[FakeWorkerProcess]) -> int:
    return sum([len((await fake.stats())["jobs"]) for fake in fakes])


async def _concurrently(sends: list[tuple[httpx.AsyncClient, dict[str, str]]]) -> list[httpx.Response]:
    """One `measure` per (client, headers), all started at once; answers in the same order."""
    answers: list[httpx.Response | None] = [None] * len(sends)

    async def one(index: int, client: httpx.AsyncClient, headers: dict[str, str]) -> None:
        answers[index] = await measure(client, headers=headers)

    async with trio.open_nursery() as nursery:
        for index, (client, headers) in enumerate(sends):
            nursery.start_soon(one, index, client, headers)
    return [answer for answer in answers if answer is not None]


def _assert_one_answer_replayed(answers: list[httpx.Response]) -> None:
    """Every answer is the first one's, byte for byte; all but one say they are replays."""
    assert {a.content for a in answers} == {answers[0].content}, "every duplicate gets the first answer"
    assert answers[0].json()["code"] == Code.OK
    replayed = [a.headers.get(HEADER_IDEMPOTENCY_REPLAYED) == "true" for a in answers]
    assert replayed.count(False) == 1, f"exactly one answer is the original: {replayed}"


def _is_rate_limited(response: httpx.Response) -> bool:
    body = response.json()
    return (body["code"], body["message"]) == (Code.SYSTEM_ERROR, MSG_RATE_LIMITED)


async def test_twenty_identical_concurrent_keyed_requests_cost_one_job(cluster: Cluster) -> None:
    fakes = cluster.start_fakes(2, latency_ms=JOB_MS)
    cluster.start_gateway()
    async with cluster.client() as client:
        answers = await _concurrently([(client, {HEADER_IDEMPOTENCY_KEY: "twenty"})] * 20)
    assert len(answers) == 20
    _assert_one_answer_replayed(answers)
    assert await _jobs(fakes) == 1


@pytest.mark.slow
async def test_two_gateways_sharing_redis_behave_as_one(cluster: Cluster, redis_server: RedisServer) -> None:
    fakes = cluster.start_fakes(2, latency_ms=JOB_MS)
    shared = {"shared_state": {"redis_url": redis_server.url}}
    a = cluster.start_gateway(edge=shared)
    b = cluster.start_peer_gateway(edge=shared)
    async with cluster.client(a) as on_a, cluster.client(b) as on_b:
        first = await measure(on_a, headers={HEADER_IDEMPOTENCY_KEY: "seen-on-a"})
        again = await measure(on_b, headers={HEADER_IDEMPOTENCY_KEY: "seen-on-a"})
        assert again.content == first.content, "B replays what A stored"
        assert again.headers.get(HEADER_IDEMPOTENCY_REPLAYED) == "true"
        assert await _jobs(fakes) == 1

        split = [(on_a if i % 2 else on_b, {HEADER_IDEMPOTENCY_KEY: "split"}) for i in range(20)]
        answers = await _concurrently(split)
    _assert_one_answer_replayed(answers)
    assert await _jobs(fakes) == 2, "the split key ran once across both gateways"


@pytest.mark.slow
async def test_redis_killed_mid_run_refuses_keyed_requests_only(
    cluster: Cluster,
    redis_server: RedisServer,
) -> None:
    (fake,) = cluster.start_fakes(1)
    cluster.start_gateway(edge={"shared_state": {"redis_url": redis_server.url}})
    async with cluster.client() as client:
        stored = await measure(client, headers={HEADER_IDEMPOTENCY_KEY: "before"})
        assert stored.json()["code"] == Code.OK
        await fake.configure(hold=True)
        running: list[httpx.Response] = []
        async with trio.open_nursery() as nursery:

            async def keyed_while_redis_dies() -> None:
                running.append(await measure(client, headers={HEADER_IDEMPOTENCY_KEY: "running"}))

            nursery.start_soon(keyed_while_redis_dies)

            async def on_the_worker() -> bool:
                return (await fake.stats())["in_flight"] == 1

            await wait_until(on_the_worker, 5, "the keyed request to reach the worker")
            redis_server.kill()
            await fake.configure(hold=False)
            await fake.release()
        assert running[0].json()["code"] == Code.OK, "a request already running still gets its answer"
        jobs_before = await _jobs([fake])
        refused = [await measure(client, headers={HEADER_IDEMPOTENCY_KEY: key}) for key in ("new", "before")]
        unkeyed = [await measure(client) for _ in range(3)]
    for response in refused:
        assert (response.json()["code"], response.json()["message"]) == (Code.SYSTEM_ERROR, MSG_BACKEND_UNAVAILABLE)
        assert int(response.headers[HEADER_RETRY_AFTER]) >= 1
    assert [r.json()["code"] for r in unkeyed] == [Code.OK] * 3
    assert await _jobs([fake]) == jobs_before + 3, "the refused keyed requests never reached a worker"


@pytest.mark.slow
async def test_rate_limit_retry_after_is_honest_and_replays_and_status_pages_are_free(cluster: Cluster) -> None:
    (fake,) = cluster.start_fakes(1)
    # burst 2, then one token every 2 s
    cluster.start_gateway(edge={"rate_limit": {"enabled": True, "requests_per_minute": 30, "burst": 2}})
    me = {"X-Forwarded-For": "198.51.100.7"}
    keyed = {**me, HEADER_IDEMPOTENCY_KEY: "limited-client"}
    async with cluster.client() as client:
        first = await measure(client, headers=keyed)
        replay = await measure(client, headers=keyed)
        unkeyed = await measure(client, headers=me)  # limited already if the replay had cost a token
        limited = await measure(client, headers=me)
        replay_while_limited = await measure(client, headers=keyed)
        pages = [await client.get(path, headers=me) for path in STATUS_PAGES for _ in range(5)]
        assert _is_rate_limited(limited), limited.text
        retry_after = int(limited.headers[HEADER_RETRY_AFTER])
        assert 1 <= retry_after <= 2, "whole seconds until the next token: at most 2 s at 30 a minute"
        other_client = await measure(client, headers={"X-Forwarded-For": "198.51.100.8"})
        await trio.sleep(retry_after)  # what the client was told to do: the claim under test
        after_waiting = await measure(client, headers=me)
    assert [r.json()["code"] for r in (first, unkeyed, other_client, after_waiting)] == [Code.OK] * 4
    for stored in (replay, replay_while_limited):
        assert stored.content == first.content
        assert stored.headers.get(HEADER_IDEMPOTENCY_REPLAYED) == "true"
    assert [page.status_code for page in pages] == [200] * len(pages), "status pages are never limited"
    assert await _jobs([fake]) == 4, "first, unkeyed, other client, after waiting; none for the limited one"


@pytest.mark.slow
async def test_two_gateways_sharing_redis_enforce_one_limit(cluster: Cluster, redis_server: RedisServer) -> None:
    fakes = cluster.start_fakes(1)
    # 3 requests, then a token a minute: nothing refills during the test
    edge = {
        "shared_state": {"redis_url": redis_server.url},
        "rate_limit": {"enabled": True, "requests_per_minute": 1, "burst": 3},
    }
    gateways: list[Process] = [cluster.start_gateway(edge=edge), cluster.start_peer_gateway(edge=edge)]
    me = {"X-Forwarded-For": "198.51.100.9"}
    async with cluster.client(gateways[0]) as on_a, cluster.client(gateways[1]) as on_b:
        answers = [await measure(on_a if i % 2 else on_b, headers=me) for i in range(6)]
    limited = [_is_rate_limited(answer) for answer in answers]
    assert limited == [False, False, False, True, True, True], "one bucket of 3 across both gateways"
    assert all(int(answers[i].headers[HEADER_RETRY_AFTER]) >= 1 for i in (3, 4, 5))
    assert await _jobs(fakes) == 3


async def test_a_client_that_left_while_queued_leaves_its_key_free(cluster: Cluster) -> None:
    """Issue 15: the departure was stored (499, empty body) and every retry got HTTP 500 for a day."""
    (fake,) = cluster.start_fakes(1)
    settings, metrics_url = metrics_listener()
    cluster.start_gateway(edge=settings)
    await fake.configure(hold=True)
    keyed = {HEADER_IDEMPOTENCY_KEY: "left-while-queued"}
    async with cluster.client() as client:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(measure, client)  # takes the only worker and holds it

            async def on_the_worker() -> bool:
                return (await fake.stats())["in_flight"] == 1

            await wait_until(on_the_worker, 5, "the first request to reach the worker")
            leaving = trio.CancelScope()
            nursery.start_soon(_until_cancelled, leaving, cluster, keyed)

            async def queued() -> bool:
                return (await scrape(metrics_url))["hairgate_queue_length"][0].value == 1

            await wait_until(queued, 5, "the keyed request to wait in the queue")
            leaving.cancel()  # the client hangs up while its request is queued

            async def logged_as_left() -> bool:
                return any(e["http_status"] == 499 for e in cluster.request_log_entries())

            await wait_until(logged_as_left, 5, "the departure in the request log")
            await fake.configure(hold=False)
            await fake.release()
        retried = await measure(client, headers=keyed)
    assert retried.status_code == 200 and retried.json()["code"] == Code.OK, retried.text
    assert HEADER_IDEMPOTENCY_REPLAYED not in retried.headers, "nothing was stored for the departed client"
    assert await _jobs([fake]) == 2


async def _until_cancelled(scope: trio.CancelScope, cluster: Cluster, headers: dict[str, str]) -> None:
    with scope:
        async with cluster.client() as own_connection:  # closed when cancelled: the client left
            await measure(own_connection, headers=headers)


async def test_a_hosts_own_1007_is_not_stored(cluster: Cluster) -> None:
    """Issue 15: a host's 1007 ("please retry": a restart, a timeout) was replayed for 24 hours."""
    (fake,) = cluster.start_fakes(1)
    cluster.start_gateway()
    await fake.configure(answer_code=int(Code.SYSTEM_ERROR))
    keyed = {HEADER_IDEMPOTENCY_KEY: "host-said-retry"}
    async with cluster.client() as client:
        failed = await measure(client, headers=keyed)
        await fake.configure(answer_code=0)
        retried = await measure(client, headers=keyed)
        replayed = await measure(client, headers=keyed)
    assert failed.json()["code"] == Code.SYSTEM_ERROR
    assert retried.json()["code"] == Code.OK, "the retry the host asked for runs"
    assert HEADER_IDEMPOTENCY_REPLAYED not in retried.headers
    assert replayed.content == retried.content and replayed.headers.get(HEADER_IDEMPOTENCY_REPLAYED) == "true"
    assert await _jobs([fake]) == 2


API_KEY = "X-Api-Key"


async def test_with_api_keys_each_client_has_its_own_keys_and_its_ip_is_limited_too(cluster: Cluster) -> None:
    (fake,) = cluster.start_fakes(1)
    # burst 6 per API key AND per IP (its own bucket, set to the key's numbers here: its
    # default is 10x), then a token a minute: nothing refills during the test
    rate_limit = {"enabled": True, "requests_per_minute": 1, "burst": 6, "key_header": API_KEY,
                  "ip_requests_per_minute": 1, "ip_burst": 6}  # fmt: skip
    cluster.start_gateway(edge={"rate_limit": rate_limit})
    alice = {API_KEY: "sk-alice-0000000000", "X-Forwarded-For": "198.51.100.20"}
    mallory = {API_KEY: "sk-mallory-00000000", "X-Forwarded-For": "198.51.100.21"}
    async with cluster.client() as client:
        # Mallory squats the key Alice will use, with a junk body: it is hers alone.
        squat = await client.post(
            MEASURE, json={"image_base64": "BBBB"}, headers={**mallory, HEADER_IDEMPOTENCY_KEY: "order-1"}
        )
        mine = await measure(client, headers={**alice, HEADER_IDEMPOTENCY_KEY: "order-1"})
        # Mallory tries to fetch Alice's answer (her face analysis) by sending her request and key.
        theirs = await measure(client, headers={**mallory, HEADER_IDEMPOTENCY_KEY: "order-1"})
        again = await measure(client, headers={**alice, HEADER_IDEMPOTENCY_KEY: "order-1"})
        # A made-up API key per request from one IP: the IP's bucket (6, 3 taken) still applies.
        rotating = [
            await measure(client, headers={API_KEY: f"made-up-{n}", "X-Forwarded-For": "198.51.100.21"})
            for n in range(6)
        ]
    assert squat.json()["code"] != Code.OK  # refused by the gateway's own checks, and stored
    assert mine.json()["code"] == Code.OK, "not 1001 'key used for another request': Mallory's key is not Alice's"
    # Mallory's "order-1" is her junk request's: she gets her own mismatch, never Alice's answer
    assert theirs.json()["code"] == Code.INVALID_PARAMETER and theirs.content != mine.content
    assert HEADER_IDEMPOTENCY_REPLAYED not in theirs.headers
    assert again.content == mine.content and again.headers.get(HEADER_IDEMPOTENCY_REPLAYED) == "true"
    limited = [_is_rate_limited(answer) for answer in rotating]
    assert limited == [False, False, False, False, True, True], "Mallory's IP had 2 requests before"
    assert all(int(rotating[i].headers[HEADER_RETRY_AFTER]) >= 1 for i in (4, 5))
    assert await _jobs([fake]) == 1 + 4  # Alice's, and the 4 rotating ones let through


@pytest.mark.slow  # the rule itself: tests/shared/test_secrets_file.py; the endpoint's 400: tests/edge/test_admin.py
async def test_admin_token_refuses_a_token_of_too_few_distinct_characters(cluster: Cluster) -> None:
    """Issue 15: 16 identical characters were taken (gateway.md § Admin endpoints: at least 8 distinct)."""
    cluster.start_fakes(1)
    cluster.start_gateway()
    old = {HEADER_TOKEN: cluster.token}
    async with cluster.client() as client:
        weak = await client.post("/admin/token", json={"shared_password": "a" * 16}, headers=old)
        still_old = await client.get("/admin/stats", headers=old)
    assert weak.status_code == 400, weak.text
    assert "a" * 16 not in weak.text
    assert still_old.status_code == 200, "nothing changed"
    assert "a" * 16 not in cluster.secrets_path.read_text()
