"""State several gateways share (`[edge.shared_state]`): the Redis client, and how its failures are logged.

coredis is anyio-based and runs on trio; its client must be entered once by the task that
owns the serving nursery (`async with redis_client(url) as redis:` around it) and can then
be used by every request task. Connecting is lazy: a Redis that is down at start does not
stop the gateway; the features that need it fail their own way (keyed requests 1007,
rate limits fall back to memory).

A store that is down fails every request that touches it; `FailureLog` keeps that to one
log line a minute, saying how many failures it did not log.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import coredis
import coredis.exceptions

# What a Redis that is down, restarting or unreachable raises through coredis.
REDIS_ERRORS: tuple[type[BaseException], ...] = (coredis.exceptions.RedisError, OSError, TimeoutError)

_CONNECT_TIMEOUT_SECONDS = 1.0
_STREAM_TIMEOUT_SECONDS = 2.0


@asynccontextmanager
async def redis_client(url: str) -> AsyncIterator[coredis.Redis[bytes] | None]:
    """The shared Redis client for `url`, or None when `url` is empty (no shared state)."""
    if not url:
        yield None
        return
    client: coredis.Redis[bytes] = coredis.Redis.from_url(
        url, connect_timeout=_CONNECT_TIMEOUT_SECONDS, stream_timeout=_STREAM_TIMEOUT_SECONDS
    )
    async with client:
        yield client


class FailureLog:
    """Logs a recurring failure at most once per `interval_seconds`, counting the ones it skipped."""

    def __init__(
        self, logger: logging.Logger, what: str, interval_seconds: float = 60, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._logger = logger
        self._what = what
        self._interval_seconds = interval_seconds
        self._clock = clock
        self._last_logged: float | None = None
        self._skipped = 0

    def report(self, error: BaseException) -> None:
        now = self._clock()
        if self._last_logged is not None and now - self._last_logged < self._interval_seconds:
            self._skipped += 1
            return
        self._logger.error(
            "%s | 错误=%s: %s | 上次记录后又失败 %d 次", self._what, type(error).__name__, error, self._skipped
        )
        self._last_logged = now
        self._skipped = 0
