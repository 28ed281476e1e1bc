"""Worker failures seen through the real gateway: retries, ejection, cooldown, backups, total outage."""

from __future__ import annotations

import time

import httpx
import pytest
import trio

from shared.contract import MSG_BACKEND_UNAVAILABLE, Code, envelope
from tests.edge.e2e.harness import MEASURE_BODY, MONITOR_KEYS, Cluster, gateway_health, measure, wait_until
from tests.fakes.launch import FakeWorkerProcess


async def _healthy_count(client: httpx.AsyncClient) -> int:
    return (await gateway_health(client))["workers_healthy"]


async def _jobs(fake: FakeWorkerProcess) -> int:
    return len((await fake.stats())["jobs"])


async def _send_until_worker_gets_one(client: httpx.AsyncClient, fake: FakeWorkerProcess) -> list[httpx.Response]:
    """Sequential requests until `fake` received one (idle-longest reaches every worker soon)."""
    responses = []
    for _ in range(4):
        responses.append(await measure(client))
        if not fake.alive() or await _jobs(fake):
            return responses
    raise AssertionError("the gateway never sent a request to one of two idle workers")


@pytest.mark.slow
async def test_all_workers_killed_monitor_503_and_requests_fail_at_once(cluster: Cluster) -> None:
    fakes = cluster.start_fakes(2)
    cluster.start_gateway(edge={"dispatch": {"queue_wait_seconds": 20, "max_queue_wait_seconds": 20}})
    async with cluster.client() as client:
        assert (await client.get("/monitor")).status_code == 200
        for fake in fakes:
            fake.kill()

        async def monitor_is_503() -> bool:
            return (await client.get("/monitor")).status_code == 503

        await wait_until(monitor_is_503, 10, "/monitor to answer 503 after every worker died")
        body = (await client.get("/monitor")).json()
        assert body == {
            "status": "unhealthy",
            "service": "gateway",
            "workers_total": 2,
            "workers_healthy": 0,
            "workers_primary_total": 2,
            "workers_primary_healthy": 0,
            "message": "没有可用的 worker",
        }
        started = time.monotonic()
        response = await measure(client, headers={"X-Request-ID": "nobody-home"})
        elapsed = time.monotonic() - started
    assert response.json() == envelope(Code.SYSTEM_ERROR, "nobody-home", message=MSG_BACKEND_UNAVAILABLE)
    assert response.headers["Retry-After"].isdigit()
    assert elapsed < 1.0, f"no online worker must answer at once, not wait the 20 s queue: {elapsed:.2f} s"


@pytest.mark.slow
async def test_waiters_are_answered_when_the_last_worker_dies(cluster: Cluster) -> None:
    (fake,) = cluster.start_fakes(1)
    await fake.configure(hold=True)
    cluster.start_gateway(edge={"dispatch": {"queue_wait_seconds": 20, "max_queue_wait_seconds": 20}})
    answers: dict[str, tuple[dict, float]] = {}
    async with cluster.client() as client, trio.open_nursery() as nursery:

        async def one(request_id: str) -> None:
            response = await measure(client, headers={"X-Request-ID": request_id})
            answers[request_id] = (response.json(), time.monotonic())

        nursery.start_soon(one, "running")

        async def running() -> bool:
            return (await fake.stats())["in_flight"] == 1

        await wait_until(running, 5, "the first request to reach the worker")
        nursery.start_soon(one, "waiting")
        await trio.sleep(0.2)  # lets the second client arrive and queue; not a synchronisation
        killed_at = time.monotonic()
        fake.kill()
    for request_id in ("running", "waiting"):
        body, answered_at = answers[request_id]
        assert (body["code"], body["message"]) == (1007, MSG_BACKEND_UNAVAILABLE), body
        assert answered_at - killed_at < 5, f"{request_id} waited {answered_at - killed_at:.1f} s for nothing"


@pytest.mark.slow
@pytest.mark.parametrize(
    "failure",
    [
        {"fail_all": True, "fail_status": 500},
        {"fail_next": 1, "fail_status": 503},
        {"fail_next": 1, "fail_status": 401},
        {"crash": True},
    ],
    ids=["http-500", "http-503", "http-401", "process-died"],
)
async def test_failed_worker_is_ejected_and_the_request_retried(cluster: Cluster, failure: dict) -> None:
    broken, good = cluster.start_fakes(2)
    cluster.start_gateway(edge={"health_check": {"cooldown_seconds": 30}})
    await broken.configure(**failure)
    async with cluster.client() as client:
        responses = await _send_until_worker_gets_one(client, broken)
        assert [r.json()["code"] for r in responses] == [Code.OK] * len(responses)
        assert await _healthy_count(client) == 1, "a failed forward ejects the worker at once"
    retried = responses[-1].json()["request_id"]
    assert (await good.stats())["jobs"][-1]["request_id"] == retried, "the failed request ran again on the other"
    if broken.alive():
        assert await _jobs(broken) == 1


