"""The served /openapi.json, checked from outside: Schemathesis against a real dev cluster.

A real GPU host (the real analysis, on this machine's CPU) behind the real gateway, as
`hairgate dev` starts them; Schemathesis (its CLI, as a client developer would run it) reads
the document from the gateway and sends every operation positive and negative cases in its
coverage and fuzzing phases, with all of its checks — server errors, status codes, content
types, response schemas and headers, missing headers — except the two that assume refusals
are HTTP 4xx, replaced by the envelope's checks in `schemathesis_hooks` (contract.md § The
contract as a document). Its response-time limit is a hang's bound, not a latency claim
(those are benchmarks', scripts/bench_*.py). Any finding fails the test; its report then ends
with the gateway's slowest requests, from its request log. Bounded (30 examples per operation, a
fixed seed) to stay under 3 minutes on a 2-core machine.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from PIL import Image
from skimage import data

from cluster.launcher import REPO_ROOT, Process
from tests.gpu_host.processes import cluster_files, start, wait_for

EXAMPLES_PER_OPERATION = 30
SEED = 20261202
RUN_TIMEOUT_SECONDS = 300
# `--checks all` limits each response to 10 s; the slowest here take under 1 s (1.2 s before
# the face workers imported the analysis at their start), yet one in a CI run's 565 took longer than 10 s and
# nothing then said why (hence the slowest requests in a failure's report). 30 s, the
# gateway's queue wait, still fails a request left waiting for a host.
RESPONSE_LIMIT_SECONDS = 30


@pytest.fixture(scope="module")
def cluster_directory(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("openapi-cluster")


@pytest.fixture(scope="module")
def gateway_url(cluster_directory: Path) -> Iterator[str]:
    files = cluster_files(cluster_directory, hosts=1)
    processes: list[Process] = []
    try:
        host = start(files.hosts[0], cluster_directory)
        processes.append(host)
        gateway = start(files.gateway, cluster_directory)
        processes.append(gateway)
        wait_for(host, files.token, lambda response: response.status_code == 200, "the GPU host's models loaded")
        with httpx.Client(timeout=5) as client:
            gateway.poll_until(
                lambda: client.get(f"{files.gateway_url}/monitor").status_code == 200,
                "the gateway sees the host online",
                60,
            )
        yield files.gateway_url
    finally:
        for process in reversed(processes):
            process.stop()


def slowest_requests(request_log: Path, count: int = 5) -> str:
    """The gateway's `count` slowest requests, as its request log has them: why a run was slow
    (read only when an assertion's message is: on failure)."""
    rows = [json.loads(line) for line in request_log.read_text().splitlines()]
    rows.sort(key=lambda row: row["duration_ms"], reverse=True)
    return "the gateway's slowest requests:\n" + "\n".join(json.dumps(row) for row in rows[:count])


def test_schemathesis_finds_nothing_in_the_served_document(
    gateway_url: str, cluster_directory: Path, tmp_path: Path
) -> None:
    photo = tmp_path / "face.jpg"
    face = Image.fromarray(data.astronaut())  # a real frontal face, 512x512: ~1 s an endpoint on a CPU
    buffer = io.BytesIO()
    face.save(buffer, "JPEG", quality=85)
    photo.write_bytes(buffer.getvalue())
    faceless = tmp_path / "wall.jpg"
    Image.new("RGB", face.size, (128, 120, 110)).save(faceless, "JPEG", quality=85)  # the same size: points inside both
    # Without CI=…: Hypothesis loads its "ci" profile there (derandomized, no too-slow health
    # check), a different and much longer run than the seeded one this test bounds (a fresh-clone
    # .ci/run went past the time limit with it; the same seed ran in 40-136 s without it).
    environment = {
        **{name: value for name, value in os.environ.items() if name != "CI"},
        "PYTHONPATH": str(REPO_ROOT),
        "SCHEMATHESIS_HOOKS": "tests.edge.e2e.schemathesis_hooks",
        "HAIRGATE_OPENAPI_PHOTO": str(photo),
        "HAIRGATE_OPENAPI_PHOTO_SIZE": f"{face.width}x{face.height}",
        "HAIRGATE_OPENAPI_FACELESS": str(faceless),
    }
    command = [
        str(Path(sys.executable).with_name("schemathesis")),
        "run",
        f"{gateway_url}/openapi.json",
        "--checks",
        "all",
        "--exclude-checks",
        "negative_data_rejection,unsupported_method",
        "--max-response-time",
        str(RESPONSE_LIMIT_SECONDS),
        "--max-examples",
        str(EXAMPLES_PER_OPERATION),
        "--seed",
        str(SEED),
        "--workers",
        "1",
        "--request-timeout",
        "60",
        "--no-color",
    ]
    run = subprocess.run(
        command, cwd=tmp_path, env=environment, capture_output=True, text=True, timeout=RUN_TIMEOUT_SECONDS
    )
    report = run.stdout + run.stderr
    assert run.returncode == 0, f"{report[-20000:]}\n{slowest_requests(cluster_directory / 'request_log.jsonl')}"
    assert "Selected: 7/7" in report and "Tested: 7" in report, report[-3000:]  # every operation
    assert "No issues found" in report or "passed" in report, report[-3000:]
