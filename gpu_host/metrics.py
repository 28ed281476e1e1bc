"""Prometheus metrics of a GPU host (gateway.md § Metrics), served as `GET /metrics` by the app.

One `HostMetrics` per app, on its own CollectorRegistry (never the process-global one, so
tests running several hosts in one process do not mix). The inference histogram and the
generation counter are updated per request; restarts and busy are read from the model
supervisor when Prometheus scrapes, so they can never drift from what `/health` says.

    hairgate_host_inference_seconds{endpoint}   histogram: time in the model process per request run
    hairgate_host_model_restarts_total          counter: model children replaced since start
    hairgate_host_busy                          gauge: 1 while an inference runs
    hairgate_host_generation_total{result}      counter: grown images per result (GENERATION_RESULTS)
    hairgate_host_disk_free_megabytes           gauge: the least free space among the filesystems it writes to
    hairgate_host_disk_low                      gauge: 1 while that is below gpu_host.min_free_disk_mb (/health 503)
    hairgate_host_comfyui_up                    gauge: 1 when ComfyUI's last probe answered (absent: none configured)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.metrics_core import Metric

from gpu_host.checks import HostChecks, no_checks
from gpu_host.model_process import ModelStatistics
from shared.contract import CHECK_OFF, CHECK_OK, GENERATOR_COMFYUI, GENERATOR_PREVIEW

# Per grown image: who drew it, ComfyUI configured but it drew nothing, or no hair to grow from.
GENERATION_FAILED = "failed"
GENERATION_NO_HAIR = "no_hair"
GENERATION_RESULTS = (GENERATOR_COMFYUI, GENERATOR_PREVIEW, GENERATION_FAILED, GENERATION_NO_HAIR)
CONTENT_TYPE = CONTENT_TYPE_LATEST

# From a 50 ms mask to a grow of three plans at 12 MP on CPU.
_INFERENCE_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30, 60, 120)


class _ModelCollector:
    def __init__(self, source: Callable[[], ModelStatistics]) -> None:
        self._source = source

    def collect(self) -> Iterable[Metric]:
        stats = self._source()
        yield CounterMetricFamily(
            "hairgate_host_model_restarts", "Model processes replaced since the host started", value=stats.restarts
        )
        yield GaugeMetricFamily(
            "hairgate_host_busy", "1 while the model process runs a request", value=float(stats.busy)
        )


class _ChecksCollector:
    """The deep checks' last results, as `/health` reports them (never measured per scrape)."""

    def __init__(self, checks: HostChecks) -> None:
        self._checks = checks

    def collect(self) -> Iterable[Metric]:
        checks = self._checks
        if checks.disk is not None:
            yield GaugeMetricFamily(
                "hairgate_host_disk_free_megabytes", "Least free space among the filesystems the host writes to",
                value=checks.disk.free_mb,
            )  # fmt: skip
        yield GaugeMetricFamily("hairgate_host_disk_low", "1 while free disk space is below min_free_disk_mb",
                                value=float(checks.disk_low))  # fmt: skip
        if checks.comfyui != CHECK_OFF:
            yield GaugeMetricFamily("hairgate_host_comfyui_up", "1 when ComfyUI answered its last probe",
                                    value=float(checks.comfyui == CHECK_OK))  # fmt: skip


class HostMetrics:
    def __init__(self, model_statistics: Callable[[], ModelStatistics], checks: HostChecks | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._inference = Histogram(
            "hairgate_host_inference_seconds", "Time in the model process per request it ran", ["endpoint"],
            buckets=_INFERENCE_BUCKETS, registry=self.registry,
        )  # fmt: skip
        self._generation = Counter(
            "hairgate_host_generation", "Grown images per result", ["result"], registry=self.registry
        )
        for result in GENERATION_RESULTS:  # every series exists from the start: rate() needs a zero
            self._generation.labels(result)
        self.registry.register(_ModelCollector(model_statistics))
        self.registry.register(_ChecksCollector(checks or no_checks()))

    def observe_inference(self, endpoint: str, seconds: float) -> None:
        self._inference.labels(endpoint).observe(seconds)

    def count_generation(self, result: str) -> None:
        self._generation.labels(result).inc()

    def exposition(self) -> bytes:
        """The text format, as `GET /metrics` answers it."""
        return generate_latest(self.registry)
