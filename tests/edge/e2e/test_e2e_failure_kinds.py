"""Failure kinds on the real path (gateway.md § Failure kinds): `hairgate edge` in front of
real `hairgate gpu-host` processes whose model children raise a simulated kind (the default
run: one real host beside a fake worker; `slow`: two real hosts).

Each host reads its own switch file (`gpu_host.simulated_failures_file`): the real model
child takes one line per inference and raises what a GPU raises for that kind (torch's own
classes), so the child's classification, the host's answer, the gateway's table and the
client's headers all run for real on a CPU-only machine. What each host ran is read from
its log (one `request | …` line per job, with its time and kind).
"""

from __future__ import annotations

import json
import re
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path

import httpx
import pytest

from cluster.files import edit_settings
from cluster.launcher import REPO_ROOT, Process, free_port, hairgate_service
from shared.contract import HEADER_TOKEN
from tests.edge.e2e.harness import Cluster
from tests.gpu_host.processes import astronaut_png, cluster_files, start, wait_for

MASK = "/api/v1/hair/mask"
# One line per request a host answered (gpu_host/app.py): when it was logged, its time and kind.
HOST_JOB = re.compile(
    r"^(?P<at>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) .*request \| request_id=\S+ execution_id=\S+ endpoint=\S+ "
    r"status=(?P<status>\d+) code=(?P<code>\d+) ms=(?P<ms>\d+) bytes_out=\d+ error_type=(?P<kind>\S+)",
    re.MULTILINE,
)


def host_jobs(host: Process) -> list[Job]:
    """What a real host ran, from its log: one `request | …` line per job (a busy answer ran nothing)."""
    found = []
    for line in HOST_JOB.finditer(host.log_text()):
        if line["status"] == "503" and line["kind"] == "-":
            continue
        ended = datetime.strptime(line["at"], "%Y-%m-%d %H:%M:%S,%f").timestamp()
        found.append(Job(ended - int(line["ms"]) / 1000, ended, int(line["code"]), line["kind"]))
    return found


def switched_settings(settings: Path, switch: Path, own: Path) -> Path:
    """A copy of `settings` whose model child reads its failures from `switch` (a host's own)."""
    switch.write_text("")
    shutil.copy(settings, own)
    edit_settings(own, {"gpu_host": {"simulated_failures_file": str(switch)}})
    return own


def next_failures(switch: Path, *kinds: str) -> None:
    """The next inferences of the host reading `switch` raise these kinds, one each, in order."""
    switch.write_text("".join(f"{kind}\n" for kind in kinds))


@dataclass(frozen=True)
class Job:
    started: float  # seconds (epoch) the host began it
    ended: float
    code: int
    kind: str


@dataclass
class KindCluster:
    hosts: list[Process]
    switches: list[Path]
    gateway: Process
    directory: Path

    def jobs(self, index: int) -> list[Job]:
        return host_jobs(self.hosts[index])

    def next_failures(self, index: int, *kinds: str) -> None:
        next_failures(self.switches[index], *kinds)

    def logged(self, response: httpx.Response) -> dict:
        """The gateway's request-log line of `response` (written within a second: polled)."""
        request_id = response.json()["request_id"]
        path = self.directory / "request_log.jsonl"

        def line() -> dict | None:
            lines = path.read_text().splitlines() if path.exists() else []
            return next((entry for entry in map(json.loads, lines) if entry["request_id"] == request_id), None)

        found = self.gateway.poll_until(line, f"the request log's line of {request_id}", 10, interval_s=0.05)
        assert found is not None
        return found

    def stop(self) -> None:
        for process in [self.gateway, *self.hosts]:
            process.stop()
            print(f"--- {process.name} ---\n{process.log_text()[-3000:]}")


