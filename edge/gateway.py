"""The `Gateway` object graph: everything one gateway process shares.

`build_gateway(settings)` wires pool, dispatcher, upstream client, image store, request
log, stats, metrics, admission, API service, the annotation clean-up and the static
downloads' cap; handlers reach it through the `Gateway` object (`edge.app.create_app`),
never module globals. What must be opened first (the shared Redis, the idempotency store)
is passed in, and what runs in the background is started by `edge.main.serve`, in one
nursery.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib.metadata import version
from typing import TypedDict

import coredis
import httpx
import trio

from edge.admission.gate import Admission
from edge.admission.idempotency import Idempotency
from edge.annotations.downloads import StaticDownloads
from edge.annotations.rewrite import ImageStore
from edge.annotations.static_cleanup import StaticCleanup
from edge.audit.trail import AuditTrail, build_audit
from edge.forwarding.service import ApiService
from edge.local.face_workers import FaceWorkers
from edge.local.features import Features
from edge.local.special_points import SpecialPoints
from edge.observe.metrics import GatewayMetrics, pool_gauges
from edge.observe.request_log import RequestLog
from edge.observe.stats import RequestStats
from edge.pool.dispatch import Dispatcher
from edge.pool.failures import FailureNumbers, RetryPolicy
from edge.pool.host_leases import build_host_leases
from edge.pool.pool import Pool, Thresholds
from edge.pool.scheduling import SchedulingPolicy
from edge.pool.upstream import Timeouts, Upstream, UpstreamLimits
from edge.web.entrance import Entrance
from shared.contract.endpoints import api_paths
from shared.model_version import analysis_version
from shared.secrets_file import SecretsSource
from shared.settings import AnalysisSettings, Settings

FILE_THREADS = 4  # concurrent file reads/writes; PNGs are small, the disk is the limit


@dataclass
class Gateway:
    """Everything the handlers and background tasks of one gateway process share."""

    # The record of the settings in force: what a reload starts from (its restart-only keys
    # kept) and a token switch edits. Requests never read it: each component was told its
    # part (`reconfigure`), and the layout test fails on a live read.
    settings: Settings
    dispatcher: Dispatcher
    upstream: Upstream
    request_log: RequestLog
    api: ApiService
    file_threads: trio.CapacityLimiter
    stats: RequestStats
    metrics: GatewayMetrics
    admission: Admission
    face_workers: FaceWorkers
    special_points: SpecialPoints
    features: Features
    audit: AuditTrail
    static_cleanup: StaticCleanup
    static_downloads: StaticDownloads
    entrance: Entrance  # what the HTTP layer checks and states per request
    model_version: str  # the gateway's own analysis, for the endpoints it answers itself (4, 99)
    secrets: SecretsSource | None = None  # where `POST /admin/token` persists the token
    # Held by whatever changes `settings` while serving (a SIGHUP reload, a token switch),
    # so that none of them undoes another.
    settings_lock: trio.Lock = field(default_factory=trio.Lock)

    @property
    def pool(self) -> Pool:
        return self.dispatcher.pool

    def switch_token(self, new: str) -> str:
        """`new` as the shared password, in the record and where it is used (the upstream
        client sends it, the entrance asks for it); the old one. The caller holds
        `settings_lock` and has persisted `new` (`POST /admin/token`)."""
        old = self.settings.auth.shared_password
        self.settings = self.settings.model_copy(
            update={"auth": self.settings.auth.model_copy(update={"shared_password": new})}
        )
        self.upstream.set_token(new)
        self.entrance.reconfigure(self.settings)
        return old


def build_gateway(
    settings: Settings,
    upstream: Upstream | None = None,
    *,
    idempotency: Idempotency | None = None,
    redis: coredis.Redis[bytes] | None = None,
    secrets: SecretsSource | None = None,
    features_transport: httpx.AsyncBaseTransport | None = None,
) -> Gateway:
    """The object graph of one gateway; tests pass a fake `upstream` (as httpx takes a transport)
    and may pass the vision LLM's transport likewise.

    `idempotency` (None: keys are ignored) and `redis` (None: rate limits in memory) are
    opened by the caller, who closes them.
    """
    edge = settings.edge
    pool = Pool(edge.pool.workers, edge.pool.primary_workers, thresholds(settings))
    # the dispatcher hears their releases, the forwards take them
    host_leases = build_host_leases(redis, edge.shared_state.lease_seconds)
    dispatcher = Dispatcher(pool, **dispatch_options(settings), host_leases=host_leases)
    upstream = upstream or Upstream(settings.auth.shared_password, upstream_limits(settings), ca_file=edge.pool.ca_file)
    file_threads = trio.CapacityLimiter(FILE_THREADS)
    metrics = GatewayMetrics(version("hairgate"), known_paths=api_paths())
    metrics.watch_pool(lambda: pool_gauges(pool, _queue_length(dispatcher), dispatcher.counters))
    audit = build_audit(settings, metrics)
    api = ApiService(
        dispatcher,
        upstream,
        image_store(settings, file_threads),
        retry_policy(settings),
        timeouts(settings),
        **forward_options(settings),
        metrics=metrics,
        audit=audit,
        host_leases=host_leases,
    )
    stats = RequestStats(known_paths=api_paths())
    metrics.classify = stats.classify = api.is_slow  # read per record: a reload of slow_paths applies at once
    request_log = RequestLog(
        edge.request_log, edge.request_log_max_bytes, observers=(stats.record, metrics.observe_request)
    )
    admission = Admission(edge.rate_limit, redis, idempotency, metrics)
    face_workers = FaceWorkers(
        edge.cpu.workers,
        queue_wait_seconds=edge.dispatch.queue_wait_seconds,
        start_at_start=edge.cpu.start_workers_at_start,
    )
    return Gateway(
        settings, dispatcher, upstream, request_log, api, file_threads, stats, metrics, admission,
        face_workers, SpecialPoints(face_workers, settings.analysis),
        Features(edge.features, face_workers, settings.analysis, transport=features_transport), audit,
        StaticCleanup(edge.static_dir, edge.static_cleanup, file_threads), StaticDownloads(edge.static_downloads),
        Entrance(settings), analysis_version().value, secrets,
    )  # fmt: skip


# What the components take from the settings, given at construction and again on a reload
# (`edge.reload`): written once, so the two cannot drift apart.


class DispatchOptions(TypedDict):
    max_inflight: int
    queue_wait_seconds: float
    max_queue_wait_seconds: float
    policy: SchedulingPolicy


class ProbeOptions(TypedDict):
    path: str
    interval_seconds: float
    timeout_seconds: float
    request_timeout_seconds: float


class ForwardOptions(TypedDict):
    probe_interval_seconds: float
    limits: AnalysisSettings
    failures: FailureNumbers


def dispatch_options(settings: Settings) -> DispatchOptions:
    """`Dispatcher`'s keyword arguments (beside the pool's workers and thresholds)."""
    dispatch = settings.edge.dispatch
    return DispatchOptions(
        max_inflight=dispatch.max_inflight,
        queue_wait_seconds=dispatch.queue_wait_seconds,
        max_queue_wait_seconds=dispatch.max_queue_wait_seconds,
        policy=scheduling_policy(settings),
    )


def probe_options(settings: Settings) -> ProbeOptions:
    """`Prober`'s keyword arguments."""
    checks = settings.edge.health_check
    return ProbeOptions(
        path=checks.path,
        interval_seconds=checks.interval_seconds,
        timeout_seconds=checks.timeout_seconds,
        request_timeout_seconds=settings.edge.dispatch.request_timeout_seconds,
    )


