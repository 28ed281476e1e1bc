"""Idempotency records in PostgreSQL: the authority every gateway naming `[audit] postgres_dsn` shares.

The records and rules of `idempotency_stores` (PENDING under a lease, DONE for the TTL,
RELEASED for a few seconds), one row per key in the table `idempotency`, beside the audit
trail's. Every operation is one autocommit statement, atomic in the server:

- `claim` is `INSERT … ON CONFLICT (key) DO UPDATE … WHERE <the row is free>`: a new key is
  inserted; a row whose lease or TTL has run out, a RELEASED one, or a PENDING one this
  process left behind is taken over; a live one is left as it is and then read. Two gateways
  claiming one key together: the server lets one row win, the other gateway reads it.
- `complete` and `release` are the same upsert, applied only to a row still ours (or free).
- Times are the server's (`clock_timestamp()`): gateways whose clocks differ still agree on
  when a lease ends.

I/O as in `edge.audit.store`: psycopg's synchronous API in worker threads (its async API is
asyncio-only), here a psycopg_pool pool of `POOL_SIZE` connections, one thread each. It
connects in the background: a PostgreSQL that is down at start does not stop the gateway;
keyed requests get 1007 until it is back. After a restart of the server the pool's
connections are dead: the call that meets one has the pool checked and runs once more
(every statement here may run twice without harm: see `_FREE`). Every failure is
`IdempotencyUnavailable`, whose message names no DSN.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, TypeVar

import trio

from edge.admission.idempotency_stores import (
    IdempotencyUnavailable,
    Record,
    State,
    StoredResponse,
    headers_json,
    response_from_row,
)
from shared.postgres import connection_options, failure_reason

T = TypeVar("T")

POOL_SIZE = 4  # statements at once (each a thread); more keyed requests wait for one
CONNECT_TIMEOUT_SECONDS = 5
# A keyed request waits this long for a connection (PostgreSQL down: the pool has none),
# then gets 1007: not the whole request timeout for a store that is not there.
CONNECTION_WAIT_SECONDS = 2.0
# One key's statement touches one row: seconds mean a stuck server, not work.
STATEMENT_TIMEOUT_MS, LOCK_TIMEOUT_MS = 2000, 1000
PURGE_BATCH = 5000  # expired rows deleted per statement: a long downtime's backlog never trips the timeout
CLOSE_SECONDS = 1.0
_SCHEMA_LOCK = 7_125_630_012  # pg_advisory_xact_lock key: "the idempotency table is being created"
_CLAIM_ATTEMPTS = 3  # a held row that vanishes before it is read (its owner gave up) is claimed again

_SCHEMA = [
    """CREATE TABLE IF NOT EXISTS idempotency (
    key TEXT PRIMARY KEY,
    state CHAR(1) NOT NULL CHECK (state IN ('P', 'D', 'R')),
    owner VARCHAR(32) NOT NULL,
    fingerprint CHAR(64) NOT NULL,
    created_at TIMESTAMPTZ NOT NULL,
    expires_at TIMESTAMPTZ NOT NULL,
    status INTEGER,
    headers TEXT,
    body BYTEA,
    code INTEGER
)""",
    "CREATE INDEX IF NOT EXISTS idempotency_expires ON idempotency (expires_at)",
    "CREATE INDEX IF NOT EXISTS idempotency_created ON idempotency (created_at)",
]

# A row another request may take: its time is up, it was released, or it is a PENDING row of
# this very process (`owner`), which holds no flight for the key when it claims it: one left
# behind by a release that did not get through, or by this statement itself, run again after
# the connection broke before its answer came back.
_FREE = "held.expires_at <= clock_timestamp() OR held.state = 'R' OR (held.state = 'P' AND held.owner = %(owner)s)"
_COLUMNS = ("state", "owner", "fingerprint", "created_at", "expires_at", "status", "headers", "body", "code")
_PUT = (
    f"INSERT INTO idempotency AS held (key, {', '.join(_COLUMNS)}) VALUES (%(key)s, %(state)s, %(row_owner)s,"
    " %(fingerprint)s, clock_timestamp(), clock_timestamp() + make_interval(secs => %(keep)s),"
    " %(status)s, %(headers)s, %(body)s, %(code)s)"
    f" ON CONFLICT (key) DO UPDATE SET ({', '.join(_COLUMNS)}) = ROW({', '.join(f'excluded.{c}' for c in _COLUMNS)})"
    f" WHERE {_FREE} RETURNING 1"
)
_RECORD = "state, fingerprint, status, headers, body, code, EXTRACT(EPOCH FROM expires_at - clock_timestamp())::float8"
_READ = f"SELECT {_RECORD} FROM idempotency WHERE key = %s AND expires_at > clock_timestamp()"
_HELD = _READ + " AND state <> 'R'"
_RENEW = (
    "UPDATE idempotency SET expires_at = clock_timestamp() + make_interval(secs => %s)"
    " WHERE key = ANY(%s) AND state = 'P' AND owner = %s"
)
_DELETE_OWNED = "DELETE FROM idempotency WHERE key = %s AND state = 'P' AND owner = %s"
_DISCARD = "DELETE FROM idempotency WHERE key = %s AND state = 'D' AND fingerprint = %s"
_DELETE_EXPIRED = (
    "DELETE FROM idempotency WHERE key IN (SELECT key FROM idempotency WHERE expires_at <= clock_timestamp() LIMIT %s)"
)
_TRIM = (
    "DELETE FROM idempotency WHERE key IN (SELECT key FROM idempotency WHERE state <> 'P' ORDER BY created_at"
    " LIMIT GREATEST(0, (SELECT COUNT(*) FROM idempotency) - %s))"
)


class PostgresStore:
    """`IdempotencyStore` over a psycopg_pool pool; `complete_owned` says whether it stored."""

    def __init__(self, dsn: str, pool_size: int = POOL_SIZE) -> None:
        from psycopg_pool import ConnectionPool

        options = connection_options(
            connect_timeout_seconds=CONNECT_TIMEOUT_SECONDS,
            statement_timeout_ms=STATEMENT_TIMEOUT_MS,
            lock_timeout_ms=LOCK_TIMEOUT_MS,
            autocommit=True,  # one statement, one transaction: no BEGIN/COMMIT round trips
        )
        self._pool: ConnectionPool[Any] = ConnectionPool(
            dsn, kwargs=options, min_size=1, max_size=pool_size, open=False, configure=_create_table, name="idempotency"
        )
        self._limiter = trio.CapacityLimiter(pool_size)
        self._opened = False

    @classmethod
    async def open(cls, dsn: str, pool_size: int = POOL_SIZE) -> PostgresStore:
        """The store, connecting in the background (nothing here waits for the server)."""
        store = cls(dsn, pool_size)
        await trio.to_thread.run_sync(partial(store._pool.open, wait=False))
        store._opened = True
        return store

    async def _call(self, work: Callable[[Any], T]) -> T:
        return await trio.to_thread.run_sync(self._run, work, limiter=self._limiter)

    def _run(self, work: Callable[[Any], T]) -> T:
        import psycopg

        for again in (True, False):
            connection = None
            try:
                with self._pool.connection(timeout=CONNECTION_WAIT_SECONDS) as connection:
                    return work(connection)
            except psycopg.Error as error:  # PoolTimeout included: no connection in time
                if again and connection is not None and connection.broken:
                    # A restarted server: replace every dead connection at once, not one per request.
                    self._pool.check()
                    continue
                raise IdempotencyUnavailable(f"PostgreSQL: {failure_reason(error)}") from None
        raise AssertionError("unreachable: the second attempt returns or raises")

    async def claim(self, key: str, fingerprint: str, owner: str, lease_seconds: float) -> Record | None:
        return await self._call(partial(_claim, key=key, fingerprint=fingerprint, owner=owner, lease=lease_seconds))

    async def read(self, key: str) -> Record | None:
        return await self._call(partial(_record, sql=_READ, key=key))

    async def renew(self, keys: Sequence[str], owner: str, lease_seconds: float) -> None:
        if keys:
            await self._call(partial(_execute, sql=_RENEW, args=(lease_seconds, list(keys), owner)))

    async def complete(
        self, key: str, owner: str, fingerprint: str, response: StoredResponse, ttl_seconds: float, max_entries: int
    ) -> None:
        await self.complete_owned(key, owner, fingerprint, response, ttl_seconds)

    async def complete_owned(
        self, key: str, owner: str, fingerprint: str, response: StoredResponse, ttl_seconds: float
    ) -> bool:
        """Store the response; False when the row was no longer ours (another owner took the key
        over after our lease ran out). Beyond max_entries the oldest go at the next `purge`:
        a COUNT on every insert would cost more than a minute's overshoot."""
        put = partial(_put, key=key, owner=owner, fingerprint=fingerprint, state=State.DONE, keep=ttl_seconds)
        return await self._call(partial(put, response=response))

    async def release(
        self, key: str, owner: str, fingerprint: str, response: StoredResponse | None, linger_seconds: float
    ) -> None:
        if response is None:
            await self._call(partial(_execute, sql=_DELETE_OWNED, args=(key, owner)))
        else:
            put = partial(_put, key=key, owner=owner, fingerprint=fingerprint, state=State.RELEASED)
            await self._call(partial(put, keep=linger_seconds, response=response))

    async def discard(self, key: str, fingerprint: str) -> None:
        await self._call(partial(_execute, sql=_DISCARD, args=(key, fingerprint)))

    async def purge(self, max_entries: int) -> None:
        await self._call(partial(_purge, max_entries=max_entries))

    async def aclose(self) -> None:
        if self._opened:
            await trio.to_thread.run_sync(partial(self._pool.close, timeout=CLOSE_SECONDS))


