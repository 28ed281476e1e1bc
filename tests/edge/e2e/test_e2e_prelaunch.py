"""Seed 002 §5.4, the five checks before launch, against the real gateway and fake workers.

(a) 1,000 identical keyed requests → one job; (b) upstream answering 502 → no retry storm,
bad hosts ejected, every client answered; (c) out-of-range parameters refused in < 5 ms
without a worker; (d) a 4 MB upload → 1003 at once; (e) every request in the log with
every field. `scripts/prelaunch.py` runs the ones that are safe on a live system.
"""

from __future__ import annotations

import base64
import os
import subprocess
import sys
from typing import Any

import httpx
import pytest
import trio

from cluster.launcher import REPO_ROOT
from shared.contract import (
    HEADER_IDEMPOTENCY_KEY,
    HEADER_IDEMPOTENCY_REPLAYED,
    HEADER_REQUEST_ID,
    HEADER_RETRY_AFTER,
    Code,
)
from tests.edge.conftest import REQUEST_LOG_FIELDS
from tests.edge.e2e.harness import MEASURE, Cluster, measure, metrics_listener, scrape
from tests.fakes.fake_worker import PNG_BYTES
from tests.fakes.launch import FakeWorkerProcess

pytestmark = [pytest.mark.slow]

MARK = "/api/v1/hair/mark"
PRELAUNCH = REPO_ROOT / "scripts" / "prelaunch.py"
MAX_RETRIES = 1  # the harness's dispatch.max_retries
# gateway.md § Request log and stats: the one field list (conftest) with each field's type
LOG_FIELDS = {
    "ts": str,
    "request_id": str,
    "method": str,
    "path": str,
    "client_ip": str,
    "worker": (int, type(None)),
    "attempts": int,
    "queue_ms": (int, float),
    "duration_ms": (int, float),
    "http_status": int,
    "code": (int, type(None)),
    "bytes_in": int,
    "bytes_out": int,
    "idempotent_replay": bool,
    "rate_limited": bool,
    "early_refusal": bool,
    "failed_workers": list,  # indexes whose forward failed (docs/edge.md § What the logs say)
    "error_type": (str, type(None)),  # the last failure kind a host named
    "model_version": (str, type(None)),  # the answering host's model version
}


async def _jobs(fakes: list[FakeWorkerProcess]) -> int:
    return sum([len((await fake.stats())["jobs"]) for fake in fakes])


async def test_a_one_thousand_identical_keyed_requests_run_one_job(cluster: Cluster) -> None:
    fakes = cluster.start_fakes(2, latency_ms=500)
    cluster.start_gateway()
    answers: list[httpx.Response] = []
    limits = httpx.Limits(max_connections=200, max_keepalive_connections=200)
    async with cluster.client(limits=limits, timeout=60) as client, trio.open_nursery() as nursery:

        async def one() -> None:
            answers.append(await measure(client, headers={HEADER_IDEMPOTENCY_KEY: "one-thousand"}))

        for _ in range(1000):
            nursery.start_soon(one)
    assert len(answers) == 1000
    assert {a.content for a in answers} == {answers[0].content} and answers[0].json()["code"] == Code.OK
    assert sum(a.headers.get(HEADER_IDEMPOTENCY_REPLAYED) == "true" for a in answers) == 999
    assert await _jobs(fakes) == 1
    entries = await cluster.wait_for_log_entries(1000)
    assert sum(entry["idempotent_replay"] for entry in entries) == 999


