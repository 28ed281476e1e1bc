"""Dispatch through the real gateway: one request per worker at a time, FIFO, queue limits, leases.

Fake workers count overlapping jobs; the gateway's core promise is that they never see one.
"""

from __future__ import annotations

import hashlib

import httpx
import pytest
import trio

from shared.contract import MSG_BACKEND_BUSY, Code, envelope, is_valid_request_id
from tests.edge.e2e.harness import Cluster, gateway_health, measure, wait_until
from tests.fakes.fake_worker import PNG_BYTES


async def _in_flight(fake, count: int) -> bool:
    return (await fake.stats())["in_flight"] == count


async def test_burst_never_puts_two_requests_on_one_worker(cluster: Cluster) -> None:
    fakes = cluster.start_fakes(3, latency_ms=30)
    cluster.start_gateway()
    sent = [f"burst-{i:03d}" for i in range(24)]
    answers: dict[str, httpx.Response] = {}

    async with cluster.client() as client:

        async def one(request_id: str) -> None:
            # Half of the clients also send a forged internal token: it must never be forwarded.
            forged = {"X-Internal-Token": "forged-by-client"} if request_id.endswith(("1", "3", "5")) else {}
            answers[request_id] = await measure(client, headers={"X-Request-ID": request_id, **forged})

        async with trio.open_nursery() as nursery:
            for request_id in sent:
                nursery.start_soon(one, request_id)

    for request_id, response in answers.items():
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["code"] == Code.OK, body
        assert body["request_id"] == request_id
        assert response.headers["X-Request-ID"] == request_id
    stats = [await fake.stats() for fake in fakes]
    for fake_stats in stats:
        assert fake_stats["overlaps"] == 0, fake_stats
        assert fake_stats["max_concurrent"] == 1, fake_stats
        assert fake_stats["unauthorized"] == 0, "the gateway sent a wrong or a second X-Internal-Token"
    seen = [job["request_id"] for fake_stats in stats for job in fake_stats["jobs"]]
    assert sorted(seen) == sorted(sent), "each request must run exactly once"
    assert all(job["forwarded_for"] and "127.0.0.1" in job["forwarded_for"] for s in stats for job in s["jobs"])
    assert all(s["jobs"] for s in stats), "idle-longest selection spreads a burst over every worker"


@pytest.mark.slow
async def test_waiters_are_served_first_come_first_served(cluster: Cluster) -> None:
    (fake,) = cluster.start_fakes(1)
    await fake.configure(hold=True)
    cluster.start_gateway()
    order = [f"fifo-{i}" for i in range(6)]
    async with cluster.client() as client, trio.open_nursery() as nursery:
        codes: list[int] = []

        async def one(request_id: str) -> None:
            response = await measure(client, headers={"X-Request-ID": request_id})
            codes.append(response.json()["code"])

        nursery.start_soon(one, order[0])
        await wait_until(lambda: _in_flight(fake, 1), 5, "the first request to reach the worker")
        for request_id in order[1:]:
            nursery.start_soon(one, request_id)
            # The gap only orders the clients' arrivals (as real clients arrive one after
            # another); what is checked is the order the gateway hands them to the worker.
            await trio.sleep(0.15)
        await fake.configure(hold=False)
        await fake.release()
    assert codes == [Code.OK] * len(order)
    assert [job["request_id"] for job in (await fake.stats())["jobs"]] == order


@pytest.mark.slow
async def test_queue_timeout_answers_busy_with_retry_after(cluster: Cluster) -> None:
    (fake,) = cluster.start_fakes(1)
    await fake.configure(hold=True)
    cluster.start_gateway(edge={"dispatch": {"queue_wait_seconds": 0.5}})
    async with cluster.client() as client, trio.open_nursery() as nursery:
        first: list[httpx.Response] = []

        async def hold_the_worker() -> None:
            first.append(await measure(client, headers={"X-Request-ID": "holder"}))

        nursery.start_soon(hold_the_worker)
        await wait_until(lambda: _in_flight(fake, 1), 5, "the first request to reach the worker")
        response = await measure(client, headers={"X-Request-ID": "waiter"})
        assert response.status_code == 200
        assert response.json() == envelope(Code.SYSTEM_ERROR, "waiter", message=MSG_BACKEND_BUSY)
        assert response.headers["Retry-After"] == "2"
        await fake.configure(hold=False)
        await fake.release()
    assert first[0].json()["code"] == Code.OK
    assert [job["request_id"] for job in (await fake.stats())["jobs"]] == ["holder"]
    async with cluster.client() as client:
        assert (await measure(client)).json()["code"] == Code.OK, "the worker must be free again"


