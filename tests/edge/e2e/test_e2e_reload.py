"""SIGHUP reload of the real gateway under continuous load: workers added and removed in one
reload, invalid settings kept out with one error line, a restart-only key kept with one warning."""

from __future__ import annotations

import pytest
import trio

from shared.contract import Code
from tests.edge.e2e.harness import Cluster, gateway_health, measure, wait_until
from tests.fakes.launch import FakeWorkerProcess

RELOADED = "SIGHUP：配置已重新加载"
INVALID = "SIGHUP：新配置无效"
RESTART_ONLY = "SIGHUP：以下配置需重启网关才能生效"

pytestmark = pytest.mark.slow


async def _under_load(cluster: Cluster, codes: list[int], stop: trio.Event) -> None:
    async with cluster.client() as client:
        while not stop.is_set():
            codes.append((await measure(client)).json()["code"])


async def _jobs(fake: FakeWorkerProcess) -> int:
    return len((await fake.stats())["jobs"])


async def test_sighup_adds_two_workers_and_removes_one_under_load(cluster: Cluster) -> None:
    kept, removed, added_a, added_b = cluster.start_fakes(4, latency_ms=20)
    gateway = cluster.start_gateway(workers=[kept, removed])
    codes: list[int] = []
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        for _ in range(3):
            nursery.start_soon(_under_load, cluster, codes, stop)

        async def removed_serves() -> bool:
            return await _jobs(removed) > 0

        await wait_until(removed_serves, 10, "load on the worker about to be removed")
        cluster.write_settings(workers=[kept, added_a, added_b])
        gateway.reload()

        async def added_serve() -> bool:
            return await _jobs(added_a) > 0 and await _jobs(added_b) > 0

        await wait_until(added_serve, 10, "both added workers to get traffic")
        removed_jobs = await _jobs(removed)
        more = len(codes) + 30

        async def thirty_more() -> bool:
            return len(codes) >= more

        await wait_until(thirty_more, 20, "30 more requests after the reload")
        stop.set()
    async with cluster.client() as client:
        health = await gateway_health(client)
    assert codes and set(codes) == {Code.OK}, "no request may fail across a reload"
    assert await _jobs(removed) == removed_jobs, "a removed worker gets nothing new"
    assert health["workers_total"] == 3
    assert gateway.log_text().count(RELOADED) == 1
    assert [(await fake.stats())["overlaps"] for fake in cluster.fakes] == [0, 0, 0, 0]


async def test_invalid_settings_on_sighup_keep_serving_with_one_error_line(cluster: Cluster) -> None:
    first, other = cluster.start_fakes(2)
    gateway = cluster.start_gateway(workers=[first])
    codes: list[int] = []
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_under_load, cluster, codes, stop)
        cluster.write_settings(workers=[other], edge={"health_check": {"interval_seconds": -1}})
        gateway.reload()

        async def error_logged() -> bool:
            return INVALID in gateway.log_text()

        await wait_until(error_logged, 10, "the gateway to log the invalid settings")
        before = len(codes)

        async def still_serving() -> bool:
            return len(codes) >= before + 10

        await wait_until(still_serving, 10, "requests after the failed reload")
        stop.set()
    log = gateway.log_text()
    (line,) = [line for line in log.splitlines() if INVALID in line]
    assert "interval_seconds" in line, line
    assert RELOADED not in log
    assert set(codes) == {Code.OK}
    assert await _jobs(other) == 0, "the old worker list stays"
    assert gateway.process.poll() is None


async def test_restart_only_key_keeps_its_value_with_one_warning_and_the_rest_applies(cluster: Cluster) -> None:
    first, added = cluster.start_fakes(2)
    gateway = cluster.start_gateway(workers=[first])
    moved_log = cluster.directory / "moved" / "request_log.jsonl"
    cluster.write_settings(workers=[first, added], edge={"request_log": str(moved_log)})
    gateway.reload()

    async def reloaded() -> bool:
        return RELOADED in gateway.log_text()

    await wait_until(reloaded, 10, "the reload line")
    async with cluster.client() as client:

        async def added_serves() -> bool:
            return (await measure(client)).json()["code"] == Code.OK and await _jobs(added) > 0

        await wait_until(added_serves, 10, "the added worker to serve")
    await cluster.wait_for_log_entries(1)
    (warning,) = [line for line in gateway.log_text().splitlines() if RESTART_ONLY in line]
    assert "edge.request_log" in warning
    assert not moved_log.exists(), "the request log stays where it was opened"
