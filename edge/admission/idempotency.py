"""`Idempotency-Key` (gateway.md § Idempotency): run a keyed request once, replay it after.

The router calls `execute(key, fingerprint, run)` once per keyed `/api/` POST, after
`validate_key` and `fingerprint`. `run()` produces the final client-facing response and
says whether it may be stored (a worker's answer: yes; any 1007: no). Only a response a
client can be given (`StoredResponse.replayable`: HTTP 200, an envelope) is ever stored,
replayed or handed to waiters: a departed client's empty answer leaves nothing behind,
and a record that is not one (written by an older version) is discarded and run afresh.

- A completed record with the same fingerprint is replayed; `run` is not called.
- Same key while it runs — in this process (an in-memory flight) or on another gateway
  sharing the store (a PENDING record, polled) — waits and answers the runner's result,
  stored or not. A runner that disappears (cancelled: its marker is released; its process
  died: its lease runs out, as it is renewed only by a live `run()` task) lets one waiter
  take over, so nobody waits forever.
- Same key, other fingerprint: `Result.MISMATCH`, no response (the router answers 1001).
- The store failing raises `IdempotencyUnavailable` before anything runs (the router
  answers 1007); logged once a minute. If it fails only after `run` answered, that answer
  is returned unstored: the work was done once, under protection, and is not thrown away.
"""

from __future__ import annotations

import hashlib
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import TypeVar

import coredis
import trio

from edge.admission.idempotency_cache import CachedStore
from edge.admission.idempotency_postgres import PostgresStore
from edge.admission.idempotency_stores import (
    IdempotencyStore,
    IdempotencyUnavailable,
    RedisStore,
    SqliteStore,
    State,
    StoredResponse,
)
from shared.contract import MSG_IDEMPOTENCY_KEY_INVALID, Code, ContractError
from shared.contract.uploads import multipart_parts
from shared.logs import FailureLog
from shared.settings import IdempotencySettings

__all__ = [
    "Idempotency",
    "IdempotencyUnavailable",
    "Outcome",
    "Result",
    "RunResult",
    "StoredResponse",
    "fingerprint",
    "open_idempotency",
    "store_kind",
    "validate_key",
]

log = logging.getLogger("edge.idempotency")
T = TypeVar("T")

MAX_KEY_LENGTH = 128
LEASE_SECONDS = 15.0  # a runner renews every third of this; a dead one's key frees after it
RELEASED_LINGER_SECONDS = 10.0  # how long waiters elsewhere can still pick up an unstored answer
POLL_INTERVAL_SECONDS = 0.05  # waiting for a runner on another gateway
PURGE_INTERVAL_SECONDS = 60.0
_RELEASE_TIMEOUT_SECONDS = 2.0


def validate_key(value: str) -> str:
    """The key when it is 1–128 printable ASCII characters, else ContractError 1001."""
    if 1 <= len(value) <= MAX_KEY_LENGTH and value.isascii() and value.isprintable():
        return value
    raise ContractError(Code.INVALID_PARAMETER, MSG_IDEMPOTENCY_KEY_INVALID)


def fingerprint(method: str, path: str, body: bytes, content_type: str | None = None) -> str:
    """SHA-256 (hex) of method + path + what the body means; every item is length-prefixed.

    A multipart body counts as its parts in order (name, filename, content type, bytes):
    clients (curl, mobile HTTP stacks) draw a new random boundary for every attempt, and a
    retry of the same photo and fields must match its first attempt, while a changed field
    must not. Any other body (JSON), or a multipart body that does not parse, is its bytes.
    A 2 MB multipart body costs ~3 ms: call it off the event loop for large bodies.
    """
    digest = hashlib.sha256()
    for item in (method.upper().encode(), path.encode()):
        _add(digest, item)
    parts = multipart_parts(body, content_type)
    if parts is None:
        _add(digest, b"bytes")
        _add(digest, body)
        return digest.hexdigest()
    _add(digest, b"multipart")
    for part in parts:
        for text in (part.name, part.filename, part.content_type):
            _add(digest, None if text is None else text.encode("utf-8", "surrogateescape"))
        _add(digest, part.data)
    return digest.hexdigest()


def _add(digest: hashlib._Hash, item: bytes | None) -> None:
    digest.update(_ABSENT if item is None else len(item).to_bytes(8, "big"))
    if item:
        digest.update(item)


_ABSENT = b"\xff" * 8  # a length no item has: None differs from b""


@dataclass(frozen=True)
class RunResult:
    response: StoredResponse
    storable: bool  # False for 1007s (the gateway's: no worker, busy…; a worker's: restart, timeout)


class Result(Enum):
    STORED = "stored"  # ran here, stored
    UNSTORED = "unstored"  # ran here, not stored (not storable, or the store failed after the run)
    REPLAYED = "replayed"  # a completed record answered
    WAITED = "waited"  # another run of the same key answered
    MISMATCH = "mismatch"  # the key belongs to another request


