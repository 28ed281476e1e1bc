"""`Idempotency-Key` on the real gateway (gateway.md § Idempotency, seed 002 §4)."""

from __future__ import annotations

import httpx
import pytest
import trio

from shared.contract import Code
from tests.edge.e2e.harness import MEASURE, Cluster, measure, wait_until
from tests.fakes.launch import FakeWorkerProcess

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
