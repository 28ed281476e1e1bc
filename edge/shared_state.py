"""State several gateways share (`[edge.shared_state]`): the Redis client.

coredis is anyio-based and runs on trio; its client must be entered once by the task that
owns the serving nursery (`async with redis_client(url) as redis:` around it) and can then
be used by every request task. Connecting is lazy: a Redis that is down at start does not
stop the gateway; the features that need it fail their own way (keyed requests 1007,
rate limits fall back to memory).

A store that is down fails every request that touches it; `shared.logs.FailureLog` keeps
that to one log line a minute, saying how many failures it did not log. coredis' own
logger is held at WARNING: at INFO it writes a line per retry of every command (three
per request) and, for a dropped connection, a stray "NoneType: None" traceback line.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
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
    logging.getLogger("coredis").setLevel(logging.WARNING)
    client: coredis.Redis[bytes] = coredis.Redis.from_url(
        url, connect_timeout=_CONNECT_TIMEOUT_SECONDS, stream_timeout=_STREAM_TIMEOUT_SECONDS
    )
    async with client:
        yield client