@dataclass(frozen=True)
class Outcome:
    result: Result
    response: StoredResponse | None  # None only for MISMATCH

    @property
    def replayed(self) -> bool:
        """Answer with `Idempotency-Replayed: true` and log `idempotent_replay: true`."""
        return self.result in (Result.REPLAYED, Result.WAITED)


@dataclass
class _Flight:
    """This process's one task handling a key; others with the key wait for its outcome."""

    fingerprint: str
    running: bool = False  # it holds the key in the store and runs it (its lease is renewed)
    key_taken: bool = False  # the key is known to be in use for this fingerprint (here or elsewhere)
    outcome: Outcome | None = None  # None when it ended without an answer
    finished: trio.Event = field(default_factory=trio.Event)


class Idempotency:
    """The rules over one store; start `run()` in the serving nursery (lease renewal, purge)."""

    def __init__(
        self,
        store: IdempotencyStore,
        ttl_seconds: float,
        max_entries: int,
        *,
        lease_seconds: float = LEASE_SECONDS,
        poll_interval_seconds: float = POLL_INTERVAL_SECONDS,
        purge_interval_seconds: float = PURGE_INTERVAL_SECONDS,
    ) -> None:
        self.store = store
        self._ttl_seconds = ttl_seconds
        self._max_entries = max_entries
        self._lease_seconds = lease_seconds
        self._poll_interval_seconds = poll_interval_seconds
        self._purge_interval_seconds = purge_interval_seconds
        self._owner = uuid.uuid4().hex  # this process, as a lease holder in a shared store
        self._flights: dict[str, _Flight] = {}
        self._failures = FailureLog(log, "幂等存储不可用，带 Idempotency-Key 的请求答 1007")

    async def execute(self, key: str, fingerprint: str, run: Callable[[], Awaitable[RunResult]]) -> Outcome:
        """Run `run` at most once for (key, fingerprint) across everyone sharing the store.

        Raises IdempotencyUnavailable when the store fails before `run` was called.
        """
        while (flight := self._flights.get(key)) is not None:
            if flight.key_taken and flight.fingerprint != fingerprint:
                return Outcome(Result.MISMATCH, None)
            await flight.finished.wait()
            if flight.outcome is not None and flight.fingerprint == fingerprint and _shareable(flight.outcome):
                return _as_follower(flight.outcome)
            # It ended without an answer for others (none, a departed client's, another
            # fingerprint's): look again, and run it if nobody else does.
        flight = self._flights[key] = _Flight(fingerprint)
        try:
            flight.outcome = await self._lead(key, flight, run)
            return flight.outcome
        finally:
            del self._flights[key]
            flight.finished.set()

    async def lookup(self, key: str, fingerprint: str) -> StoredResponse | None:
        """The stored response for a replay, without claiming anything (e.g. for a rate-limited client)."""
        record = await self._guarded(self.store.read(key))
        if record is not None and record.state is State.DONE and record.fingerprint == fingerprint:
            return record.answer
        return None

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Renew the leases of what runs here; purge expired and excess records."""
        task_status.started()
        renew_every = self._lease_seconds / 3
        next_purge = trio.current_time()
        while True:
            running = [key for key, flight in self._flights.items() if flight.running]
            try:
                if running:
                    await self._guarded(self.store.renew(running, self._owner, self._lease_seconds))
                if trio.current_time() >= next_purge:
                    next_purge = trio.current_time() + self._purge_interval_seconds
                    await self._guarded(self.store.purge(self._max_entries))
            except IdempotencyUnavailable:
                pass  # logged; requests meanwhile get 1007
            await trio.sleep(renew_every)

    async def aclose(self) -> None:
        await self.store.aclose()

    # --- the steps -------------------------------------------------------------------------

    async def _lead(self, key: str, flight: _Flight, run: Callable[[], Awaitable[RunResult]]) -> Outcome:
        discarded = False
        while True:
            record = await self._guarded(self.store.claim(key, flight.fingerprint, self._owner, self._lease_seconds))
            if record is None:
                return await self._run_owned(key, flight, run)
            if record.fingerprint != flight.fingerprint:
                return Outcome(Result.MISMATCH, None)
            if record.state is State.DONE:
                if (answer := record.answer) is not None:
                    return Outcome(Result.REPLAYED, answer)
                # poisoned (e.g. stored by an older version): never replayed, run afresh
                if discarded:  # it did not go: never loop, never replay it
                    raise IdempotencyUnavailable(f"a record that is no answer could not be discarded: {_key_hash(key)}")
                log.warning("幂等记录不是可重放的应答，已丢弃并重新执行 | key_hash=%s", _key_hash(key))
                await self._guarded(self.store.discard(key, flight.fingerprint))
                discarded = True
                continue
            flight.key_taken = True
            answered = await self._wait_elsewhere(key, flight.fingerprint)
            if answered is not None:
                return Outcome(Result.WAITED, answered)
            # The runner elsewhere gave up or died: claim it ourselves.

    async def _wait_elsewhere(self, key: str, fingerprint: str) -> StoredResponse | None:
        """Poll until the runner elsewhere answers (its response) or vanishes (None)."""
        while True:
            await trio.sleep(self._poll_interval_seconds)
            record = await self._guarded(self.store.read(key))
            if record is None or record.fingerprint != fingerprint:
                return None
            if record.state is not State.PENDING:
                return record.answer

    async def _run_owned(self, key: str, flight: _Flight, run: Callable[[], Awaitable[RunResult]]) -> Outcome:
        flight.running = flight.key_taken = True
        try:
            produced = await run()
        except BaseException:
            await self._free(key, flight)  # cancelled or crashed without an answer
            raise
        if not produced.response.replayable:
            await self._free(key, flight)  # nobody to answer (the client left): nothing is kept
            return Outcome(Result.UNSTORED, produced.response)
        if produced.storable:
            stored = self.store.complete(
                key, self._owner, flight.fingerprint, produced.response, self._ttl_seconds, self._max_entries
            )
            if await self._settle(stored):
                return Outcome(Result.STORED, produced.response)
        else:
            released = self.store.release(
                key, self._owner, flight.fingerprint, produced.response, RELEASED_LINGER_SECONDS
            )
            await self._settle(released)
        return Outcome(Result.UNSTORED, produced.response)

    async def _free(self, key: str, flight: _Flight) -> None:
        """Give the key up at once, so that a waiter (here or elsewhere) runs the request itself."""
        with trio.CancelScope(shield=True), trio.move_on_after(_RELEASE_TIMEOUT_SECONDS):
            await self._settle(self.store.release(key, self._owner, flight.fingerprint, None, 0))

    async def _guarded(self, operation: Awaitable[T]) -> T:
        try:
            return await operation
        except IdempotencyUnavailable as error:
            self._failures.report(error)
            raise

    async def _settle(self, operation: Awaitable[None]) -> bool:
        """After the run: a failing store is logged, never turned into a failed answer."""
        try:
            await operation
        except IdempotencyUnavailable as error:
            self._failures.report(error)
            return False
        return True


def _shareable(outcome: Outcome) -> bool:
    """An answer a same-key request may be given too: a mismatch, or a client-facing answer."""
    return outcome.response is None or outcome.response.replayable


def _key_hash(key: str) -> str:
    """How a key is named in a log: a client's keys may carry meaning (order numbers)."""
    return hashlib.sha256(key.encode()).hexdigest()[:8]


