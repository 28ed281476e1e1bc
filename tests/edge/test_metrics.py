"""The gateway's /metrics, scraped through its ASGI app and parsed by prometheus_client's parser."""

from __future__ import annotations

from functools import partial

import httpx
import hypercorn.config
import hypercorn.trio
import trio
from prometheus_client.parser import text_string_to_metric_families

from edge.observe.metrics import GatewayMetrics, PoolGauges, metrics_app, pool_gauges
from edge.pool.dispatch import DispatchCounters
from edge.pool.pool import Pool, ProbeResult
from shared.contract.endpoints import api_paths
from tests.edge.test_stats import GROW, MEASURE, entry

SPEC_NAMES = {  # gateway.md § Metrics, as exposed (counters carry _total)
    "hairgate_requests_total", "hairgate_request_duration_seconds", "hairgate_queue_wait_seconds",
    "hairgate_queue_length", "hairgate_workers_online", "hairgate_worker_up", "hairgate_worker_busy",
    "hairgate_worker_ejections_total", "hairgate_retries_total", "hairgate_idempotency_total",
    "hairgate_rate_limited_total", "hairgate_build_info", "hairgate_early_refusals_total", "hairgate_departures_total",
    "hairgate_worker_generation_ready", "hairgate_worker_disk_low",
}  # fmt: skip
WORKERS = ["http://10.9.8.7:28187", "http://10.9.8.6:28187", "http://10.9.8.5:28187"]


async def scrape(metrics: GatewayMetrics, path: str = "/metrics") -> httpx.Response:
    transport = httpx.ASGITransport(app=metrics_app(metrics))
    async with httpx.AsyncClient(transport=transport, base_url="http://metrics.test") as client:
        return await client.get(path)


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


async def test_every_spec_metric_with_the_counts_sent() -> None:
    metrics = GatewayMetrics(version="0.1.0")
    metrics.classify = lambda path: path == GROW
    pool = Pool(WORKERS)
    pool.record_probe(0, ProbeResult(0.0, ok=True, checks={"disk": "ok", "comfyui": "down"}), now=1.0)
    pool.record_probe(1, ProbeResult(0.0, ok=False, checks={"disk": "low", "comfyui": "ok"}), now=1.0)
    pool.record_probe(2, ProbeResult(0.0, ok=True, checks={"disk": "ok", "comfyui": "ok"}), now=1.0)
    pool.lease(2)
    counters = DispatchCounters(early_refusals=3, departures_queued=2, departures_forward=1)
    metrics.watch_pool(lambda: pool_gauges(pool, 4, counters))
    for _ in range(5):
        metrics.observe_request(entry(duration_ms=200, queue_ms=20))
    metrics.observe_request(entry(code=1007, duration_ms=2, worker=None, limited=True))
    metrics.observe_request(entry(path=GROW, code=None, duration_ms=40_000, http_status=502))
    for result in ["stored", "replayed", "replayed", "waited", "mismatch", "unstored"]:
        metrics.observe_idempotency(result)
    metrics.observe_retry("connect")
    metrics.observe_ejection(1, "timeout")

    response = await scrape(metrics)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    got = samples(response.text)
    families = {family.name for family in text_string_to_metric_families(response.text)}
    assert families | {name for name, _ in got} >= SPEC_NAMES
    assert got[("hairgate_requests_total", (("code", "0"), ("path", MEASURE)))] == 5
    assert got[("hairgate_requests_total", (("code", "1007"), ("path", MEASURE)))] == 1
    assert got[("hairgate_requests_total", (("code", "none"), ("path", GROW)))] == 1
    assert got[("hairgate_request_duration_seconds_count", (("path", MEASURE),))] == 6
    assert got[("hairgate_request_duration_seconds_bucket", (("le", "0.25"), ("path", MEASURE)))] == 6
    assert got[("hairgate_request_duration_seconds_bucket", (("le", "30.0"), ("path", GROW)))] == 0
    assert got[("hairgate_queue_wait_seconds_count", (("class", "fast"),))] == 6
    assert got[("hairgate_queue_wait_seconds_count", (("class", "slow"),))] == 1
    assert got[("hairgate_early_refusals_total", ())] == 3
    assert got[("hairgate_departures_total", (("stage", "queued"),))] == 2
    assert got[("hairgate_departures_total", (("stage", "forward"),))] == 1
    assert [got[("hairgate_worker_generation_ready", (("worker", str(i)),))] for i in range(3)] == [0, 0, 1]
    assert [got[("hairgate_worker_disk_low", (("worker", str(i)),))] for i in range(3)] == [0, 1, 0]
    assert got[("hairgate_rate_limited_total", ())] == 1
    idempotency = {k[1][0][1]: v for k, v in got.items() if k[0] == "hairgate_idempotency_total"}
    assert idempotency == {"stored": 1, "replayed": 2, "waited": 1, "mismatch": 1}
    assert got[("hairgate_retries_total", (("reason", "connect"),))] == 1
    assert got[("hairgate_worker_ejections_total", (("reason", "timeout"), ("worker", "1")))] == 1
    assert [got[("hairgate_worker_up", (("worker", str(i)),))] for i in range(3)] == [1, 0, 1]
    assert [got[("hairgate_worker_busy", (("worker", str(i)),))] for i in range(3)] == [0, 0, 1]
    assert got[("hairgate_workers_online", ())] == 2
    assert got[("hairgate_queue_length", ())] == 4
    assert got[("hairgate_build_info", (("version", "0.1.0"),))] == 1
    assert "10.9.8" not in response.text, "workers are indexes, never URLs"


