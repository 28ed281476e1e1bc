"""End to end, operations (issue 9): TLS on both hops, two gateways on one pool, token rotation.

One module-scoped pair of real GPU hosts serving HTTPS (model loading is the slow part);
each test starts its own gateways in front of them. The rotation test runs last: it
changes the pool's token.
"""

from __future__ import annotations

import re
import signal
import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import trio

from cluster.launcher import child_env
from shared.contract import HEADER_TOKEN, Code
from shared.secrets_file import read_secret
from tests.fakes.tls import tls_files
from tests.gpu_host.operations import (
    MEASURE,
    Gateway,
    Load,
    TlsPool,
    busy_answers,
    overlapping_jobs,
    rotate_argv,
    small_face_json,
    start_gateway,
    steady_load,
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsPool]:
    running = TlsPool.start(tmp_path_factory.mktemp("tls-pool"), 2)
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture
def gateways() -> Iterator[list[Gateway]]:
    started: list[Gateway] = []
    try:
        yield started
    finally:
        for gateway in started:
            gateway.process.kill()
            print(f"--- {gateway.process.name} log ---\n{gateway.process.log_text()[-4000:]}")


def test_https_client_through_an_https_gateway_to_https_hosts(pool: TlsPool, gateways: list[Gateway]) -> None:
    gateways.append(start_gateway(pool, "gateway-tls"))
    gateway = gateways[0]
    with httpx.Client(base_url=gateway.url, verify=pool.verify(), timeout=60) as client:
        body = client.post(MEASURE, json=small_face_json()).json()
        image = client.get(body["data"]["annotated_image_url"]) if body["code"] == Code.OK else None
        health = client.get("/gateway-health").json()
    stranger_ca = ssl.create_default_context(cafile=str(tls_files(pool.directory / "stranger").ca_file))
    with (
        httpx.Client(verify=stranger_ca) as stranger,
        pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"),
    ):
        stranger.get(gateway.url + "/gateway-health")
    assert body["code"] == Code.OK, body
    assert body["data"]["annotated_image_url"].startswith(gateway.url + "/")
    assert image is not None and image.status_code == 200
    assert health["workers_healthy"] == 2
    served = [len([line for line in pool.request_lines(i) if line["status"] == "200"]) for i in range(2)]
    assert sum(served) >= 1, "the request went to a real host over HTTPS"


def test_wrong_ca_keeps_every_host_offline_and_names_the_certificate_problem(
    pool: TlsPool, gateways: list[Gateway]
) -> None:
    wrong = tls_files(pool.directory / "wrong-ca", "wrong")
    gateways.append(start_gateway(pool, "gateway-wrong-ca", ca_file=wrong.ca_file, wait_online=0))
    gateway = gateways[0]
    with httpx.Client(base_url=gateway.url, verify=pool.verify(), timeout=30) as client:
        health = client.get("/gateway-health").json()
        body = client.post(MEASURE, json=small_face_json()).json()  # answered, never a hang
    # one warning per host, once its probes failed `unhealthy_threshold` times in a row
    warning = gateway.process.wait_for_log(r"(?m)^.*WARNING.*worker=1.*$", 30).group(0)
    with httpx.Client(base_url=gateway.url, verify=pool.verify(), timeout=30) as client:
        later = client.get("/gateway-health").json()
    assert health["workers_healthy"] == later["workers_healthy"] == 0 and health["workers_total"] == 2
    assert body["code"] == Code.SYSTEM_ERROR
    assert re.search(r"certificate verify failed", warning, re.IGNORECASE), warning


def test_two_gateways_share_two_hosts_under_load(pool: TlsPool, gateways: list[Gateway]) -> None:
    before = [len(pool.request_lines(i)) for i in range(2)]
    gateways.extend(start_gateway(pool, f"gateway-peer-{n}") for n in range(2))
    loads = [Load() for _ in gateways]
    offline_seen: list[str] = []

    async def run() -> None:
        stop = trio.Event()
        async with trio.open_nursery() as nursery:
            for gateway, load in zip(gateways, loads, strict=True):
                for _ in range(2):  # two clients per gateway: four requests for two hosts
                    nursery.start_soon(steady_load, gateway.url, pool.verify(), small_face_json(), stop, load, 5)
            nursery.start_soon(_watch_health, gateways, pool, stop, offline_seen)
            await trio.sleep(20)  # the load's duration, not a synchronisation
            stop.set()

    trio.run(run)
    lines = [pool.request_lines(i)[before[i] :] for i in range(2)]
    for load in loads:
        assert load.failures == [] and load.count >= 20, (load.failures[:5], load.count)
    assert offline_seen == [], offline_seen
    assert [overlapping_jobs(host) for host in lines] == [0, 0]
    jobs = sum(1 for host in lines for line in host if line["status"] == "200")
    assert jobs == sum(len(load.codes) for load in loads), "every answer came from exactly one host job"
    print(
        f"two gateways: {[load.count for load in loads]} requests, host jobs {jobs}, "
        f"busy answers {[busy_answers(host) for host in lines]}"
    )


