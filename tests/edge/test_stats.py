"""`/admin/stats` aggregates (gateway.md § Request log and stats): exact shape, windows, bounds."""

from __future__ import annotations

import pickle
import random
import statistics

import pytest

from edge.observe.request_log import RequestRecord
from edge.observe.stats import EXACT_SAMPLES, OTHER_PATHS, RequestStats
from shared.contract.endpoints import api_paths

KNOWN = api_paths()
START = 1_796_112_000.0  # 2026-12-01T08:00:00Z
MEASURE = "/api/v1/hair/measure"
GROW = "/api/v1/hair/grow"


def entry(
    path: str = MEASURE,
    code: int | None = 0,
    worker: int | None = 0,
    duration_ms: float = 100.0,
    queue_ms: float = 0.1,
    http_status: int = 200,
    replay: bool = False,
    limited: bool = False,
) -> RequestRecord:
    return RequestRecord(
        ts="2026-12-01T08:00:00Z", request_id="r", method="POST", path=path, client_ip="127.0.0.1", worker=worker,
        attempts=1, queue_ms=queue_ms, duration_ms=duration_ms, http_status=http_status, code=code, bytes_in=1,
        bytes_out=1, idempotent_replay=replay, rate_limited=limited,
    )  # fmt: skip


EMPTY_WINDOW = {
    "requests": 0,
    "by_path": {},
    "by_worker": {},
    "queue_wait_ms": {"p50": None, "p99": None, "max": None},
    "queue_wait_ms_by_class": {name: {"p50": None, "p99": None, "max": None} for name in ("fast", "slow")},
    "replays": 0,
    "rate_limited": 0,
}


def test_nothing_recorded_gives_null_percentiles() -> None:
    assert RequestStats(started_at=START).snapshot(START + 5) == {
        "since_start": EMPTY_WINDOW,
        "last_hour": EMPTY_WINDOW,
        "started_at": "2026-12-01T08:00:00Z",
    }


def test_the_spec_example_shape_and_counts() -> None:
    stats = RequestStats(started_at=START)
    now = START + 10
    for _ in range(60):
        stats.record(entry(worker=0, duration_ms=160.0), now)
    for _ in range(37):
        stats.record(entry(worker=1, duration_ms=160.0), now)
    stats.record(entry(worker=0, code=1007, http_status=502), now)  # the worker broke
    stats.record(entry(worker=None, code=1007, http_status=503), now)  # no worker: gateway-made
    stats.record(entry(worker=None, code=1007, http_status=429, limited=True), now)
    stats.record(entry(path=GROW, worker=None, code=0, replay=True), now)
    window = stats.snapshot(now)["since_start"]
    assert window["requests"] == 101
    assert window["by_path"][MEASURE]["count"] == 100
    assert window["by_path"][MEASURE]["codes"] == {"0": 97, "1007": 3}
    assert set(window["by_path"][MEASURE]["latency_ms"]) == {"p50", "p95", "p99", "max"}
    assert window["by_path"][MEASURE]["latency_ms"]["p50"] == pytest.approx(160.0, rel=0.01)
    assert window["by_worker"] == {"0": {"served": 60, "failed": 1}, "1": {"served": 37, "failed": 0}}
    assert set(window["queue_wait_ms"]) == {"p50", "p99", "max"}
    assert (window["replays"], window["rate_limited"]) == (1, 1)
    assert stats.snapshot(now)["last_hour"] == window


def test_percentiles_are_within_one_percent() -> None:
    chance = random.Random(2)
    latencies = [chance.lognormvariate(5, 0.6) for _ in range(5000)]
    waits = [chance.expovariate(0.05) for _ in range(5000)]
    stats = RequestStats(started_at=START)
    for latency, wait in zip(latencies, waits, strict=True):
        stats.record(entry(duration_ms=latency, queue_ms=wait), START + 1)
    window = stats.snapshot(START + 1)["since_start"]
    exact = statistics.quantiles(latencies, n=100, method="inclusive")
    for name, index in (("p50", 49), ("p95", 94), ("p99", 98)):
        assert window["by_path"][MEASURE]["latency_ms"][name] == pytest.approx(exact[index], rel=0.02), name
    assert window["queue_wait_ms"]["p99"] == pytest.approx(statistics.quantiles(waits, n=100)[98], rel=0.02)


def test_last_hour_forgets_what_is_older_than_an_hour() -> None:
    stats = RequestStats(started_at=START)
    stats.record(entry(duration_ms=5000), START)
    stats.record(entry(path=GROW, duration_ms=50), START + 1800)
    stats.record(entry(duration_ms=50), START + 3700)
    snapshot = stats.snapshot(START + 3700)
    assert snapshot["since_start"]["requests"] == 3
    assert snapshot["last_hour"]["requests"] == 2
    assert snapshot["last_hour"]["by_path"][MEASURE]["latency_ms"]["p99"] == pytest.approx(50, rel=0.01)
    later = stats.snapshot(START + 3600 * 3)["last_hour"]
    assert later["requests"] == 0 and later["by_path"] == {} and later["queue_wait_ms"]["p50"] is None


