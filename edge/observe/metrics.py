"""Prometheus metrics of the gateway (gateway.md § Metrics), served on `edge.metrics_bind`.

One `GatewayMetrics` per gateway, on its own CollectorRegistry (never the process-global
one, so tests and several gateways in one process do not mix). Per-request calls are plain
counter/histogram updates; the pool's gauges (up, busy, generation-ready, disk low, model version) and
the dispatcher's counters (early refusals, departures) are read only when Prometheus
scrapes, from the source given to `watch_pool`. Queue waits are split by class (`classify`
says whether a path is one of `slow_paths`). Workers are labelled by index, never by URL; paths are
labelled like `/admin/stats` (`endpoint_label`: the known endpoints, "other" for the rest).

`metrics_app(metrics)` is the ASGI app for the second listener: `GET /metrics` in the
text format, 404 elsewhere; it answers the lifespan protocol so Hypercorn can serve it.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.asgi import make_asgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from edge.observe.request_log import RequestRecord
from edge.observe.stats import DEFAULT_KNOWN_PATHS, NO_CODE, endpoint_label
from edge.pool.dispatch import DispatchCounters
from edge.pool.pool import Pool, version_of
from edge.pool.scheduling import QUEUE_CLASSES, all_fast, queue_class

# The idempotency outcomes gateway.md names; an unstored run is none of them.
IDEMPOTENCY_RESULTS = ("stored", "replayed", "waited", "mismatch")

_DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 180, 300, 600)
_QUEUE_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 120, 300, 600)


@dataclass(frozen=True)
class PoolGauges:
    """What the pool looks like at scrape time; index i is worker i."""

    up: tuple[bool, ...]
    busy: tuple[bool, ...]
    queue_length: int
    generation_ready: tuple[bool, ...] = ()  # empty: as many False as workers
    disk_low: tuple[bool, ...] = ()
    counters: DispatchCounters = field(default_factory=DispatchCounters)
    model_versions: tuple[str | None, ...] = ()  # an online worker's model version; None: offline


def pool_gauges(pool: Pool, queue_length: int, counters: DispatchCounters | None = None) -> PoolGauges:
    return PoolGauges(
        up=tuple(w.online for w in pool.workers),  # by index; a retired worker reads 0
        busy=tuple(w.busy for w in pool.workers),
        queue_length=queue_length,
        generation_ready=tuple(w.generation_ready for w in pool.workers),
        disk_low=tuple(w.disk_low and not w.retired for w in pool.workers),
        counters=counters or DispatchCounters(),
        model_versions=tuple(version_of(w) if w.online else None for w in pool.workers),
    )


class _PoolCollector:
    def __init__(self, source: Callable[[], PoolGauges]) -> None:
        self._source = source

    def collect(self) -> Iterable[Metric]:
        gauges = self._source()
        per_worker = (
            ("hairgate_worker_up", "1 when the worker is online", gauges.up),
            ("hairgate_worker_busy", "1 while the worker runs a job", gauges.busy),
            (
                "hairgate_worker_generation_ready",
                "1 when the worker is online and can draw (ComfyUI ok, or the built-in preview)",
                gauges.generation_ready or (False,) * len(gauges.up),
            ),
            (
                "hairgate_worker_disk_low",
                "1 while the worker's /health reports a disk below gpu_host.min_free_disk_mb",
                gauges.disk_low or (False,) * len(gauges.up),
            ),
        )
        for name, documentation, values in per_worker:
            family = GaugeMetricFamily(name, documentation, labels=["worker"])
            for index, value in enumerate(values):
                family.add_metric([str(index)], float(value))
            yield family
        yield _model_info(gauges.model_versions)
        yield GaugeMetricFamily("hairgate_workers_online", "Workers online", value=sum(gauges.up))
        yield GaugeMetricFamily(
            "hairgate_queue_length", "Requests waiting for a slot or a worker", value=gauges.queue_length
        )
        counters = gauges.counters
        yield CounterMetricFamily(
            "hairgate_early_refusals",
            "Requests answered busy at once: by the estimate they could not start within their queue wait",
            value=counters.early_refusals,
        )
        departures = CounterMetricFamily(
            "hairgate_departures", "Clients that left before their answer, by where their request was", labels=["stage"]
        )
        departures.add_metric(["queued"], counters.departures_queued)
        departures.add_metric(["forward"], counters.departures_forward)
        yield departures


def _model_info(versions: Iterable[str | None]) -> Metric:
    """1 per online worker, labelled with its model version: `count by (model_version)` is the
    pool's mix (more than one series value: an upgrade under way, or a host left behind)."""
    family = GaugeMetricFamily(
        "hairgate_worker_model_info", "1 per online worker, by the model version its /health reports",
        labels=["worker", "model_version"],
    )  # fmt: skip
    for index, version in enumerate(versions):
        if version is not None:
            family.add_metric([str(index), version], 1.0)
    return family