async def test_b_upstream_answering_502_causes_no_retry_storm(cluster: Cluster) -> None:
    fakes = cluster.start_fakes(4, latency_ms=10)
    good, bad = fakes[:2], fakes[2:]
    for fake in bad:
        await fake.configure(fail_all=True, fail_status=502)
    edge, metrics_url = metrics_listener()
    cluster.start_gateway(edge={**edge, "health_check": {"cooldown_seconds": 1}})
    requests = 160
    answers: list[httpx.Response] = []
    async with cluster.client() as client, trio.open_nursery() as nursery:
        remaining = list(range(requests))

        async def client_loop() -> None:
            while remaining:
                remaining.pop()
                answers.append(await measure(client))

        for _ in range(16):
            nursery.start_soon(client_loop)

    assert len(answers) == requests, "every client answered"
    codes = [a.json()["code"] for a in answers]
    assert set(codes) <= {Code.OK, Code.SYSTEM_ERROR}
    assert all(HEADER_RETRY_AFTER in a.headers for a, code in zip(answers, codes, strict=True) if code != Code.OK)
    entries = await cluster.wait_for_log_entries(requests)
    assert max(entry["attempts"] for entry in entries) <= 1 + MAX_RETRIES, (
        "no request tried more than 1 + max_retries times"
    )
    assert await _jobs(fakes) == sum(entry["attempts"] for entry in entries), "no attempt the log does not show"
    failed_jobs = await _jobs(bad)
    assert codes.count(Code.SYSTEM_ERROR) <= failed_jobs / 2, "a request fails only when both its tries hit a bad host"
    assert all([len((await fake.stats())["jobs"]) > 0 for fake in good]), "the good hosts took the traffic"

    families = await scrape(metrics_url)
    ejections: dict[str, float] = {}
    for sample in families["hairgate_worker_ejections"]:
        if sample.name.endswith("_total"):
            ejections[sample.labels["worker"]] = ejections.get(sample.labels["worker"], 0) + sample.value
    assert ejections == {"2": len((await bad[0].stats())["jobs"]), "3": len((await bad[1].stats())["jobs"])}, (
        "every 502 ejected its host, and only the bad hosts were ejected"
    )
    assert failed_jobs < requests / 4, f"ejected hosts must not keep taking traffic: {failed_jobs} of {requests} jobs"


async def test_c_out_of_range_parameters_are_refused_at_the_edge(cluster: Cluster) -> None:
    """Refused by the gateway itself, no worker reached. How fast (gateway.md: < 5 ms p99) is
    a benchmark's claim, scripts/bench_request_checks.py, not a timed test: under the slow
    suite's load this one read 5.2 ms once."""
    (fake,) = cluster.start_fakes(1)
    cluster.start_gateway()
    image = base64.b64encode(PNG_BYTES).decode()
    bad = [
        (MARK, {"image_base64": image, "drop_mm": 1000}),
        (MEASURE, {"image_base64": image, "gender": "robot"}),
        (MARK, {"image_base64": image, "hairline_points": [[1, 2]]}),
    ] * 20
    async with cluster.client() as client:
        answers = [await client.post(path, json=body) for path, body in bad]
    assert [a.json()["code"] for a in answers] == [Code.INVALID_PARAMETER] * len(bad)
    assert await _jobs([fake]) == 0, "no worker saw a bad request"
    entries = await cluster.wait_for_log_entries(len(bad))
    assert all(entry["attempts"] == 0 for entry in entries), "refused before any dispatch"


async def test_d_a_four_megabyte_upload_is_refused_with_1003_at_once(cluster: Cluster) -> None:
    (fake,) = cluster.start_fakes(1)
    cluster.start_gateway()  # max_body_bytes: 2 MB
    photo = PNG_BYTES + os.urandom(4 * 1024 * 1024)
    async with cluster.client() as client:
        answer = await client.post(MEASURE, files={"image": ("photo.png", photo, "image/png")}, data={"gender": "male"})
        after = await measure(client)
    assert answer.status_code == 200
    assert answer.json()["code"] == Code.TOO_LARGE, answer.text
    assert after.json()["code"] == Code.OK, "the gateway serves on after the refusal"
    assert await _jobs([fake]) == 1, "only the small request reached a worker"
    refusal = (await cluster.wait_for_log_entries(2))[0]
    assert (refusal["code"], refusal["worker"], refusal["attempts"]) == (Code.TOO_LARGE, None, 0)
    # generous: the real number is in scripts/bench_admission_e2e.py; this only rules out reading 4 MB slowly
    assert refusal["duration_ms"] < 500