def test_memory_is_bounded_whatever_the_traffic() -> None:
    stats = RequestStats(started_at=START, known_paths=KNOWN)
    chance = random.Random(3)

    def traffic(count: int) -> None:
        for _ in range(count):
            path = f"/api/v1/random/{chance.randrange(10**9)}"
            stats.record(entry(path=path, duration_ms=chance.uniform(0.01, 600_000)), START + chance.uniform(0, 7200))

    traffic(4_000)
    size_before = len(pickle.dumps(stats))
    traffic(12_000)
    assert len(pickle.dumps(stats)) < size_before * 1.3
    by_path = stats.snapshot(START + 7200)["since_start"]["by_path"]
    assert list(by_path) == [OTHER_PATHS], "no junk path is told apart"


def test_the_known_endpoints_keep_their_keys_whatever_arrives_first() -> None:
    # 35 junk /api/ paths first took the 32 places: the real endpoints were "other" until a restart
    stats = RequestStats(started_at=START, known_paths=KNOWN)
    for number in range(35):
        stats.record(entry(path=f"/api/v1/junk/{number}"), START)
    stats.record(entry(path="/api/\x00\ufffd"), START)  # a NUL, undecodable bytes
    for path in KNOWN:
        stats.record(entry(path=path), START)
    by_path = stats.snapshot(START + 1)["since_start"]["by_path"]
    assert {path: counts["count"] for path, counts in by_path.items()} == {**dict.fromkeys(KNOWN, 1), OTHER_PATHS: 36}


def test_one_slow_request_among_ten_is_the_p99_and_max_is_never_below_it() -> None:
    """Issue 15: with 10 requests, one of them 600 ms, p99 said 30 ms (the sketch's rank rounded down)."""
    stats = RequestStats(started_at=START)
    for _ in range(9):
        stats.record(entry(duration_ms=30.0, queue_ms=0.1), START + 1)
    stats.record(entry(duration_ms=600.0, queue_ms=1000.0), START + 1)
    for name in ("since_start", "last_hour"):
        window = stats.snapshot(START + 1)[name]
        assert window["by_path"][MEASURE]["latency_ms"] == {"p50": 30.0, "p95": 600.0, "p99": 600.0, "max": 600.0}
        assert window["queue_wait_ms"] == {"p50": 0.1, "p99": 1000.0, "max": 1000.0}


def test_beyond_the_exact_window_the_sketch_answers_and_max_still_bounds_it() -> None:
    stats = RequestStats(started_at=START)
    for index in range(EXACT_SAMPLES * 2):
        stats.record(entry(duration_ms=10.0 + index % 7), START + 1)
    stats.record(entry(duration_ms=17.0), START + 1)
    latency = stats.snapshot(START + 1)["since_start"]["by_path"][MEASURE]["latency_ms"]
    assert latency["p99"] == pytest.approx(16.0, rel=0.02)
    assert latency["max"] == 17.0 and latency["p99"] <= latency["max"]


def test_queue_wait_per_class() -> None:
    stats = RequestStats(started_at=START)
    stats.classify = lambda path: path == GROW
    for queue_ms in (1.0, 3.0):
        stats.record(entry(queue_ms=queue_ms), START + 1)
    stats.record(entry(path=GROW, queue_ms=900.0), START + 1)
    window = stats.snapshot(START + 2)["last_hour"]
    assert window["queue_wait_ms_by_class"] == {
        "fast": {"p50": 1.0, "p99": 3.0, "max": 3.0},
        "slow": {"p50": 900.0, "p99": 900.0, "max": 900.0},
    }
    assert window["queue_wait_ms"]["max"] == 900.0


def test_a_failed_forward_retried_elsewhere_counts_as_a_failure_of_its_worker() -> None:
    """Issue 15: `by_worker.failed` stayed 0 when worker 0 failed and worker 1 then answered."""
    stats = RequestStats(started_at=START)
    retried = entry(worker=1)
    stats.record(RequestRecord(**{**vars(retried), "attempts": 2, "failed_workers": (0,)}), START + 1)
    exhausted = entry(worker=1, code=1007, http_status=200)  # both failed: the gateway's 1007
    stats.record(RequestRecord(**{**vars(exhausted), "attempts": 2, "failed_workers": (0, 1)}), START + 1)
    by_worker = stats.snapshot(START + 1)["since_start"]["by_worker"]
    assert by_worker == {"0": {"served": 0, "failed": 2}, "1": {"served": 1, "failed": 1}}


async def test_behind_the_gateway_junk_paths_first_leave_the_endpoints_their_keys(client, gateway) -> None:
    # the attack: 35 junk /api/ paths, then the real endpoints counted as "other" in
    # /admin/stats and hairgate_requests_total until a restart (build_gateway passes the routes)
    for number in range(35):
        await client.post(f"/api/v1/junk/{number}", content=b"{}")
    await client.post("/api/%00%ff", content=b"{}")  # a NUL and an undecodable byte
    await client.get(MEASURE)  # a known endpoint, whatever its answer (here 1001: wrong method)
    await gateway.request_log.flush()
    by_path = gateway.stats.snapshot()["since_start"]["by_path"]
    assert {path: counts["count"] for path, counts in by_path.items()} == {OTHER_PATHS: 36, MEASURE: 1}
    labels = {
        dict(sample.labels)["path"]
        for family in gateway.metrics.registry.collect()
        if family.name == "hairgate_requests"
        for sample in family.samples
    }
    assert labels == {OTHER_PATHS, MEASURE}
