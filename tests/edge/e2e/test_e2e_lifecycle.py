"""Start, stop and the edges of the request path of the real `hairgate edge` process."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import httpx
import pytest
import trio

from cluster.launcher import REPO_ROOT, child_env, free_port, hairgate_argv
from shared.contract import Code
from tests.edge.conftest import REQUEST_LOG_FIELDS
from tests.edge.e2e.harness import MEASURE, Cluster, measure, wait_until


def _run_edge(config: Path, secrets: Path) -> subprocess.CompletedProcess:
    command = [*hairgate_argv(), "edge", "--config", str(config), "--secrets", str(secrets)]
    command += ["--bind", f"127.0.0.1:{free_port()}"]
    return subprocess.run(command, cwd=REPO_ROOT, env=child_env(), capture_output=True, text=True, timeout=30)


@pytest.mark.slow
@pytest.mark.parametrize(
    "edge, settings_extra, secrets_text, named",
    [
        ({"dispatch": {"max_inflite": 3}}, "", None, "max_inflite"),
        ({}, "", "[auth]\n", "shared_password"),
        ({}, '[auth]\nshared_password = "in-the-committed-file"\n', None, "shared_password"),
        ({"health_check": {"interval_seconds": -1}}, "", None, "interval_seconds"),
    ],
    ids=["unknown-key", "no-password", "secret-in-settings", "bad-value"],
)
def test_invalid_settings_exit_non_zero_with_one_line_naming_the_key(
    cluster: Cluster, edge: dict, settings_extra: str, secrets_text: str | None, named: str
) -> None:
    config = cluster.write_settings([f"http://127.0.0.1:{free_port()}"], edge=edge)
    config.write_text(config.read_text() + "\n" + settings_extra)
    if secrets_text is not None:
        cluster.secrets_path.write_text(secrets_text)
    result = _run_edge(config, cluster.secrets_path)
    assert result.returncode != 0
    output = (result.stdout + result.stderr).strip()
    assert named in output, output
    assert "Traceback" not in output, output
    assert cluster.token not in output and "in-the-committed-file" not in output


@pytest.mark.slow
async def test_startup_log_counts_online_workers_and_primaries(cluster: Cluster) -> None:
    online_a, online_b, loading = cluster.start_fakes(3)
    (other_token,) = cluster.start_fakes(1, token="a-token-the-gateway-does-not-have")
    await loading.configure(not_ready=True)
    dead = f"http://127.0.0.1:{free_port()}"
    workers = [online_a, online_b, loading, other_token, dead]
    gateway = cluster.start_gateway(workers=workers, primary=[online_a, loading])
    match = gateway.wait_for_log(r"Worker 池初始化完成 \| 总数=(\d+) \| 在线=(\d+) \| 主worker=(\d+)", 1)
    assert match.groups() == ("5", "2", "2")
    assert (await other_token.stats())["unauthorized"] >= 1, "a 401 probe is a failed probe"
    assert gateway.log_text().count("Worker 池初始化完成") == 1


@pytest.mark.slow
async def test_sigterm_lets_requests_in_flight_finish_and_exits_0(cluster: Cluster) -> None:
    fakes = cluster.start_fakes(2)
    for fake in fakes:
        await fake.configure(hold=True)
    gateway = cluster.start_gateway()
    codes: list[int] = []
    async with cluster.client() as client, trio.open_nursery() as nursery:

        async def one() -> None:
            codes.append((await measure(client)).json()["code"])

        for _ in fakes:
            nursery.start_soon(one)

        async def both_running() -> bool:
            return [(await f.stats())["in_flight"] for f in fakes] == [1, 1]

        await wait_until(both_running, 5, "a request on each worker")
        gateway.terminate()

        async def refuses_new_connections() -> bool:
            try:
                async with httpx.AsyncClient(timeout=1) as fresh:
                    await fresh.get(f"{gateway.url}/health")
            except httpx.TransportError:
                return True
            return False

        try:
            await wait_until(refuses_new_connections, 5, "the gateway to stop accepting after SIGTERM")
        finally:
            for fake in fakes:
                await fake.configure(hold=False)
                await fake.release()
    assert codes == [Code.OK, Code.OK], "requests in flight at SIGTERM must complete"
    assert await trio.to_thread.run_sync(gateway.wait_exit, 15) == 0


@pytest.mark.slow
async def test_oversize_body_is_refused_without_touching_a_worker(cluster: Cluster) -> None:
    (fake,) = cluster.start_fakes(1)
    cluster.start_gateway(edge={"max_body_bytes": 65536})
    async with cluster.client() as client:
        json_type = {"Content-Type": "application/json"}
        by_length = await client.post(MEASURE, content=b"x" * 200_000, headers=json_type)

        async def chunks():
            for _ in range(50):
                yield b"y" * 8192

        chunked = await client.post(MEASURE, content=chunks(), headers=json_type)
        # A client that writes its whole (large) body before reading must still get the answer.
        huge = await client.post(MEASURE, content=b"z" * (8 * 1024 * 1024), headers=json_type)
        for response in (by_length, chunked, huge):
            assert response.status_code == 200, response.text
            body = response.json()
            assert (body["code"], body["data"]) == (Code.TOO_LARGE, None), body
            assert body["request_id"] == response.headers["X-Request-ID"]
        assert (await measure(client)).json()["code"] == Code.OK, "a small body still passes"
    assert len((await fake.stats())["jobs"]) == 1, "no oversize body reached the worker"


@pytest.mark.slow
async def test_request_log_has_api_requests_only_and_no_secret(cluster: Cluster) -> None:
    cluster.start_fakes(1)
    cluster.start_gateway()
    async with cluster.client() as client:
        for i in range(3):
            await measure(client, headers={"X-Request-ID": f"logged-{i}"})
        await client.get("/monitor")
        await client.get("/health")
        await client.post("/monitor/fault", json={"enabled": True}, headers={"X-Internal-Token": "wrong-guess"})

        async def three_lines() -> bool:
            return cluster.request_log.exists() and len(cluster.request_log.read_text().splitlines()) >= 3

        await wait_until(three_lines, 2, "three request-log lines within a second or so")
    text = cluster.request_log.read_text()
    records = [json.loads(line) for line in text.splitlines()]
    assert [r["request_id"] for r in records] == ["logged-0", "logged-1", "logged-2"]
    for record in records:
        assert set(record) >= REQUEST_LOG_FIELDS, sorted(record)
        assert record["path"] == MEASURE and record["code"] == 0 and record["worker"] == 0
    assert cluster.token not in text and "wrong-guess" not in text
    log = cluster.gateway.log_text()
    assert cluster.token not in log and "wrong-guess" not in log


@pytest.mark.slow
async def test_sighup_with_unchanged_settings_reloads_and_keeps_serving(cluster: Cluster) -> None:
    cluster.start_fakes(1)
    gateway = cluster.start_gateway()
    async with cluster.client() as client:
        gateway.reload()

        async def reloaded() -> bool:
            return "SIGHUP：配置已重新加载" in gateway.log_text()

        await wait_until(reloaded, 5, "the gateway to log the reload")
        assert "需重启网关" not in gateway.log_text(), "nothing changed: no restart-only warning"
        assert (await measure(client)).json()["code"] == Code.OK
    assert gateway.process.poll() is None


@pytest.mark.slow
async def test_sighup_swaps_workers_without_failing_a_request(cluster: Cluster) -> None:
    old, new = cluster.start_fakes(2)
    gateway = cluster.start_gateway(workers=[old])
    codes: list[int] = []
    stop = trio.Event()
    async with cluster.client() as client, trio.open_nursery() as nursery:

        async def steady_load() -> None:
            while not stop.is_set():
                codes.append((await measure(client)).json()["code"])

        nursery.start_soon(steady_load)
        cluster.write_settings(workers=[new])
        gateway.reload()

        async def new_worker_serves() -> bool:
            return bool((await new.stats())["jobs"])

        await wait_until(new_worker_serves, 10, "the worker added by SIGHUP to get traffic")
        stop.set()
    old_jobs = len((await old.stats())["jobs"])
    async with cluster.client() as client:
        for _ in range(3):
            assert (await measure(client)).json()["code"] == Code.OK
        health = (await client.get("/gateway-health")).json()
    assert codes and set(codes) == {Code.OK}, "no request may fail across a reload"
    assert (await new.stats())["probes_before_first_job"] >= 1, "a new worker is probed before it gets traffic"
    assert len((await old.stats())["jobs"]) == old_jobs, "a removed worker gets no new request"
    assert health["workers_total"] == 1
    assert gateway.process.poll() is None


@pytest.mark.slow
async def test_admin_stats_requires_the_token_and_counts_requests(cluster: Cluster) -> None:
    cluster.start_fakes(1)
    cluster.start_gateway()
    async with cluster.client() as client:
        for _ in range(3):
            await measure(client)
        assert (await client.get("/admin/stats")).status_code == 401
        assert (await client.get("/admin/stats", headers={"X-Internal-Token": "guess"})).status_code == 401

        async def three_counted() -> bool:
            stats = await client.get("/admin/stats", headers={"X-Internal-Token": cluster.token})
            return stats.status_code == 200 and "3" in stats.text and MEASURE in stats.text

        await wait_until(three_counted, 3, "/admin/stats to count the three measure requests")
