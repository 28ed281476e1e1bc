"""The prober: a background task that probes every worker's `/health` each interval.

`await nursery.start(prober.run)` returns only after the first round, so the gateway
never accepts a connection before it knows who is online; that is also when the one
`Worker 池初始化完成` line is logged. Probes run concurrently and on their own
connections: a worker busy with an inference still answers `/health`, so a probe never
waits for a request to finish.

Beside the rounds, a worker whose forward was abandoned (its client left), or that
answered a forward "busy" (another gateway's job), is probed at once and then every
`HELD_PROBE_INTERVAL_SECONDS` (a worker busy elsewhere for over `HELD_FAST_SECONDS`:
every `HELD_SLOW_PROBE_INTERVAL_SECONDS`) until a probe says it is free (a worker busy elsewhere:
twice, `FREE_CONFIRM_SECONDS` apart, the second look sent that soon), so the GPU serves
the next request within a probe's round trip of being free.
Each probe also keeps the host's deep `checks`, its `inference_timeout_seconds` and its
`model_version`; a host whose timeout leaves no margin below the gateway's request timeout
is named in one warning (per worker and value); after each round, online hosts running
different model versions are named in a warning (`edge.pool.versions`) while that lasts.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace
from typing import Any

import trio

from edge.pool.dispatch import Dispatcher
from edge.pool.pool import FREE_CONFIRM_SECONDS, ProbeResult
from edge.pool.upstream import HealthAnswer
from edge.pool.versions import MixedVersions
from shared.contract import (
    BUSY_KEY,
    HEALTH_CHECKS_KEY,
    HEALTH_LOADING,
    MODEL_VERSION_KEY,
    WANTED_KEY,
    model_version_or_none,
)
from shared.settings import timeout_margin_seconds

log = logging.getLogger("edge.pool")

# (url, timeout_seconds, wanted) -> the answer; raises on transport errors and timeouts.
# `wanted`: a request here has waited long for this host (shared.contract.HEADER_HOST_WANTED).
ProbeFunction = Callable[[str, float, bool], Awaitable[HealthAnswer]]

HELD_PROBE_INTERVAL_SECONDS = 0.1  # gateway.md § Scheduling, § Several gateways: at once, then every 100 ms
# A host busy elsewhere for longer than this (another gateway keeps it, job after job) is
# looked at every HELD_SLOW_PROBE_INTERVAL_SECONDS instead: 3 gateways x 10 probes a second
# on every host they do not hold took the CPU the jobs needed. A drain keeps 100 ms.
HELD_FAST_SECONDS = 1.0
HELD_SLOW_PROBE_INTERVAL_SECONDS = 0.4


def judge(answer: HealthAnswer, sent_at: float) -> ProbeResult:
    """Success is HTTP 200 with a JSON body; `"busy": true` in it marks the worker busy.
    Any JSON object (a 503 for a low disk too) carries the host's `checks`."""
    try:
        body: Any = json.loads(answer.body)
    except (ValueError, RecursionError):
        body = None
    document = body if isinstance(body, dict) else {}
    checks = _checks(document.get(HEALTH_CHECKS_KEY)) if body is not None else None
    version = model_version_or_none(document.get(MODEL_VERSION_KEY))
    timeout = document.get("inference_timeout_seconds")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not math.isfinite(timeout):
        timeout = None
    # what the host reports of itself, kept whatever the answer says of its health
    reported = ProbeResult(sent_at, ok=False, checks=checks, inference_timeout_seconds=timeout, model_version=version)
    if answer.status != 200:
        loading = answer.status == 503 and document.get("status") == HEALTH_LOADING
        reason = f"HTTP {answer.status} {HEALTH_LOADING}" if loading else f"HTTP {answer.status}"
        return replace(reported, reason=reason, loading=loading)
    if body is None:
        return ProbeResult(sent_at, ok=False, reason="health body is not JSON")
    busy, wanted = document.get(BUSY_KEY) is True, document.get(WANTED_KEY) is True
    return replace(reported, ok=True, busy=busy, wanted=wanted)


def _checks(value: object) -> Mapping[str, str]:
    """The `checks` object, its string entries only (anything else a host sends is ignored)."""
    if not isinstance(value, dict):
        return {}
    return {name: state for name, state in value.items() if isinstance(name, str) and isinstance(state, str)}