async def test_only_metrics_is_served() -> None:
    metrics = GatewayMetrics(version="0.1.0")
    assert (await scrape(metrics, "/")).status_code == 404
    assert (await scrape(metrics, "/api/v1/hair/measure")).status_code == 404


async def test_path_labels_are_the_known_endpoints_whatever_arrives_first() -> None:
    # 35 junk /api/ paths before the first real request used to take every label (the
    # first 32 paths seen), so the real endpoints counted as "other" until a restart
    metrics = GatewayMetrics(version="0.1.0", known_paths=api_paths())
    metrics.watch_pool(lambda: PoolGauges(up=(), busy=(), queue_length=0))
    for number in range(35):
        metrics.observe_request(entry(path=f"/api/v1/probe/{number}"))
    for junk in ("/api/\x00nul", "/api/\ufffd\ufffd", "/api/a\nb"):  # NUL, undecodable bytes, a newline
        metrics.observe_request(entry(path=junk))
    for path in api_paths():
        metrics.observe_request(entry(path=path))
    text = (await scrape(metrics)).text
    got = samples(text)
    counts = {dict(labels)["path"]: value for (name, labels), value in got.items() if name == "hairgate_requests_total"}
    assert counts == {**dict.fromkeys(api_paths(), 1), "other": 38}
    assert "\x00" not in text and "\ufffd" not in text
    assert all(line.isprintable() for line in text.splitlines())


async def test_served_by_hypercorn_on_its_own_listener() -> None:
    """What the gateway's second bind runs: Hypercorn (lifespan included) with this app."""
    metrics = GatewayMetrics(version="0.1.0")
    metrics.observe_idempotency("stored")
    config = hypercorn.config.Config()
    config.bind = ["127.0.0.1:0"]
    config.accesslog = None
    stopped = trio.Event()
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(
            partial(hypercorn.trio.serve, metrics_app(metrics), config, shutdown_trigger=stopped.wait)
        )
        async with httpx.AsyncClient(base_url=binds[0]) as client:
            response = await client.get("/metrics")
        stopped.set()
    got = samples(response.text)
    assert got[("hairgate_idempotency_total", (("result", "stored"),))] == 1
