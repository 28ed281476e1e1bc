"""The prober: a background task that probes every worker's `/health` each interval.

`await nursery.start(prober.run)` returns only after the first round, so the gateway
never accepts a connection before it knows who is online; that is also when the one
`Worker 池初始化完成` line is logged. Probes run concurrently and on their own
connections: a worker busy with an inference still answers `/health`, so a probe never
waits for a request to finish.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable

import trio

from edge.pool.dispatch import Dispatcher
from edge.pool.forward import HealthAnswer
from edge.pool.pool import ProbeResult
from shared.contract import BUSY_KEY

log = logging.getLogger("edge.pool")

# (url, timeout_seconds) -> the answer; raises on transport errors and timeouts.
ProbeFunction = Callable[[str, float], Awaitable[HealthAnswer]]


def judge(answer: HealthAnswer, sent_at: float) -> ProbeResult:
    """Success is HTTP 200 with a JSON body; `"busy": true` in it marks the worker busy."""
    if answer.status != 200:
        return ProbeResult(sent_at, ok=False, reason=f"HTTP {answer.status}")
    try:
        body = json.loads(answer.body)
    except ValueError:
        return ProbeResult(sent_at, ok=False, reason="health body is not JSON")
    busy = isinstance(body, dict) and body.get(BUSY_KEY) is True
    return ProbeResult(sent_at, ok=True, busy=busy)


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
    ) -> None:
        self._dispatcher = dispatcher
        self._probe = probe
        self._path = path
        self._interval_seconds = interval_seconds
        self._timeout_seconds = timeout_seconds

    def reconfigure(self, *, path: str, interval_seconds: float, timeout_seconds: float) -> None:
        """Reloaded settings; the next round uses them."""
        self._path, self._interval_seconds, self._timeout_seconds = path, interval_seconds, timeout_seconds

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        next_round = trio.current_time()
        await self.probe_all()
        self._log_initialised()
        task_status.started()
        while True:
            # Rounds start every interval; a round slower than that (timeout > interval)
            # delays the next one instead of piling up rounds to catch up.
            next_round = max(next_round + self._interval_seconds, trio.current_time())
            await trio.sleep_until(next_round)
            await self.probe_all()

    async def probe_all(self) -> None:
        async with trio.open_nursery() as nursery:
            for worker in self._dispatcher.pool.active:
                nursery.start_soon(self._probe_one, worker.index, worker.url)

    async def _probe_one(self, index: int, url: str) -> None:
        sent_at = trio.current_time()
        result: ProbeResult
        with trio.move_on_after(self._timeout_seconds) as scope:
            try:
                answer = await self._probe(url + self._path, self._timeout_seconds)
            except Exception as error:  # every transport failure is just a failed probe
                result = ProbeResult(sent_at, ok=False, reason=_describe(error))
            else:
                result = judge(answer, sent_at)
        if scope.cancelled_caught:
            result = ProbeResult(sent_at, ok=False, reason="timeout")
        self._dispatcher.record_probe(index, result)

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