def forward_options(settings: Settings) -> ForwardOptions:
    """`ApiService`'s keyword arguments from the settings (beside its image store, retry
    policy and timeouts)."""
    return ForwardOptions(
        probe_interval_seconds=settings.edge.health_check.interval_seconds,
        limits=settings.analysis,
        failures=failure_numbers(settings),
    )


def failure_numbers(settings: Settings) -> FailureNumbers:
    """How long a host that named its failure is kept from jobs (`edge.failures`, the cooldown)."""
    failures = settings.edge.failures
    return FailureNumbers(
        cooldown_seconds=settings.edge.health_check.cooldown_seconds,
        oom_backoff_base_seconds=failures.oom_backoff_base_seconds,
        timeout_backoff_base_seconds=failures.timeout_backoff_base_seconds,
        backoff_max_seconds=failures.backoff_max_seconds,
        model_load_out_seconds=failures.model_load_out_seconds,
    )


def timeouts(settings: Settings) -> Timeouts:
    dispatch = settings.edge.dispatch
    return Timeouts(dispatch.request_timeout_seconds, dispatch.slow_request_timeout_seconds)


def upstream_limits(settings: Settings) -> UpstreamLimits:
    # two per worker (a forward's and a probe's, which may run beside it) and some slack;
    # sized at start: the upstream client is not reconfigured on a reload
    return UpstreamLimits(keepalive_connections=2 * len(settings.edge.pool.workers) + 8)


def thresholds(settings: Settings) -> Thresholds:
    checks = settings.edge.health_check
    return Thresholds(checks.unhealthy_threshold, checks.healthy_threshold, checks.cooldown_seconds)


def scheduling_policy(settings: Settings) -> SchedulingPolicy:
    dispatch = settings.edge.dispatch
    return SchedulingPolicy(dispatch.reserved_fast_workers, dispatch.slow_priority_offset_seconds)


def retry_policy(settings: Settings) -> RetryPolicy:
    dispatch = settings.edge.dispatch
    return RetryPolicy(dispatch.retry_on_failure, dispatch.max_retries, frozenset(dispatch.slow_paths))


def image_store(settings: Settings, file_threads: trio.CapacityLimiter) -> ImageStore:
    edge = settings.edge
    return ImageStore(edge.static_dir, edge.public_base_url, file_threads, edge.static_cleanup.max_total_mb)


def _queue_length(dispatcher: Dispatcher) -> int:
    stats = dispatcher.statistics()
    return stats.waiting_for_slot + stats.waiting_for_worker
