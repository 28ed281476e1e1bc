"""`Idempotency-Key` on the real gateway (gateway.md § Idempotency, seed 002 §4 and §6.2)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import httpx
import pytest
import trio

from cluster.launcher import Process
from edge.admission.idempotency_stores import RedisStore
from edge.shared_state import redis_client
from shared.contract import HEADER_IDEMPOTENCY_KEY, HEADER_IDEMPOTENCY_REPLAYED, HEADER_REQUEST_ID, Code
from tests.edge.e2e.harness import MEASURE, Cluster, measure, wait_until
from tests.edge.e2e.test_e2e_audit import _with_dsn
from tests.fakes.launch import FakeWorkerProcess
from tests.fakes.redis_server import RedisServer

pytestmark = [pytest.mark.slow]


async def _jobs(fake: FakeWorkerProcess) -> int:
    return len((await fake.stats())["jobs"])


async def test_a_completed_request_is_replayed_without_touching_a_worker(cluster: Cluster) -> None:
    (fake,) = cluster.start_fakes(1)
    cluster.start_gateway()
    async with cluster.client() as client:
        first = await measure(client, headers={"Idempotency-Key": "order-1", "X-Request-ID": "original"})
        again = await measure(client, headers={"Idempotency-Key": "order-1", "X-Request-ID": "retry"})
    assert first.json()["code"] == Code.OK
    assert again.json() == first.json(), "the stored answer, same request_id and image URLs"
    assert again.headers.get("Idempotency-Replayed") == "true"
    assert "Idempotency-Replayed" not in first.headers
    assert await _jobs(fake) == 1


async def test_the_same_key_for_another_request_is_refused(cluster: Cluster) -> None:
    (fake,) = cluster.start_fakes(1)
    cluster.start_gateway()
    async with cluster.client() as client:
        await measure(client, headers={"Idempotency-Key": "order-2"})
        other = await client.post(MEASURE, json={"image_base64": "BBBB"}, headers={"Idempotency-Key": "order-2"})
        bad_key = await measure(client, headers={"Idempotency-Key": "k" * 129})
    assert (other.json()["code"], other.json()["message"]) == (
        Code.INVALID_PARAMETER,
        "Idempotency-Key 已用于不同的请求",
    )
    assert bad_key.json()["code"] == Code.INVALID_PARAMETER
    assert await _jobs(fake) == 1


async def test_a_duplicate_arriving_while_the_first_runs_waits_for_its_result(cluster: Cluster) -> None:
    (fake,) = cluster.start_fakes(1)
    cluster.start_gateway()
    await fake.configure(hold=True)
    answers: list[httpx.Response] = []
    async with cluster.client() as client, trio.open_nursery() as nursery:

        async def one() -> None:
            answers.append(await measure(client, headers={"Idempotency-Key": "order-3"}))

        nursery.start_soon(one)

        async def running() -> bool:
            return (await fake.stats())["in_flight"] == 1

        await wait_until(running, 5, "the first request to reach the worker")
        nursery.start_soon(one)
        await trio.sleep(0.3)  # lets the duplicate arrive while the first still runs
        await fake.configure(hold=False)
        await fake.release()
    assert [a.json()["code"] for a in answers] == [Code.OK, Code.OK]
    assert answers[0].json()["request_id"] == answers[1].json()["request_id"]
    assert await _jobs(fake) == 1, "never run it twice"


async def test_gateway_made_1007_is_not_stored_and_a_record_survives_a_restart(cluster: Cluster) -> None:
    (fake,) = cluster.start_fakes(1)
    await fake.configure(not_ready=True)
    gateway = cluster.start_gateway()
    async with cluster.client() as client:
        refused = await measure(client, headers={"Idempotency-Key": "order-4"})
        assert refused.json()["code"] == Code.SYSTEM_ERROR
        await fake.configure(not_ready=False)

        async def online() -> bool:
            return (await client.get("/gateway-health")).json()["workers_healthy"] == 1

        await wait_until(online, 10, "the worker to come online")
        served = await measure(client, headers={"Idempotency-Key": "order-4"})
        assert served.json()["code"] == Code.OK, "a gateway-made 1007 must not be replayed"
    gateway.terminate()
    assert await trio.to_thread.run_sync(gateway.wait_exit, 15) == 0
    cluster.start_gateway()
    async with cluster.client() as client:
        replayed = await measure(client, headers={"Idempotency-Key": "order-4"})
    assert replayed.json() == served.json()
    assert replayed.headers.get("Idempotency-Replayed") == "true"
    assert await _jobs(fake) == 1


async def test_a_flushall_mid_load_through_two_gateways_with_postgresql_loses_no_key(
    cluster: Cluster, postgres_dsn: str, redis_server: RedisServer
) -> None:
    """Issue 40 item 5: PostgreSQL the authority, Redis its cache. 40 keys, each sent 4 times
    (twice through each gateway) by 8 clients at once; Redis is flushed when half the answers
    are in and killed at three quarters: every key ran once on the hosts, every answer is 0."""
    _with_dsn(cluster, postgres_dsn)  # `[audit] postgres_dsn`: both gateways read the one secrets file
    fakes = cluster.start_fakes(2, latency_ms=40)
    shared = {"shared_state": {"redis_url": redis_server.url}}
    gateways = [cluster.start_gateway(edge=shared), cluster.start_peer_gateway(edge=shared)]
    keys = [f"k{n:02d}" for n in range(40)]
    # a key's sends are a round (40 sends) apart, alternating gateways: before and after each event
    sends = [(gateways[(turn + i) % 2], key, f"{key}.{turn}") for turn in range(4) for i, key in enumerate(keys)]
    answers: dict[str, list[httpx.Response]] = {key: [] for key in keys}
    half_answered, three_quarters_answered = trio.Event(), trio.Event()
    flushed: list[int] = []  # the cached answers the flush removed

    async def client(queue: Iterator[tuple[Process, str, str]], http: dict[Process, httpx.AsyncClient]) -> None:
        for gateway, key, request_id in queue:  # one queue, shared by every client
            headers = {HEADER_IDEMPOTENCY_KEY: key, HEADER_REQUEST_ID: request_id}
            answers[key].append(await measure(http[gateway], headers=headers))
            answered = sum(len(seen) for seen in answers.values())
            if answered >= len(sends) // 2:
                half_answered.set()
            if answered >= 3 * len(sends) // 4:
                three_quarters_answered.set()

    async def disturb_redis() -> None:
        await half_answered.wait()
        async with redis_client(redis_server.url) as redis:
            assert redis is not None
            flushed.append(len(await redis.keys(RedisStore.PREFIX + "*")))
            await redis.flushall()
        await three_quarters_answered.wait()
        redis_server.kill()

    async with cluster.client(gateways[0]) as on_a, cluster.client(gateways[1]) as on_b:
        http = {gateways[0]: on_a, gateways[1]: on_b}
        queue = iter(sends)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(disturb_redis)
            for _ in range(8):
                nursery.start_soon(client, queue, http)
    jobs = [job for fake in fakes for job in (await fake.stats())["jobs"]]
    ran = Counter(job["request_id"].split(".")[0] for job in jobs)
    assert flushed and flushed[0] > 0, "the premise: answers were cached in Redis when it was flushed"
    assert ran == Counter(dict.fromkeys(keys, 1)), "every key ran exactly once on the hosts"
    for key, seen in answers.items():
        assert [answer.json()["code"] for answer in seen] == [Code.OK] * 4, key
        assert len({answer.content for answer in seen}) == 1, f"{key}: one answer, replayed byte for byte"
        assert sum(answer.headers.get(HEADER_IDEMPOTENCY_REPLAYED) == "true" for answer in seen) == 3, key