def start_kind_cluster(directory: Path, edge: dict | None = None) -> KindCluster:
    """Two real hosts, each with its own switch file, and a gateway (`edge`: its overrides)."""
    files = cluster_files(directory, hosts=2)
    hosts, switches = [], []
    for index, service in enumerate(files.hosts):
        switch = directory / f"failures-{index}.txt"
        own = switched_settings(files.settings_path, switch, directory / f"host-{index}.settings.toml")
        argv = [str(own) if arg == str(files.settings_path) else arg for arg in service.argv]
        hosts.append(start(replace(service, argv=argv), directory))
        switches.append(switch)
    # the gateway's file alone from here on (the hosts read their copies): its timeouts may be short
    # only if the hosts' section it also holds agrees (checked where one file holds both)
    edit_settings(files.settings_path, {"edge": edge or {}, "gpu_host": {"inference_timeout_seconds": 1}})
    running = KindCluster(hosts, switches, start(files.gateway, directory), directory)
    try:
        for host in hosts:
            wait_for(host, files.token, lambda r: r.status_code == 200, "host ready")
        wait_for(running.gateway, files.token, lambda r: r.json().get("workers_healthy") == 2, "both hosts online")
    except BaseException:
        running.stop()
        raise
    return running


@pytest.fixture
def kinds(tmp_path: Path) -> Iterator[KindCluster]:
    running = start_kind_cluster(tmp_path)
    try:
        yield running
    finally:
        running.stop()


def post_mask(client: httpx.Client) -> httpx.Response:
    return client.post(MASK, files={"image": ("astronaut.png", astronaut_png(), "image/png")})


# -- the default run: one real host (index 0) beside a fake worker ----------------------------


async def test_a_real_hosts_oom_rests_it_and_goes_elsewhere_a_rejected_photo_goes_nowhere(
    cluster: Cluster, tmp_path: Path
) -> None:
    switch = tmp_path / "failures.txt"
    settings = switched_settings(REPO_ROOT / "settings.toml", switch, tmp_path / "host.settings.toml")
    service = hairgate_service("gpu-host", "gpu-host", settings, cluster.secrets_path, free_port(), "/health")
    host = start(service, tmp_path)
    try:
        wait_for(host, cluster.token, lambda r: r.status_code == 200, "host ready")
        (fake,) = cluster.start_fakes(1)
        cluster.start_gateway(workers=[host.url, fake])  # the real host is worker 0: asked first
        async with cluster.client(timeout=60) as client:
            next_failures(switch, "cuda_oom")
            retried = await client.post(MASK, files={"image": ("a.png", astronaut_png(), "image/png")})
            health_after_oom = (await client.get("/gateway-health")).json()
            while len(host_jobs(host)) < 2:  # the host's next job: once its rest is over
                await client.post(MASK, files={"image": ("a.png", astronaut_png(), "image/png")})
            # the fake, idle the longest now, takes the next one; then the host is idle the longest
            await client.post(MASK, files={"image": ("a.png", astronaut_png(), "image/png")})
            fake_jobs_before = len((await fake.stats())["jobs"])
            next_failures(switch, "input_rejected")
            rejected = await client.post(MASK, files={"image": ("a.png", astronaut_png(), "image/png")})
            fake_jobs_after = len((await fake.stats())["jobs"])
            health_after_rejection = (await client.get("/gateway-health")).json()
    finally:
        host.stop()
        print(f"--- host ---\n{host.log_text()[-3000:]}")
    oom, after_rest, refusal = host_jobs(host)
    print(f"real host: OOM answered, next job {after_rest.started - oom.ended:.2f} s later (rest 2 s)")
    # OOM: retried on the fake (one job there), the host stays online and rests 2 s
    assert (oom.code, oom.kind) == (1007, "cuda_oom")
    assert retried.json()["code"] == 0 and retried.headers["X-Current-Load"] == "0.50"
    assert health_after_oom["workers_healthy"] == 2
    assert after_rest.started - oom.ended >= 1.9  # the gateway's rest begins after the host's log line
    # a photo the model cannot take: its own code to the client, no retry, nobody ejected
    assert (refusal.code, refusal.kind) == (1002, "input_rejected")
    assert rejected.json()["code"] == 1002 and fake_jobs_after == fake_jobs_before
    assert (rejected.headers["X-Error-Type"], rejected.headers["X-Retry-Policy"]) == ("input_rejected", "none")
    assert "Retry-After" not in rejected.headers
    assert health_after_rejection["workers_healthy"] == 2


