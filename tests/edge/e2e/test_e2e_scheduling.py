"""Scheduling and capabilities through the real gateway process (gateway.md § Scheduling, § Capabilities).

Fake GPU hosts as processes: service time per path, jobs held until released, the busy
flag and `checks` in `/health`, and a count of the connections the gateway closed. These
tests check behaviour; how fast it is (p95s, "within 1 s") is `scripts/bench_scheduling.py`'s.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import trio

from shared.contract import HEADER_IDEMPOTENCY_KEY, MSG_BACKEND_BUSY, Code
from tests.edge.e2e.harness import (
    MEASURE_BODY,
    Cluster,
    gateway_health,
    measure,
    metrics_listener,
    scrape,
    wait_until,
)
from tests.fakes.launch import FakeWorkerProcess

GROW = "/api/v1/hair/grow"


async def grow(client: httpx.AsyncClient, request_id: str, **headers: str) -> httpx.Response:
    return await client.post(GROW, json=MEASURE_BODY, headers={"X-Request-ID": request_id, **headers})


async def total_in_flight(fakes: list[FakeWorkerProcess]) -> int:
    return sum([(await fake.stats())["in_flight"] for fake in fakes])


async def counter(metrics_url: str, family: str, **labels: str) -> float:
    samples = (await scrape(metrics_url)).get(family, [])
    return sum(
        s.value for s in samples if s.name.endswith("_total") and all(s.labels.get(k) == v for k, v in labels.items())
    )


async def test_a_measurement_takes_the_reserved_host_while_a_generation_waits(cluster: Cluster) -> None:
    fakes = cluster.start_fakes(3)
    for fake in fakes:
        await fake.configure(hold_paths=[GROW], refuse_when_busy=True)
    cluster.start_gateway()  # edge.dispatch.reserved_fast_workers = 1 by default
    answers: dict[str, httpx.Response] = {}
    async with cluster.client() as client:

        async def one(request_id: str) -> None:
            answers[request_id] = await grow(client, request_id)

        async with trio.open_nursery() as nursery:
            for number in range(3):
                nursery.start_soon(one, f"g{number}")

            async def two_running() -> bool:
                return await total_in_flight(fakes) == 2

            await wait_until(two_running, 10, "two generations on two hosts")
            answers["m"] = await measure(client, headers={"X-Request-ID": "m"})
            assert await total_in_flight(fakes) == 2, "the third generation still waits: one host stays for fast work"
            for fake in fakes:
                await fake.configure(hold_paths=[])
                await fake.release()
    assert {name: r.json()["code"] for name, r in answers.items()} == dict.fromkeys(["g0", "g1", "g2", "m"], Code.OK)
    stats = [await fake.stats() for fake in fakes]
    assert sum(s["overlaps"] for s in stats) == 0
    (reserved,) = [s for s in stats if s["jobs"][0]["request_id"] == "m"]
    assert [job["path"] for job in reserved["jobs"]] == ["/api/v1/hair/measure", GROW], "then the last generation"


async def test_a_client_leaving_mid_forward_frees_its_host_and_stores_nothing(cluster: Cluster) -> None:
    (fake,) = cluster.start_fakes(1)
    await fake.configure(hold_paths=[GROW], refuse_when_busy=True)
    edge, metrics_url = metrics_listener()
    cluster.start_gateway(edge=edge)
    key = {HEADER_IDEMPOTENCY_KEY: "leaves-1"}
    async with cluster.client() as client:
        leaving, queued = trio.CancelScope(), trio.CancelScope()

        async def leaves() -> None:
            with leaving:
                await grow(client, "leaves", **key)

        async def waits_then_leaves() -> None:
            with queued:
                await measure(client, headers={"X-Request-ID": "queued"})

        async with trio.open_nursery() as nursery:
            nursery.start_soon(leaves)

            async def running() -> bool:
                return await total_in_flight([fake]) == 1

            await wait_until(running, 10, "the generation on the host")
            nursery.start_soon(waits_then_leaves)

            async def one_waiting() -> bool:
                samples = (await scrape(metrics_url))["hairgate_queue_length"]
                return samples[0].value == 1

            await wait_until(one_waiting, 10, "a measurement queued behind the generation")
            queued.cancel()  # it leaves the queue: nothing is forwarded
            leaving.cancel()  # the client goes away mid-forward: its connection is closed

        async def host_saw_the_close() -> bool:
            return len((await fake.stats())["departures"]) == 1

        await wait_until(host_saw_the_close, 10, "the gateway closing its upstream connection")
        after = await measure(client, headers={"X-Request-ID": "next"})
        assert after.json()["code"] == Code.OK, "the freed host serves the next request"
        await fake.configure(hold_paths=[])
        again = await grow(client, "again", **key)
        assert again.json()["code"] == Code.OK and "Idempotency-Replayed" not in again.headers, "nothing was stored"
    stats = await fake.stats()
    assert [job["request_id"] for job in stats["jobs"]] == ["leaves", "next", "again"]
    assert stats["overlaps"] == 0 and stats["busy_refused"] == 0
    # the harness's slow and fast timeouts in ms, less what connecting took (the remaining
    # time is sent; a few ms at most on loopback, 1 s of slack for a loaded machine)
    sent = [int(job["request_timeout_ms"]) for job in stats["jobs"][:2]]
    assert 19_000 < sent[0] <= 20_000 and 9_000 < sent[1] <= 10_000, sent

    async def counted() -> bool:
        by_stage = [await counter(metrics_url, "hairgate_departures", stage=stage) for stage in ("queued", "forward")]
        return by_stage == [1, 1]

    await wait_until(counted, 5, "hairgate_departures_total: 1 queued, 1 during its forward")
    entries = await cluster.wait_for_log_entries(4)
    assert {e["request_id"]: e["http_status"] for e in entries if e["http_status"] == 499} == {
        "leaves": 499,
        "queued": 499,
    }


async def test_a_hopeless_wait_is_answered_busy_at_once_with_retry_after(cluster: Cluster) -> None:
    (fake,) = cluster.start_fakes(1)
    await fake.configure(latency_ms_by_path={GROW: 1500}, refuse_when_busy=True)
    edge, metrics_url = metrics_listener()
    # a generation cannot start within a 50 ms queue wait while a 1.5 s one runs: past the
    # wait by more than the refusal margin (1 s) even at the fastest answer seen
    cluster.start_gateway(edge={**edge, "dispatch": {"queue_wait_seconds": 0.05}})
    async with cluster.client() as client:
        for number in range(5):  # five answers: the path's low and high times are known from now on
            assert (await grow(client, f"warm-{number}")).json()["code"] == Code.OK
        async with trio.open_nursery() as nursery:
            nursery.start_soon(grow, client, "first")

            async def running() -> bool:
                return await total_in_flight([fake]) == 1

            await wait_until(running, 10, "the first generation on the host", interval_s=0.005)
            refused = await grow(client, "refused")
    body = refused.json()
    assert (body["code"], body["message"]) == (Code.SYSTEM_ERROR, MSG_BACKEND_BUSY)
    assert refused.headers["Retry-After"] == "2", "the estimate (under 1.5 s) in whole seconds"
    assert [job["request_id"] for job in (await fake.stats())["jobs"]][-1] == "first", "the refused one ran nowhere"
    entries = {e["request_id"]: e for e in await cluster.wait_for_log_entries(7)}
    assert (entries["refused"]["queue_ms"], entries["refused"].get("early_refusal")) == (0, True)
    assert entries["first"].get("early_refusal") is False

    async def counted() -> bool:
        return await counter(metrics_url, "hairgate_early_refusals") == 1

    await wait_until(counted, 5, "hairgate_early_refusals_total = 1")


async def test_generations_avoid_a_host_whose_comfyui_is_down_unless_all_are(cluster: Cluster) -> None:
    down, up = cluster.start_fakes(2)
    await down.configure(checks={"disk": "ok", "comfyui": "down"}, inference_timeout_seconds=5)
    await up.configure(checks={"disk": "ok", "comfyui": "ok"}, inference_timeout_seconds=5)
    edge, metrics_url = metrics_listener()
    cluster.start_gateway(edge=edge)

    async def jobs_by_host(send: Any, count: int) -> list[int]:
        before = [len((await fake.stats())["jobs"]) for fake in (down, up)]
        async with cluster.client() as client:
            for number in range(count):
                assert (await send(client, number)).json()["code"] == Code.OK
        return [len((await fake.stats())["jobs"]) - b for fake, b in zip((down, up), before, strict=True)]

    assert await jobs_by_host(lambda client, n: grow(client, f"g{n}"), 8) == [0, 8]
    measured = await jobs_by_host(lambda client, n: measure(client), 8)
    assert all(measured) and sum(measured) == 8, f"measurements go to both hosts: {measured}"
    async with cluster.client() as client:
        health = await gateway_health(client)
        assert health["workers_generation_ready"] == 1
        workers = (await client.get("/admin/workers", headers={"X-Internal-Token": cluster.token})).json()["workers"]
    assert [(w["checks"], w["inference_timeout_seconds"]) for w in workers] == [
        ({"disk": "ok", "comfyui": "down"}, 5), ({"disk": "ok", "comfyui": "ok"}, 5)
    ]  # fmt: skip
    families = await scrape(metrics_url)
    ready = {s.labels["worker"]: s.value for s in families["hairgate_worker_generation_ready"]}
    assert ready == {"0": 0, "1": 1}

    await up.configure(checks={"disk": "ok", "comfyui": "down"})

    async def none_ready() -> bool:
        async with cluster.client() as client:
            return (await gateway_health(client))["workers_generation_ready"] == 0

    await wait_until(none_ready, 10, "the second host's ComfyUI reported down")
    assert await jobs_by_host(lambda client, n: grow(client, f"both-{n}"), 4) == [2, 2], "as without the check"


@pytest.mark.slow  # log lines; the prober's unit tests check both in the default run
async def test_a_loading_host_is_info_and_a_timeout_without_margin_one_warning(cluster: Cluster) -> None:
    (fake,) = cluster.start_fakes(1)
    # the harness's gateway waits 10 s for a request: a 9.5 s host timeout leaves no 1 s margin
    await fake.configure(not_ready=True, inference_timeout_seconds=9.5)
    gateway = cluster.start_gateway()

    async def probed(times: int) -> bool:
        return (await fake.stats())["health_checks"] >= times

    await wait_until(lambda: probed(3), 10, "three probes of a loading host")
    log = gateway.log_text()
    assert "loading" in log and "探活失败" not in log
    await fake.configure(not_ready=False)
    checks = (await fake.stats())["health_checks"]
    await wait_until(lambda: probed(checks + 4), 10, "four more probes")
    warnings = [line for line in gateway.log_text().splitlines() if "推理超时未留余量" in line]
    assert len(warnings) == 1 and "worker=0" in warnings[0], warnings