@pytest.mark.slow
async def test_client_disconnect_frees_its_slot_and_worker(cluster: Cluster) -> None:
    (fake,) = cluster.start_fakes(1)
    await fake.configure(hold=True)
    # One global slot: a leaked slot or a worker left leased makes the last request fail.
    cluster.start_gateway(edge={"dispatch": {"max_inflight": 1, "queue_wait_seconds": 3, "max_queue_wait_seconds": 3}})
    async with cluster.client() as client:
        with trio.CancelScope() as abandoned:

            async def abandon_when_running() -> None:
                await wait_until(lambda: _in_flight(fake, 1), 5, "the request to reach the worker")
                abandoned.cancel()  # closes the client's connection mid-request

            async with trio.open_nursery() as nursery:
                nursery.start_soon(abandon_when_running)
                await measure(client, headers={"X-Request-ID": "gone"})
        assert abandoned.cancelled_caught
    await fake.configure(hold=False)
    await fake.release()
    async with cluster.client() as client:
        await wait_until(lambda: _no_busy_worker(client), 5, "the gateway to mark the worker idle once it answered")
        response = await measure(client, headers={"X-Request-ID": "next"})
        assert response.json()["code"] == Code.OK, response.text
    stats = await fake.stats()
    assert stats["overlaps"] == 0
    assert stats["jobs"][-1]["request_id"] == "next"


async def _no_busy_worker(client: httpx.AsyncClient) -> bool:
    return (await gateway_health(client))["workers_busy"] == 0


@pytest.mark.slow
async def test_worker_reporting_busy_gets_no_request_until_a_probe_sees_it_free(cluster: Cluster) -> None:
    busy, _free = cluster.start_fakes(2)
    await busy.configure(health_busy=True)
    cluster.start_gateway()
    async with cluster.client() as client:
        for _ in range(4):
            assert (await measure(client)).json()["code"] == Code.OK
        assert (await busy.stats())["jobs"] == [], "a worker whose /health says busy must not get a job"
        await busy.configure(health_busy=False)

        # A host held busy elsewhere is free again once two probes apart say so, and held
        # again while its "idle" is stale (pool.py): when the gateway has seen those
        # probes is its own affair, so requests go on until the freed worker has one
        async def freed_worker_served() -> bool:
            assert (await measure(client)).json()["code"] == Code.OK
            return bool((await busy.stats())["jobs"])

        await wait_until(freed_worker_served, 5, "the freed worker given a request")


@pytest.mark.slow
async def test_forward_keeps_path_query_body_and_content_type(cluster: Cluster) -> None:
    (fake,) = cluster.start_fakes(1)
    cluster.start_gateway()
    photo = PNG_BYTES + bytes(range(256)) * 40  # PNG magic bytes: the gateway checks those
    async with cluster.client() as client:
        request = client.build_request(
            "POST",
            "/api/v1/hair/mark?drop_mm=12",
            files={"image": ("face.jpg", photo, "image/jpeg")},
            data={"drop_mm": "12"},
            headers={"X-Request-ID": "multipart-1"},
        )
        body = await request.aread()
        response = await client.send(request)
    assert response.json()["code"] == Code.OK
    (job,) = (await fake.stats())["jobs"]
    assert (job["path"], job["query"], job["request_id"]) == ("/api/v1/hair/mark", "drop_mm=12", "multipart-1")
    assert job["content_type"] == request.headers["Content-Type"], "the multipart boundary must survive"
    assert (job["bytes"], job["sha256"]) == (len(body), hashlib.sha256(body).hexdigest())


@pytest.mark.slow
async def test_a_malformed_request_id_is_replaced_end_to_end(cluster: Cluster) -> None:
    (fake,) = cluster.start_fakes(1)
    cluster.start_gateway()
    async with cluster.client() as client:
        response = await measure(client, headers={"X-Request-ID": "not valid/" + "x" * 70})
    generated = response.json()["request_id"]
    assert is_valid_request_id(generated) and not generated.startswith("not valid")
    assert response.headers["X-Request-ID"] == generated
    assert (await fake.stats())["jobs"][0]["request_id"] == generated, "the worker sees the same id"


@pytest.mark.slow
async def test_a_busy_worker_is_still_probed_and_stays_online(cluster: Cluster) -> None:
    (fake,) = cluster.start_fakes(1)
    await fake.configure(hold=True)
    cluster.start_gateway(edge={"health_check": {"interval_seconds": 0.2, "timeout_seconds": 0.5}})
    async with cluster.client() as client, trio.open_nursery() as nursery:
        nursery.start_soon(measure, client)
        await wait_until(lambda: _in_flight(fake, 1), 5, "the request to reach the worker")
        probes = (await fake.stats())["health_checks"]

        async def probed_during_the_job() -> bool:
            return (await fake.stats())["health_checks"] >= probes + 3

        await wait_until(probed_during_the_job, 5, "probes while the worker runs a job")
        health = await gateway_health(client)
        assert (health["workers_healthy"], health["workers_busy"]) == (1, 1)
        await fake.configure(hold=False)
        await fake.release()