# -- two real hosts (slow) ----------------------------------------------------------------------


@pytest.mark.slow
def test_oom_rests_the_host_and_retries_elsewhere_a_cuda_error_ejects_it(kinds: KindCluster) -> None:
    with httpx.Client(base_url=kinds.gateway.url, timeout=60) as client:
        # 1. host 0 runs out of GPU memory: the request goes to host 1; host 0 stays online
        kinds.next_failures(0, "cuda_oom")
        retried = post_mask(client)
        healthy_after_oom = client.get("/gateway-health").json()["workers_healthy"]
        # its next job comes once its 2 s rest is over: requests until it gets one
        while len(kinds.jobs(0)) < 2:
            post_mask(client)
        # 2. both hosts out of memory: no retry left, the client is told the kind and when
        kinds.next_failures(0, "cuda_oom")
        kinds.next_failures(1, "cuda_oom")
        refused = post_mask(client)
        # 3. a corrupted CUDA context: the host is ejected at once, the request served elsewhere.
        # Both rest after 2.; every /api/ answer says when that is over (a refusal's too).
        kinds.gateway.poll_until(
            lambda: client.post("/api/v1/no-such-endpoint").headers["X-Current-Load"] == "0.00",
            "both hosts' rests over",
            10,
            interval_s=0.05,
        )
        first_tried, other = kinds.logged(refused)["failed_workers"]  # given back first: idle the longest
        kinds.next_failures(first_tried, "cuda_error")
        jobs_before = [len(kinds.jobs(0)), len(kinds.jobs(1))]
        ejected = post_mask(client)
        after_ejection = client.get("/gateway-health").json()
        jobs_after = [len(kinds.jobs(0)), len(kinds.jobs(1))]
    first, second = kinds.jobs(0)[:2]
    rest = second.started - first.ended
    print(f"host 0: OOM answered, next job {rest:.2f} s later (rest 2 s)")
    body = retried.json()
    assert (body["code"], retried.headers.get("X-Error-Type")) == (0, None), body
    assert (first.code, first.kind) == (1007, "cuda_oom") and kinds.jobs(1)[0].kind == "-"
    assert healthy_after_oom == 2  # not ejected
    assert rest >= 1.9, rest  # the gateway's rest begins when it reads the answer, after the host's log line
    assert second.code == 0
    line = kinds.logged(retried)
    assert (line["attempts"], line["failed_workers"], line["error_type"]) == (2, [0], "cuda_oom")
    assert retried.headers["X-Current-Load"] == "0.50"  # host 0 rests: one of two online takes no job
    # no retry left: the last host's own answer, with the guidance
    refusal = refused.json()
    assert (refusal["code"], refusal["data"]) == (1007, {"error_type": "cuda_oom"}), refusal
    assert refused.headers["X-Error-Type"] == "cuda_oom"
    assert refused.headers["X-Retry-Policy"] == "exponential_backoff"
    # the soonest either may take a job: the first one's 2 s rest, less the second attempt's time
    assert refused.headers["Retry-After"] in ("1", "2"), refused.headers["Retry-After"]
    assert refused.headers["X-Current-Load"] == "1.00"
    # a CUDA error: that host out at once (for the cooldown), the request served by the other
    assert ejected.json()["code"] == 0 and "X-Error-Type" not in ejected.headers
    assert after_ejection["workers_healthy"] == 1
    assert kinds.jobs(first_tried)[-1].kind == "cuda_error" and kinds.jobs(other)[-1].code == 0
    assert [after - before for after, before in zip(jobs_after, jobs_before, strict=True)] == [1, 1]


