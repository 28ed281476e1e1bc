"""Redis in front of PostgreSQL for idempotency records: PostgreSQL decides, Redis remembers answers.

Only finished answers are cached (DONE records whose response can be replayed). Such a
record never changes while it lives, so a cached copy may answer a replay, or refuse a
mismatch, without PostgreSQL. Everything else goes to PostgreSQL, which alone takes a key:
a miss, a PENDING or RELEASED record, and any call while Redis fails or is slow. So a
Redis that is down, flushed or evicting loses no key and never lets a key run twice; it
costs a replay one PostgreSQL round trip, nothing more.

Write-through: a stored answer is cached when PostgreSQL stored it (the row was still
ours). Read-through: an answer PostgreSQL handed out is cached for what is left of its
TTL. A Redis call that fails or takes longer than `CACHE_CALL_SECONDS` is logged once a
minute (WARNING) and Redis is left alone for `CACHE_BACKOFF_SECONDS`: a Redis that hangs
would otherwise cost every keyed request that long.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import TypeVar

import trio

from edge.admission.idempotency_postgres import PostgresStore
from edge.admission.idempotency_stores import IdempotencyUnavailable, Record, RedisStore, State, StoredResponse
from shared.logs import FailureLog

T = TypeVar("T")

log = logging.getLogger("edge.idempotency")

# Short beside any GPU job, long beside a Redis round trip on a busy machine.
CACHE_CALL_SECONDS = 0.5
CACHE_BACKOFF_SECONDS = 1.0
_FILLER = ""  # the owner a read-through copy is written as: it only ever fills an empty slot


class CachedStore:
    """`IdempotencyStore`: `authority` (PostgreSQL) decides, `cache` (Redis) holds finished answers."""

    def __init__(self, authority: PostgresStore, cache: RedisStore, max_entries: int) -> None:
        self._authority = authority
        self._cache = cache
        self._max_entries = max_entries  # the cache's own bound (its index), as the store's
        self._skip_cache_until = float("-inf")
        self._failures = FailureLog(log, "幂等缓存 Redis 不可用，改由 PostgreSQL 直接应答", level=logging.WARNING)

    async def claim(self, key: str, fingerprint: str, owner: str, lease_seconds: float) -> Record | None:
        cached = await self._cached(key)
        if cached is not None:
            return cached
        record = await self._authority.claim(key, fingerprint, owner, lease_seconds)
        await self._fill(key, record)
        return record

    async def read(self, key: str) -> Record | None:
        cached = await self._cached(key)
        if cached is not None:
            return cached
        record = await self._authority.read(key)
        await self._fill(key, record)
        return record

    async def renew(self, keys: Sequence[str], owner: str, lease_seconds: float) -> None:
        await self._authority.renew(keys, owner, lease_seconds)

    async def complete(
        self, key: str, owner: str, fingerprint: str, response: StoredResponse, ttl_seconds: float, max_entries: int
    ) -> None:
        if await self._authority.complete_owned(key, owner, fingerprint, response, ttl_seconds):
            await self._remember(key, owner, fingerprint, response, ttl_seconds)

    async def release(
        self, key: str, owner: str, fingerprint: str, response: StoredResponse | None, linger_seconds: float
    ) -> None:
        await self._authority.release(key, owner, fingerprint, response, linger_seconds)  # never cached

    async def discard(self, key: str, fingerprint: str) -> None:
        await self._authority.discard(key, fingerprint)
        await self._cache_call(partial(self._cache.discard, key, fingerprint))

    async def purge(self, max_entries: int) -> None:
        await self._authority.purge(max_entries)
        await self._cache_call(partial(self._cache.purge, max_entries))

    async def aclose(self) -> None:
        await self._authority.aclose()  # the Redis client belongs to whoever opened it

    async def _cached(self, key: str) -> Record | None:
        """The cached finished answer of `key`; None sends the caller to PostgreSQL."""
        record = await self._cache_call(partial(self._cache.read, key))
        if record is None or record.state is not State.DONE or record.answer is None:
            return None  # a PENDING or RELEASED record in Redis is no one's to trust (an older setup's)
        return record

    async def _fill(self, key: str, record: Record | None) -> None:
        if record is None or record.state is not State.DONE or record.answer is None:
            return
        left = record.expires_in_seconds
        if left is not None and left > 0:
            await self._remember(key, _FILLER, record.fingerprint, record.answer, left)

    async def _remember(
        self, key: str, owner: str, fingerprint: str, response: StoredResponse, keep_seconds: float
    ) -> None:
        """Cache a finished answer; Redis' script fills only a slot that is empty or `owner`'s."""
        remember = self._cache.complete
        await self._cache_call(partial(remember, key, owner, fingerprint, response, keep_seconds, self._max_entries))

    async def _cache_call(self, call: Callable[[], Awaitable[T]]) -> T | None:
        """`call`'s answer; None when Redis failed, was slow, or failed less than a backoff ago."""
        if trio.current_time() < self._skip_cache_until:
            return None
        failure: BaseException | str = f"no answer within {CACHE_CALL_SECONDS:g} s"
        with trio.move_on_after(CACHE_CALL_SECONDS):
            try:
                return await call()
            except IdempotencyUnavailable as error:
                failure = error
        self._failures.report(failure)
        self._skip_cache_until = trio.current_time() + CACHE_BACKOFF_SECONDS
        return None