class Prober:
    """Probes `dispatcher.pool`'s workers with `probe` every `interval_seconds`."""

    def __init__(
        self,
        dispatcher: Dispatcher,
        probe: ProbeFunction,
        *,
        path: str,
        interval_seconds: float,
        timeout_seconds: float,
        request_timeout_seconds: float = math.inf,
    ) -> None:
        self._dispatcher = dispatcher
        self._probe = probe
        self._path = path
        self._interval_seconds = interval_seconds
        self._timeout_seconds = timeout_seconds
        self._request_timeout_seconds = request_timeout_seconds
        self._warned_timeouts: dict[int, float] = {}  # worker -> the value a warning named
        self._following: set[int] = set()  # workers probed every 100 ms after a departure
        self._versions = MixedVersions()  # says while the online hosts run different model versions

    def reconfigure(
        self, *, path: str, interval_seconds: float, timeout_seconds: float, request_timeout_seconds: float = math.inf
    ) -> None:
        """Reloaded settings; the next round uses them."""
        self._path, self._interval_seconds, self._timeout_seconds = path, interval_seconds, timeout_seconds
        if request_timeout_seconds != self._request_timeout_seconds:
            self._warned_timeouts.clear()  # a new request timeout: judge every host again
        self._request_timeout_seconds = request_timeout_seconds

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        next_round = trio.current_time()
        await self.probe_all()
        self._log_initialised()
        task_status.started()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._follow_departures, nursery)
            while True:
                # Rounds start every interval; a round slower than that (timeout > interval)
                # delays the next one instead of piling up rounds to catch up.
                next_round = max(next_round + self._interval_seconds, trio.current_time())
                await trio.sleep_until(next_round)
                await self.probe_all()

    async def _follow_departures(self, nursery: trio.Nursery) -> None:
        while True:
            for index in await self._dispatcher.workers_to_follow():
                if index not in self._following:
                    self._following.add(index)
                    nursery.start_soon(self._probe_until_free, index)

    async def _probe_until_free(self, index: int) -> None:
        """At once, then every 100 ms, until the worker is no longer held (a probe said it
        is free, a drain ran out, it was leased again, or it went offline or was removed)."""
        worker = self._dispatcher.pool.workers[index]
        try:
            next_probe = began = trio.current_time()
            while worker.awaiting_probe and worker.online:
                await self._probe_one(index, worker.url)
                step = HELD_PROBE_INTERVAL_SECONDS
                kept_elsewhere = worker.draining_until is None and trio.current_time() - began >= HELD_FAST_SECONDS
                if kept_elsewhere and not self._dispatcher.wants(index):
                    # kept by another gateway: look less often, unless a request here waits for
                    # it so long that its host was asked for a turn (taken at the first look)
                    step = HELD_SLOW_PROBE_INTERVAL_SECONDS
                next_probe = max(next_probe + step, trio.current_time())
                if worker.free_seen_at is not None:  # seen free once: the look that confirms it comes sooner
                    next_probe = max(worker.free_seen_at + FREE_CONFIRM_SECONDS, trio.current_time())
                await trio.sleep_until(min(next_probe, worker.draining_until or next_probe))
                self._dispatcher.expire_holds()
        finally:
            self._following.discard(index)

    async def probe_all(self) -> None:
        async with trio.open_nursery() as nursery:
            for worker in self._dispatcher.pool.active:
                nursery.start_soon(self._probe_one, worker.index, worker.url)
        self._check_versions()

    def _check_versions(self) -> None:
        """After a round, every online host's version is its latest: mixed now means mixed."""
        versions = self._dispatcher.pool.statistics().model_versions
        notice = self._versions.observe(versions, trio.current_time())
        if notice is not None:
            log.log(notice.level, notice.message)

    async def _probe_one(self, index: int, url: str) -> None:
        sent_at = trio.current_time()
        wanted = self._dispatcher.wants(index)
        if wanted:
            self._dispatcher.asked_for(index)
        result: ProbeResult
        with trio.move_on_after(self._timeout_seconds) as scope:
            try:
                answer = await self._probe(url + self._path, self._timeout_seconds, wanted)
            except Exception as error:  # every transport failure is just a failed probe
                result = ProbeResult(sent_at, ok=False, reason=_describe(error))
            else:
                result = judge(answer, sent_at)
        if scope.cancelled_caught:
            result = ProbeResult(sent_at, ok=False, reason="timeout")
        self._dispatcher.record_probe(index, result)
        self._check_margin(index, result.inference_timeout_seconds)

    def _check_margin(self, index: int, inference_timeout_seconds: float | None) -> None:
        if inference_timeout_seconds is None:
            return
        # the host's own 1007 (with its reason) must reach the client before the gateway gives
        # up: the margin the settings check holds a file configuring both roles to
        margin = timeout_margin_seconds(self._request_timeout_seconds)
        limit = self._request_timeout_seconds - margin
        if inference_timeout_seconds <= limit:
            self._warned_timeouts.pop(index, None)
            return
        if self._warned_timeouts.get(index) == inference_timeout_seconds:
            return
        self._warned_timeouts[index] = inference_timeout_seconds
        log.warning(
            "Worker 推理超时未留余量：gpu_host.inference_timeout_seconds (%g) 应比网关 "
            "edge.dispatch.request_timeout_seconds (%g) 至少小 %g 秒 | worker=%d | url=%s",
            inference_timeout_seconds, self._request_timeout_seconds, margin,
            index, self._dispatcher.pool.workers[index].url,
        )  # fmt: skip

    def _log_initialised(self) -> None:
        stats = self._dispatcher.pool.statistics()
        log.info(
            "Worker 池初始化完成 | 总数=%d | 在线=%d | 主worker=%d",
            stats.workers_total,
            stats.workers_healthy,
            stats.workers_primary_total,
        )


def _describe(error: Exception) -> str:
    text = str(error).splitlines()[0] if str(error) else ""
    return f"{type(error).__name__}: {text}" if text else type(error).__name__