def _create_table(connection: Any) -> None:
    """Each new connection: the table, created once; gateways starting together wait in turn."""
    with connection.transaction():
        connection.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
        for statement in _SCHEMA:
            connection.execute(statement)


def _claim(connection: Any, key: str, fingerprint: str, owner: str, lease: float) -> Record | None:
    for _ in range(_CLAIM_ATTEMPTS):
        if _put(connection, key, owner, fingerprint, State.PENDING, lease, None):
            return None
        held = _record(connection, _HELD, key)
        if held is not None:
            return held
    raise IdempotencyUnavailable(f"PostgreSQL: the key changed hands {_CLAIM_ATTEMPTS} times during one claim")


def _put(
    connection: Any,
    key: str,
    owner: str,
    fingerprint: str,
    state: State,
    keep: float,
    response: StoredResponse | None,
) -> bool:
    """Write the row unless another owner holds it; whether it was written."""
    values = {
        "key": key,
        "owner": owner,
        "state": state.value,
        "row_owner": owner if state is State.PENDING else "",  # only a lease has an owner
        "fingerprint": fingerprint,
        "keep": keep,
        "status": None if response is None else response.status,
        "headers": None if response is None else headers_json(response),
        "body": None if response is None else response.body,
        "code": None if response is None else response.code,
    }
    return connection.execute(_PUT, values).fetchone() is not None


def _record(connection: Any, sql: str, key: str) -> Record | None:
    row = connection.execute(sql, (key,)).fetchone()
    if row is None:
        return None
    state, fingerprint, status, headers, body, code, expires_in = row
    response = response_from_row(status, headers, body, code) if status is not None else None
    return Record(State(state), fingerprint, response, expires_in)


def _execute(connection: Any, sql: str, args: Sequence[Any]) -> None:
    connection.execute(sql, args)


def _purge(connection: Any, max_entries: int) -> None:
    while connection.execute(_DELETE_EXPIRED, (PURGE_BATCH,)).rowcount == PURGE_BATCH:
        pass
    connection.execute(_TRIM, (max_entries,))