class GatewayMetrics:
    def __init__(self, version: str, known_paths: Collection[str] = DEFAULT_KNOWN_PATHS) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._known_paths = frozenset(known_paths)
        self._by_path_code: dict[tuple[str, int | None], tuple[Any, Any]] = {}
        self._requests = Counter(
            "hairgate_requests", "Answered /api/ requests", ["path", "code"], registry=self.registry
        )
        self._duration = Histogram(
            "hairgate_request_duration_seconds", "Time to answer an /api/ request", ["path"],
            buckets=_DURATION_BUCKETS, registry=self.registry,
        )  # fmt: skip
        self._queue_wait = Histogram(
            "hairgate_queue_wait_seconds", "Time waiting for a slot and a worker, by class (slow = slow_paths)",
            ["class"], buckets=_QUEUE_BUCKETS, registry=self.registry,
        )  # fmt: skip
        self._queue_wait_by_class = {name: self._queue_wait.labels(name) for name in QUEUE_CLASSES}
        # Is this path slow (edge.dispatch.slow_paths)? The gateway sets it to the live setting.
        self.classify: Callable[[str], bool] = all_fast
        self._ejections = Counter(
            "hairgate_worker_ejections", "Workers taken out after a failed request", ["worker", "reason"],
            registry=self.registry,
        )  # fmt: skip
        self._host_failures = Counter(
            "hairgate_host_failures", "Failures a host named (X-Error-Type), by kind", ["worker", "error_type"],
            registry=self.registry,
        )  # fmt: skip
        self._retries = Counter(
            "hairgate_retries", "Requests retried on another worker", ["reason"], registry=self.registry
        )
        self._idempotency = Counter(
            "hairgate_idempotency", "Keyed requests by outcome", ["result"], registry=self.registry
        )
        self._rate_limited = Counter(
            "hairgate_rate_limited", "Requests refused by the rate limit", registry=self.registry
        )
        build = Gauge("hairgate_build_info", "The running version", ["version"], registry=self.registry)
        build.labels(version=version).set(1)
        for result in IDEMPOTENCY_RESULTS:  # present at 0 from the start: rate() needs the series
            self._idempotency.labels(result=result)

    def observe_request(self, entry: RequestRecord) -> None:
        """Once per request-log entry."""
        requests, duration = self._children(entry.path, entry.code)
        requests.inc()
        duration.observe(entry.duration_ms / 1000)
        self._queue_wait_by_class[queue_class(entry.path, self.classify)].observe(entry.queue_ms / 1000)
        if entry.rate_limited:
            self._rate_limited.inc()

    def observe_idempotency(self, result: str) -> None:
        """`Outcome.result.value`; values outside IDEMPOTENCY_RESULTS (an unstored run) are not counted."""
        if result in IDEMPOTENCY_RESULTS:
            self._idempotency.labels(result=result).inc()

    def observe_retry(self, reason: str) -> None:
        self._retries.labels(reason=reason).inc()

    def observe_host_failure(self, worker: int, error_type: str) -> None:
        """A host's answer named `error_type` (gateway.md § Failure kinds)."""
        self._host_failures.labels(worker=str(worker), error_type=error_type).inc()

    def observe_ejection(self, worker: int, reason: str) -> None:
        self._ejections.labels(worker=str(worker), reason=reason).inc()

    def watch_pool(self, source: Callable[[], PoolGauges]) -> None:
        """Read the pool's gauges from `source()` at each scrape (nothing per request)."""
        self.registry.register(_PoolCollector(source))

    def _children(self, path: str, code: int | None) -> tuple[Any, Any]:
        # labels() costs a few µs per call; the (label, code) pairs are few, so keep them.
        label = endpoint_label(path, self._known_paths)
        children = self._by_path_code.get((label, code))
        if children is None:
            code_label = NO_CODE if code is None else str(code)
            children = (self._requests.labels(path=label, code=code_label), self._duration.labels(path=label))
            self._by_path_code[(label, code)] = children
        return children


_NOT_FOUND = b"not found: metrics are at /metrics\n"


def metrics_app(metrics: GatewayMetrics) -> Callable[..., Any]:
    """ASGI app for the metrics listener."""
    exposition = make_asgi_app(metrics.registry)

    async def app(scope: dict[str, Any], receive: Callable[..., Any], send: Callable[..., Any]) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                kind = message["type"].rsplit(".", 1)[-1]  # startup / shutdown
                await send({"type": f"lifespan.{kind}.complete"})
                if kind == "shutdown":
                    return
        if scope["type"] != "http":
            return
        if scope["path"] == "/metrics" and scope["method"] in ("GET", "HEAD"):
            await exposition(scope, receive, send)
            return
        await send({"type": "http.response.start", "status": 404, "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": _NOT_FOUND})

    return app