async def _watch_health(gateways: list[Gateway], pool: TlsPool, stop: trio.Event, offline: list[str]) -> None:
    async with httpx.AsyncClient(verify=pool.verify(), timeout=10) as client:
        while not stop.is_set():
            for gateway in gateways:
                health = (await client.get(gateway.url + "/gateway-health")).json()
                if health["workers_healthy"] != len(pool.hosts):
                    offline.append(f"{gateway.process.name}: {health}")
            await trio.sleep(0.2)


def test_token_rotation_under_load_then_interrupted_and_resumed(pool: TlsPool, gateways: list[Gateway]) -> None:
    gateways.append(start_gateway(pool, "gateway-rotate"))
    gateway = gateways[0]
    original = pool.token
    load = Load()
    outputs: list[str] = []

    async def rotate_under_load() -> None:
        stop = trio.Event()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(steady_load, gateway.url, pool.verify(), small_face_json(), stop, load, 10)
            started = trio.current_time()
            done = await trio.run_process(
                rotate_argv(gateways, gateway.secrets_path, pool.tls.ca_file), capture_stdout=True, env=child_env(),
                check=False,
            )  # fmt: skip
            outputs.append(done.stdout.decode())
            print(
                f"rotation: {trio.current_time() - started:.1f} s, {load.count} requests, {len(load.failures)} failed"
            )
            assert done.returncode == 0, outputs[-1]
            stop.set()

    trio.run(rotate_under_load)
    first = _secret(gateway.secrets_path)
    assert load.failures == [] and load.count >= 10, (load.failures[:5], load.count)
    assert first != original

    # Interrupted after the gateways were switched: the same command, again, completes.
    argv = rotate_argv(gateways, gateway.secrets_path, pool.tls.ca_file)
    with subprocess.Popen(argv, stdout=subprocess.PIPE, env=child_env(), text=True) as interrupted:
        seen = ""
        assert interrupted.stdout is not None
        for line in interrupted.stdout:
            seen += line
            if line.startswith("[5/"):
                interrupted.send_signal(signal.SIGKILL)
                break
    outputs.append(seen)
    assert "switched to" in seen, seen
    resumed = subprocess.run(argv, capture_output=True, env=child_env(), text=True)
    outputs.append(resumed.stdout + resumed.stderr)
    assert resumed.returncode == 0, outputs[-1]
    assert "already sends" in resumed.stdout
    final = _secret(gateway.secrets_path)
    assert final not in (first, original)

    _assert_only(final, [original, first], pool, gateway)
    # Restarted services read their secrets files: still only the final token.
    pool.restart(0)
    pool.wait_ready(pool.hosts[0], final)
    gateway.process.stop()
    gateways[0] = restarted = start_gateway_again(gateway, pool)
    _assert_only(final, [original, first], pool, restarted)

    logs = [host.log_text() for host in pool.hosts] + [gateway.process.log_text(), restarted.process.log_text()]
    for token in (original, first, final):
        for text in outputs + logs:
            assert token not in text, "a raw token in an output or a log"
    print("\n".join(outputs))


def _secret(path: Path) -> str:
    token = read_secret(path, "auth.shared_password")
    assert isinstance(token, str)
    return token


def _assert_only(token: str, old: list[str], pool: TlsPool, gateway: Gateway) -> None:
    with httpx.Client(verify=pool.verify(), timeout=10) as client:
        for url in [*pool.urls, gateway.url]:
            path = "/admin/tokens" if url in pool.urls else "/admin/workers"
            assert client.get(url + path, headers={HEADER_TOKEN: token}).status_code == 200, url
            for stale in old:
                assert client.get(url + path, headers={HEADER_TOKEN: stale}).status_code == 401, url


def start_gateway_again(gateway: Gateway, pool: TlsPool) -> Gateway:
    from tests.gpu_host.processes import start

    process = start(gateway.process.service, gateway.settings_path.parent)
    restarted = Gateway(process, gateway.settings_path, gateway.secrets_path, gateway.log_path)
    with httpx.Client(verify=pool.verify(), timeout=5) as client:
        process.poll_until(
            lambda: client.get(restarted.url + "/gateway-health").json()["workers_healthy"] == len(pool.hosts),
            "every host online",
            60,
            0.1,
        )
    return restarted