async def test_e_every_request_is_in_the_log_with_every_field(cluster: Cluster) -> None:
    assert set(LOG_FIELDS) == REQUEST_LOG_FIELDS, "a type for every field of the log's one list"
    (fake,) = cluster.start_fakes(1)
    cluster.start_gateway(edge={"rate_limit": {"enabled": True, "requests_per_minute": 1, "burst": 2}})
    sent: dict[str, dict[str, Any]] = {}  # request id → what the log must say

    async def send(request_id: str, client_ip: str, expect: dict[str, Any], **kwargs: Any) -> None:
        headers = {HEADER_REQUEST_ID: request_id, "X-Forwarded-For": client_ip, **kwargs.pop("headers", {})}
        response = await measure(client, headers=headers, **kwargs)
        sent[request_id] = {"code": response.json()["code"], **expect}

    plain = {"idempotent_replay": False, "rate_limited": False}
    key = {HEADER_IDEMPOTENCY_KEY: "e-1"}
    async with cluster.client() as client:
        await send("ok", "203.0.113.1", {**plain, "worker": 0, "attempts": 1})
        await send("stored", "203.0.113.2", {**plain, "worker": 0}, headers=key)
        await send("replay", "203.0.113.3", {**plain, "idempotent_replay": True}, headers=key)
        await send("limit-1", "203.0.113.4", plain)
        await send("limit-2", "203.0.113.4", plain)
        await send("limited", "203.0.113.4", {**plain, "rate_limited": True, "worker": None, "attempts": 0})
        await send("too-big", "203.0.113.5", {**plain, "worker": None, "attempts": 0}, content=b"x" * (3 * 1024 * 1024))
        await fake.configure(fail_all=True, fail_status=502)
        await send("failed", "203.0.113.6", {**plain, "worker": 0})
    assert sent["limited"]["code"] == Code.SYSTEM_ERROR and sent["too-big"]["code"] == Code.TOO_LARGE
    assert sent["failed"]["code"] == Code.SYSTEM_ERROR

    entries = await cluster.wait_for_log_entries(len(sent))
    assert sorted(entry["request_id"] for entry in entries) == sorted(sent), "one line per request, no more"
    for entry in entries:
        assert set(entry) == set(LOG_FIELDS), f"{entry['request_id']}: fields {sorted(set(entry) ^ set(LOG_FIELDS))}"
        for field, kind in LOG_FIELDS.items():
            assert isinstance(entry[field], kind), f"{entry['request_id']}: {field}={entry[field]!r}"
        assert (entry["method"], entry["path"], entry["http_status"]) == ("POST", MEASURE, 200)
        assert entry["client_ip"] and entry["bytes_out"] > 0 and entry["duration_ms"] >= 0 and entry["queue_ms"] >= 0
        expected = sent[entry["request_id"]]
        assert {key: entry[key] for key in expected} == expected, entry["request_id"]


async def test_attempts_in_the_log_count_only_workers_tried(cluster: Cluster) -> None:
    (fake,) = cluster.start_fakes(1)
    await fake.configure(fail_all=True, fail_status=502)
    cluster.start_gateway()
    async with cluster.client() as client:
        failed = await measure(client)
    assert failed.json()["code"] == Code.SYSTEM_ERROR
    (entry,) = await cluster.wait_for_log_entries(1)
    assert await _jobs([fake]) == 1
    assert entry["attempts"] == 1, "one worker tried; the retry found no other worker to try"


def _prelaunch(cluster: Cluster, *options: str) -> tuple[int, dict[str, str], str]:
    """Run scripts/prelaunch.py against the cluster's gateway: exit status, result per check, output."""
    assert cluster.gateway is not None
    command = [sys.executable, str(PRELAUNCH), "--gateway", cluster.gateway.url, *options]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    output = done.stdout + done.stderr
    results = {}
    for line in done.stdout.splitlines():
        name, _, rest = line.partition("  ")
        results[name.strip()] = rest.strip().split("  ")[0]
    return done.returncode, results, output


async def test_prelaunch_script_runs_the_live_checks(cluster: Cluster) -> None:
    (fake,) = cluster.start_fakes(1)
    cluster.start_gateway()
    _code, results, output = await trio.to_thread.run_sync(_prelaunch, cluster, "--secrets", str(cluster.secrets_path))
    assert cluster.token not in output
    expected = {"idempotency": "PASS", "oversize": "PASS", "request log": "PASS"}
    assert {name: results.get(name) for name in expected} == expected, output
    assert (results.get("retry storm"), results.get("1,000 identical")) == ("NOT RUN", "NOT RUN"), output
    assert len((await fake.stats())["jobs"]) <= 3, (
        "one job for the duplicates (+ parameters until the edge checks them)"
    )
    refused, results, output = await trio.to_thread.run_sync(_prelaunch, cluster, "--token", "wrong")
    assert (refused, results.get("admin/stats")) == (1, "FAIL"), output


async def test_prelaunch_script_passes_every_check(cluster: Cluster) -> None:
    (fake,) = cluster.start_fakes(1)
    cluster.start_gateway()
    code, results, output = await trio.to_thread.run_sync(_prelaunch, cluster, "--secrets", str(cluster.secrets_path))
    assert (code, results.get("parameters")) == (0, "PASS"), output
    assert len((await fake.stats())["jobs"]) == 1, "only the duplicates' one job reached a worker"