def _as_follower(outcome: Outcome) -> Outcome:
    """What a same-key request that waited in this process gets from the one that led."""
    if outcome.result in (Result.STORED, Result.UNSTORED):
        return Outcome(Result.WAITED, outcome.response)
    return outcome


async def open_idempotency(
    settings: IdempotencySettings,
    redis: coredis.Redis[bytes] | None,
    clock: Callable[[], float] = time.time,
    *,
    postgres_dsn: str = "",
) -> Idempotency:
    """The store `settings.store` names (`store_kind`); PostgreSQL connects in the background.

    Raises IdempotencyUnavailable when the SQLite file cannot be opened, or when the store
    named needs what is not configured.
    """
    ttl_seconds = settings.ttl_hours * 3600
    store: IdempotencyStore
    kind = store_kind(settings, redis is not None, postgres_dsn)
    if kind == "postgresql":
        store = await PostgresStore.open(postgres_dsn)
        if redis is not None:  # the authority is PostgreSQL; Redis only answers replays faster
            store = CachedStore(store, RedisStore(redis, ttl_seconds, clock), settings.max_entries)
    elif kind == "redis":
        assert redis is not None  # store_kind names Redis only when there is one
        store = RedisStore(redis, ttl_seconds, clock)
    else:
        store = await SqliteStore.open(settings.path, clock)
    return Idempotency(store, ttl_seconds, settings.max_entries)


def store_kind(settings: IdempotencySettings, redis_configured: bool, postgres_dsn: str) -> str:
    """ "sqlite", "redis" or "postgresql" (with Redis, when configured, as its cache).

    "auto" (the default): PostgreSQL when `[audit] postgres_dsn` is set, else the shared Redis
    when `edge.shared_state.redis_url` is, else SQLite. Raises IdempotencyUnavailable when the
    named store is not configured.
    """
    if settings.store == "auto":
        return "postgresql" if postgres_dsn else "redis" if redis_configured else "sqlite"
    if settings.store == "postgresql" and not postgres_dsn:
        raise IdempotencyUnavailable('edge.idempotency.store = "postgresql" needs the secret [audit] postgres_dsn')
    if settings.store == "redis" and not redis_configured:
        raise IdempotencyUnavailable('edge.idempotency.store = "redis" needs edge.shared_state.redis_url')
    return settings.store