@pytest.mark.slow
def test_a_host_past_its_deadline_backs_off_and_the_request_goes_elsewhere(tmp_path: Path) -> None:
    # the gateway gives each attempt 4 s: a host works 3.5 s on it (its margin), then says timeout
    kinds = start_kind_cluster(tmp_path, {"dispatch": {"request_timeout_seconds": 4}})
    try:
        with httpx.Client(base_url=kinds.gateway.url, timeout=60) as client:
            kinds.next_failures(0, "sleep:3.7")  # host 0's child takes 3.7 s: just past the deadline
            retried = post_mask(client)
            load_after = retried.headers["X-Current-Load"]
            while len(kinds.jobs(0)) < 2:  # host 0's next job, once its rest is over and its child free
                post_mask(client)
            line = kinds.logged(retried)
    finally:
        kinds.stop()
    late, following = kinds.jobs(0)[:2]
    rest = following.started - late.ended
    print(f"host 0: timeout after {late.ended - late.started:.2f} s, next job {rest:.2f} s later (rest 1 s)")
    assert (late.code, late.kind) == (1007, "timeout")
    assert 3.0 < late.ended - late.started < 4.0  # the deadline given, less the host's margin
    assert retried.json()["code"] == 0 and kinds.jobs(1)[0].code == 0
    assert (line["attempts"], line["failed_workers"], line["error_type"]) == (2, [0], "timeout")
    assert load_after == "0.50"  # host 0 rests; host 1 just answered
    # rested 1 s (0.5 x 2¹); its child, free 0.2 s after the timeout, was drained meanwhile
    assert 1.0 <= rest < 2.0, rest
    assert following.code == 0


@pytest.mark.slow
def test_a_host_whose_model_is_not_loaded_is_out_ten_seconds_and_back_once_it_loads(tmp_path: Path) -> None:
    # a slow prober (6 s): the gateway learns of the reload from the forward, not from a probe
    health_check = {"interval_seconds": 6, "unhealthy_threshold": 2}
    kinds = start_kind_cluster(tmp_path, {"health_check": health_check})
    token = re.search(r'shared_password = "([^"]+)"', (tmp_path / "secrets.toml").read_text())
    assert token is not None
    try:
        with (
            httpx.Client(base_url=kinds.gateway.url, timeout=60) as client,
            httpx.Client(base_url=kinds.hosts[0].url, headers={HEADER_TOKEN: token[1]}, timeout=5) as host,
        ):
            # host 0's child dies mid-inference, and its next start dies while loading
            kinds.next_failures(0, "exit", "load_fail")
            died = post_mask(client)  # the host's own 1007 (internal): passed on as before
            post_mask(client)  # host 1 (idle the longest)
            kinds.hosts[0].poll_until(
                lambda: "failed while loading" in host.get("/health").json().get("message", ""),
                "host 0's child failed a start",
                30,
                interval_s=0.05,
            )
            not_ready = post_mask(client)  # host 0 (idle the longest): 503 naming its kind
            out_at = time.monotonic()
            healthy_after = client.get("/gateway-health").json()["workers_healthy"]
            kinds.gateway.poll_until(
                lambda: client.get("/gateway-health").json()["workers_healthy"] == 2, "host 0 back", 60
            )
            back_after = time.monotonic() - out_at
            line = kinds.logged(not_ready)
    finally:
        kinds.stop()
    kind = line["error_type"]
    print(f"host 0 said {kind}; out {back_after:.1f} s (10 s, then the next ready probe)")
    assert (died.json()["code"], died.headers["X-Error-Type"]) == (1007, "internal")
    assert kind in ("model_load_failed", "model_not_loaded")  # failed a start; or already loading again
    assert not_ready.json()["code"] == 0 and (line["attempts"], line["failed_workers"]) == (2, [0])
    assert healthy_after == 1  # out at once, not after two failed probes
    assert back_after >= 9.9  # measured from the client's answer, a moment after the ejection
    errors = re.findall(r"ERROR edge\.api: 主机模型未就绪", kinds.gateway.log_text())
    assert len(errors) == 1