@pytest.mark.slow
async def test_ejected_worker_stays_out_during_cooldown_although_healthy(cluster: Cluster) -> None:
    cooldown_s = 4.0
    broken, _good = cluster.start_fakes(2)
    cluster.start_gateway(edge={"health_check": {"interval_seconds": 0.2, "cooldown_seconds": cooldown_s}})
    await broken.configure(fail_all=True, fail_status=500)
    async with cluster.client() as client:
        ejecting_sent_at = time.monotonic()
        for response in await _send_until_worker_gets_one(client, broken):
            assert response.json()["code"] == Code.OK
        await broken.configure(fail_all=False)
        probes = (await broken.stats())["health_checks"]

        async def probed_ok_twice() -> bool:
            return (await broken.stats())["health_checks"] >= probes + 2

        await wait_until(probed_ok_twice, cooldown_s / 2, "two /health probes answered 200")
        health = await gateway_health(client)
        assert time.monotonic() - ejecting_sent_at < cooldown_s, "too slow to observe the cooldown"
        assert health["workers_healthy"] == 1, "probe successes must not end a cooldown early"
        for _ in range(3):
            assert (await measure(client)).json()["code"] == Code.OK
        assert await _jobs(broken) == 1, "an ejected worker gets no request during its cooldown"

        async def back_online() -> bool:
            return await _healthy_count(client) == 2

        await wait_until(back_online, cooldown_s + 5, "the worker to come back after its cooldown")
        assert time.monotonic() - ejecting_sent_at >= cooldown_s - 0.05


@pytest.mark.slow
async def test_retries_exhausted_answer_unavailable(cluster: Cluster) -> None:
    fakes = cluster.start_fakes(3)
    for fake in fakes:
        await fake.configure(fail_all=True, fail_status=502)
    cluster.start_gateway(edge={"health_check": {"cooldown_seconds": 30}, "dispatch": {"max_retries": 1}})
    async with cluster.client() as client:
        response = await measure(client, headers={"X-Request-ID": "doomed"})
        assert response.json() == envelope(Code.SYSTEM_ERROR, "doomed", message=MSG_BACKEND_UNAVAILABLE)
        assert "Retry-After" in response.headers
    jobs = sorted([await _jobs(fake) for fake in fakes])
    assert jobs == [0, 1, 1], "one try plus max_retries=1, each on another worker"


@pytest.mark.slow
@pytest.mark.parametrize("path, retried", [("/api/v1/hair/measure", True), ("/api/v1/hair/grow", False)])
async def test_timeout_is_retried_except_on_slow_paths(cluster: Cluster, path: str, retried: bool) -> None:
    slow, fast = cluster.start_fakes(2)
    await slow.configure(latency_ms=4000)
    edge = {
        "health_check": {"cooldown_seconds": 30},
        "dispatch": {"request_timeout_seconds": 2, "slow_request_timeout_seconds": 2},
    }
    cluster.start_gateway(edge=edge)
    answers = {}
    async with cluster.client() as client:
        for i in range(4):
            request_id = f"timeout-{i}"
            headers = {"X-Request-ID": request_id}
            answers[request_id] = await client.post(path, json=MEASURE_BODY, headers=headers)
            if await _jobs(slow):
                break
        assert await _healthy_count(client) == 1, "a timeout ejects the worker"
    (timed_out,) = [job["request_id"] for job in (await slow.stats())["jobs"]]
    on_fast = [job["request_id"] for job in (await fast.stats())["jobs"]]
    if retried:
        assert answers[timed_out].json()["code"] == Code.OK
        assert timed_out in on_fast
    else:
        assert answers[timed_out].json()["code"] == Code.SYSTEM_ERROR
        assert timed_out not in on_fast, "a slow-path job may still run: never run it twice"


@pytest.mark.slow
async def test_backups_get_traffic_only_when_every_primary_is_down(cluster: Cluster) -> None:
    primary_a, primary_b, backup = cluster.start_fakes(3)
    cluster.start_gateway(primary=[primary_a, primary_b])
    async with cluster.client() as client:
        for _ in range(6):
            assert (await measure(client)).json()["code"] == Code.OK
        assert await _jobs(backup) == 0, "a backup gets no traffic while a primary is online"
        await primary_a.configure(not_ready=True)
        await primary_b.configure(not_ready=True)

        async def primaries_down() -> bool:
            return (await gateway_health(client))["workers_primary_healthy"] == 0

        await wait_until(primaries_down, 10, "both primaries to go offline")
        monitor = await client.get("/monitor")
        assert monitor.status_code == 200, "backups still serve: not an outage"
        assert {k: monitor.json()[k] for k in MONITOR_KEYS - {"status", "service"}} == {
            "workers_total": 3,
            "workers_healthy": 1,
            "workers_primary_total": 2,
            "workers_primary_healthy": 0,
        }
        jobs_before = [await _jobs(primary_a), await _jobs(primary_b)]
        for _ in range(3):
            assert (await measure(client)).json()["code"] == Code.OK
        assert await _jobs(backup) == 3
        assert [await _jobs(primary_a), await _jobs(primary_b)] == jobs_before

        await primary_a.configure(not_ready=False)

        async def a_primary_back() -> bool:
            return (await gateway_health(client))["workers_primary_healthy"] == 1

        await wait_until(a_primary_back, 10, "a primary to come back online")
        for _ in range(3):
            assert (await measure(client)).json()["code"] == Code.OK
        assert await _jobs(backup) == 3, "traffic returns to the primary as soon as one is online"
