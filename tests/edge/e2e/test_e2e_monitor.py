"""/health, /gateway-health, /monitor and the alert drill (seed 001 §4, §9) on the real gateway."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import httpx
import pytest

from cluster.launcher import REPO_ROOT, Service, free_port, start
from shared.contract import Code
from tests.edge.e2e.harness import MONITOR_KEYS, Cluster, measure, wait_until

DRILL_SCRIPT = REPO_ROOT / "scripts" / "drill_monitor.py"

MALFORMED_BODIES = [
    ('{"enabled": "true"}', "string"),
    ('{"enabled": 1}', "number"),
    ('{"enabled": null}', "null"),
    ("{}", "missing"),
    ('{"enabled": true, "extra": 1}', "extra-key"),
    ('{"enabled": tru', "malformed"),
    ("true", "bare-boolean"),
    ('[{"enabled": true}]', "array"),
    ("", "empty"),
]


async def _fault(client: httpx.AsyncClient, body: str, token: str | None) -> httpx.Response:
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["X-Internal-Token"] = token
    return await client.post("/monitor/fault", content=body.encode(), headers=headers)


async def test_monitor_shapes_and_the_drill_switch(cluster: Cluster) -> None:
    cluster.start_fakes(2)
    cluster.start_gateway()
    # One keep-alive connection for everything, as a monitoring client would hold it.
    async with cluster.client(timeout=5) as client:
        assert (await client.get("/health")).json() == {"status": "ok", "service": "gateway"}
        health = (await client.get("/gateway-health")).json()
        assert {k: health[k] for k in ("workers_total", "workers_healthy", "workers_busy")} == {
            "workers_total": 2,
            "workers_healthy": 2,
            "workers_busy": 0,
        }
        ok = await client.get("/monitor")
        assert ok.status_code == 200
        assert ok.json() == {
            "status": "ok",
            "service": "gateway",
            "workers_total": 2,
            "workers_healthy": 2,
            "workers_primary_total": 2,
            "workers_primary_healthy": 2,
        }

        # The token is checked first: a missing or wrong one changes nothing.
        assert (await _fault(client, '{"enabled": true}', None)).status_code == 401
        assert (await _fault(client, '{"enabled": true}', "wrong-token")).status_code == 401
        assert (await client.get("/monitor")).status_code == 200
        for body, _ in MALFORMED_BODIES:
            response = await _fault(client, body, cluster.token)
            assert response.status_code == 400, f"body {body!r} answered {response.status_code}"
        assert (await client.get("/monitor")).status_code == 200, "a 400 must leave the switch off"

        on = await _fault(client, '{"enabled": true}', cluster.token)
        assert on.status_code == 200
        assert on.json()["status"] == "ok" and on.json()["simulated"] is True
        assert isinstance(on.json()["message"], str) and on.json()["message"]
        drill = await client.get("/monitor")
        assert drill.status_code == 503
        body = drill.json()
        assert set(body) == MONITOR_KEYS | {"simulated", "message"}
        assert body["status"] == "unhealthy" and body["simulated"] is True
        assert body["message"].startswith("模拟故障")
        assert (body["workers_healthy"], body["workers_primary_healthy"]) == (2, 2), "the drill shows real counts"
        assert (await measure(client)).json()["code"] == Code.OK, "dispatch is unaffected by the drill"

        assert (await _fault(client, '{"enabled": false}', "wrong-token")).status_code == 401
        assert (await _fault(client, '{"enabled": "false"}', cluster.token)).status_code == 400
        assert (await client.get("/monitor")).status_code == 503, "a refused request leaves the drill on"

        off = await _fault(client, '{"enabled": false}', cluster.token)
        assert off.status_code == 200
        assert off.json()["status"] == "ok" and off.json()["simulated"] is False
        after = await client.get("/monitor")
        assert after.status_code == 200 and set(after.json()) == MONITOR_KEYS


def _run_drill(gateway_url: str, *options: str, timeout_s: float = 60) -> subprocess.CompletedProcess:
    command = [sys.executable, str(DRILL_SCRIPT), "--gateway", gateway_url, *options]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)


def test_drill_script_passes_and_leaves_the_switch_off(cluster: Cluster) -> None:
    cluster.start_fakes(1)
    gateway = cluster.start_gateway()
    result = _run_drill(gateway.url, "--secrets", str(cluster.secrets_path), "--wait", "0.2")
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert [f"[{n}/5]" in output for n in range(1, 6)] == [True] * 5
    assert cluster.token not in output
    assert httpx.get(f"{gateway.url}/monitor").status_code == 200


@pytest.mark.slow
def test_drill_script_fails_on_a_refused_token_an_unreachable_gateway_or_a_real_outage(cluster: Cluster) -> None:
    cluster.start_fakes(1)
    gateway = cluster.start_gateway()
    refused = _run_drill(gateway.url, "--token", "not-the-token", "--wait", "0")
    assert refused.returncode == 1 and "401" in refused.stdout, refused.stdout
    assert "not-the-token" not in refused.stdout + refused.stderr
    assert httpx.get(f"{gateway.url}/monitor").status_code == 200

    unreachable = _run_drill(f"http://127.0.0.1:{free_port()}", "--token", cluster.token, "--wait", "0")
    assert unreachable.returncode == 1, unreachable.stdout

    cluster.fakes[0].kill()
    deadline = time.monotonic() + 10
    while httpx.get(f"{gateway.url}/monitor").status_code != 503:
        assert time.monotonic() < deadline, "/monitor never turned 503 after the only worker died"
        time.sleep(0.05)
    real_outage = _run_drill(gateway.url, "--token", cluster.token, "--wait", "0")
    assert real_outage.returncode == 1 and "[1/5]" not in real_outage.stdout, real_outage.stdout
    assert "simulated" not in httpx.get(f"{gateway.url}/monitor").json(), "no drill during a real outage"


@pytest.mark.slow
def test_drill_script_turns_the_switch_off_when_interrupted(cluster: Cluster) -> None:
    cluster.start_fakes(1)
    gateway = cluster.start_gateway()
    command = [sys.executable, str(DRILL_SCRIPT), "--gateway", gateway.url, "--secrets", str(cluster.secrets_path)]
    command += ["--wait", "60"]
    with start(Service("drill", command, url=""), cluster.directory / "drill.log") as drill:
        drill.wait_for_log(r"(?m)^\[4/5\]", 60)  # the step-4 line says the drill is on and waiting
        assert httpx.get(f"{gateway.url}/monitor").status_code == 503, drill.log_text()
        assert drill.stop(signal.SIGINT, grace_s=15) == 130
    assert httpx.get(f"{gateway.url}/monitor").status_code == 200, "the script must turn the drill off on exit"


@pytest.mark.slow
async def test_monitor_503_when_no_worker_ever_came_online(cluster: Cluster) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    (loading,) = cluster.start_fakes(1)
    await loading.configure(not_ready=True)
    gateway = cluster.start_gateway(workers=[loading, dead], primary=[loading])
    counts = gateway.wait_for_log(r"Worker 池初始化完成 \| 总数=(\d+) \| 在线=(\d+) \| 主worker=(\d+)", 1)
    assert counts.groups() == ("2", "0", "1")
    async with cluster.client() as client:
        monitor = await client.get("/monitor")
        assert monitor.status_code == 503
        assert monitor.json() == {
            "status": "unhealthy",
            "service": "gateway",
            "workers_total": 2,
            "workers_healthy": 0,
            "workers_primary_total": 1,
            "workers_primary_healthy": 0,
            "message": "没有可用的 worker",
        }
        on = await _fault(client, '{"enabled": true}', cluster.token)
        assert on.status_code == 200
        drill = (await client.get("/monitor")).json()
        assert drill["simulated"] is True and drill["message"].startswith("模拟故障")
        assert "没有可用的 worker" in drill["message"], "a real outage during a drill must be stated"
        assert "127.0.0.1" not in monitor.text + (await client.get("/gateway-health")).text, "no worker addresses"

        await loading.configure(not_ready=False)

        async def came_online() -> bool:
            return (await client.get("/gateway-health")).json()["workers_healthy"] == 1

        await wait_until(came_online, 10, "the loading worker to come online")
    assert "下线" not in gateway.log_text(), "a worker that was never online logs no offline warning"
