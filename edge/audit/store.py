"""Where audit rows live: the `audit_log` table in SQLite (default) or PostgreSQL (audit.md § The table).

Both stores are plain blocking code behind one small interface, called from a worker
thread (`trio.to_thread`), one batch per hop: `write(rows)` inserts or updates a batch in one
transaction, `delete_older(cutoff, limit)` is one retention step, `query(sql, args)` reads.

A row belongs to the gateway process that created it (its `node`, the node part of that
process's execution ids): a write changes an existing row only when the row's node is the
writer's (`ON CONFLICT … DO UPDATE … WHERE audit_log.node = excluded.node`). A row of
another gateway under the same execution id is left as it is, and `write` names the
refused ids; never a merge of two executions into one row.
A store connects lazily and reconnects after any failure, so a store that was down (the
file's disk full, PostgreSQL restarting) is used again by the next call without a
restart. Every failure surfaces as `AuditStoreError`, whose message never holds a DSN.

The schema is versioned in `audit_schema`: `MIGRATIONS[i]` takes version i to i + 1, applied
in one transaction at the first connection (PostgreSQL: under an advisory lock, so that
gateways starting together do not race), never by dropping data.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any, Protocol, TypeVar

from edge.audit.rows import COLUMNS, FINAL_STATES, STATES
from shared.postgres import connection_options
from shared.postgres import failure_reason as _postgres_reason

T = TypeVar("T")

SQLITE_BUSY_TIMEOUT_SECONDS = 5.0
POSTGRES_CONNECT_TIMEOUT_SECONDS = 5
# A statement the server holds up (another session's lock, a stuck server) and a peer gone
# without a word (a half-open TCP after a failover) end in an error within seconds instead of
# holding the writer's thread, and the gateway's shutdown with it, without limit.
POSTGRES_STATEMENT_TIMEOUT_MS = 5000
# `hairgate audit` is an operator's one query over a range of days: it holds no writer and no
# request, so it may scan for a minute before it is cut.
POSTGRES_COMMAND_STATEMENT_TIMEOUT_MS = 60_000
POSTGRES_LOCK_TIMEOUT_MS = 2000
READER_POOL_SIZE = 4  # concurrent /admin/audit reads; more wait for a connection
POOL_CLOSE_SECONDS = 1.0  # at shutdown, on the event loop: the pool's threads are idle by then
_MIGRATION_LOCK = 7_125_630_011  # pg_advisory_xact_lock key: "the audit schema is being migrated"

_STATUS_CHECK = "CHECK (status IN ({}))".format(", ".join(f"'{state}'" for state in STATES))
_TABLE = """
CREATE TABLE IF NOT EXISTS audit_log (
    id {id},
    execution_id VARCHAR(64) NOT NULL UNIQUE,
    request_id VARCHAR(64) NOT NULL,
    endpoint VARCHAR(64) NOT NULL,
    idempotency_key CHAR(64),
    client_ip {inet} NOT NULL,
    user_id VARCHAR(64),
    status VARCHAR(20) NOT NULL {check},
    code INTEGER,
    worker INTEGER,
    retry_count INTEGER NOT NULL DEFAULT 0,
    replayed BOOLEAN NOT NULL DEFAULT false,
    queue_ms INTEGER,
    gpu_ms INTEGER,
    duration_ms INTEGER,
    cost_usd NUMERIC(10,6),
    created_at TIMESTAMPTZ NOT NULL DEFAULT {now},
    updated_at TIMESTAMPTZ NOT NULL DEFAULT {now}
)"""
# execution_id's index is its UNIQUE constraint's
_INDEXES = [
    f"CREATE INDEX IF NOT EXISTS audit_log_{column} ON audit_log ({column})"
    for column in ("idempotency_key", "user_id", "created_at")
]
# SQLite spells the PostgreSQL types with its own affinities; ISO-8601 UTC text sorts as time.
_SQLITE_V1 = [
    _TABLE.format(
        id="INTEGER PRIMARY KEY", inet="TEXT", check=_STATUS_CHECK, now="(strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now'))"
    ),
    *_INDEXES,
]
_POSTGRES_V1 = [_TABLE.format(id="BIGSERIAL PRIMARY KEY", inet="INET", check=_STATUS_CHECK, now="NOW()"), *_INDEXES]
# v2: who created the row (its gateway's node: only that gateway updates it) and why a row
# failed without an answer (a gateway restarted under it). Rows of v1 keep NULL in both,
# so no gateway of v2 ever changes them.
_SQLITE_V2 = [
    "ALTER TABLE audit_log ADD COLUMN node VARCHAR(16)",
    "ALTER TABLE audit_log ADD COLUMN reason VARCHAR(64)",
]
_POSTGRES_V2 = [
    "ALTER TABLE audit_log ADD COLUMN IF NOT EXISTS node VARCHAR(16)",
    "ALTER TABLE audit_log ADD COLUMN IF NOT EXISTS reason VARCHAR(64)",
]
# v3: the failure kind a GPU host named (gateway.md § Failure kinds); NULL on older rows.
_SQLITE_V3 = ["ALTER TABLE audit_log ADD COLUMN error_type VARCHAR(32)"]
_POSTGRES_V3 = ["ALTER TABLE audit_log ADD COLUMN IF NOT EXISTS error_type VARCHAR(32)"]
# v4: the model version that produced the answer (seed 002 §6.2: a retry after an upgrade may
# draw another picture, and every figure on record says which analysis measured it); NULL on
# older rows and where no model answered. 64: `shared.contract.model_version_or_none`'s bound.
_SQLITE_V4 = ["ALTER TABLE audit_log ADD COLUMN model_version VARCHAR(64)"]
_POSTGRES_V4 = ["ALTER TABLE audit_log ADD COLUMN IF NOT EXISTS model_version VARCHAR(64)"]
MIGRATIONS = {
    "sqlite": [_SQLITE_V1, _SQLITE_V2, _SQLITE_V3, _SQLITE_V4],
    "postgresql": [_POSTGRES_V1, _POSTGRES_V2, _POSTGRES_V3, _POSTGRES_V4],
}
SCHEMA_VERSION = 4

_CREATED_ONLY = ("execution_id", "request_id", "endpoint", "created_at", "node")
_UPDATED = [column for column in COLUMNS if column not in _CREATED_ONLY]
_UPSERT = (
    "INSERT INTO audit_log ({columns}) VALUES {values} ON CONFLICT (execution_id) DO UPDATE SET "
    + ", ".join(f"{column} = excluded.{column}" for column in _UPDATED)
    + " WHERE audit_log.node = excluded.node"  # another gateway's row: untouched (a row count of 0)
)
_EXECUTION_ID, _NODE = COLUMNS.index("execution_id"), COLUMNS.index("node")


def _refused(cursor: Any, rows: Sequence[tuple[Any, ...]], placeholder: str) -> list[str]:
    """The execution ids of `rows` whose stored row another node created: read after a batch
    whose row count fell short, in its transaction (the common batch pays no read)."""
    if not rows:  # `write([])` opens the store (the schema) and writes nothing
        return []
    ids = [row[_EXECUTION_ID] for row in rows]
    marks = ", ".join(placeholder for _ in ids)
    cursor.execute(f"SELECT execution_id, node FROM audit_log WHERE execution_id IN ({marks})", ids)
    stored = dict(cursor.fetchall())
    return [row[_EXECUTION_ID] for row in rows if stored.get(row[_EXECUTION_ID]) != row[_NODE]]


class AuditStoreError(Exception):
    """The store could not be reached or written; the message names no secret."""


class AuditStore(Protocol):
    """Blocking; called from one worker thread at a time per store."""

    dialect: str  # "sqlite" or "postgresql": the SQL of `edge.audit.queries` differs a little
    where: str  # for logs and the CLI: the file, or "PostgreSQL" (never the DSN)

    def write(self, rows: Sequence[tuple[Any, ...]]) -> list[str]:
        """Insert `rows` (values in `COLUMNS` order), or update those whose row has their node, in
        one transaction; the execution ids of the rows refused (another node's row holds the id)."""

    def delete_older(self, cutoff: datetime, limit: int) -> int:
        """Delete at most `limit` rows created before `cutoff`; how many went."""

    def query(self, sql: str, args: Sequence[Any]) -> list[tuple[Any, ...]]:
        """Rows of a read-only statement written with `?` placeholders."""

    def close(self) -> None: ...


class SqliteAuditStore:
    """One file, WAL mode (readers such as `hairgate audit` never block the writer)."""

    dialect = "sqlite"

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.where = str(self.path)
        self._connection: sqlite3.Connection | None = None
        self._lock = threading.Lock()  # the writer and the readers are different threads

    def _connect(self) -> sqlite3.Connection:
        if self._connection is not None:
            return self._connection
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            connection = sqlite3.connect(
                self.path, timeout=SQLITE_BUSY_TIMEOUT_SECONDS, isolation_level=None, check_same_thread=False
            )
            try:
                connection.execute("PRAGMA journal_mode=WAL")
                connection.execute("PRAGMA synchronous=NORMAL")  # WAL: durable at each checkpoint, never torn
                _migrate_sqlite(connection)
            except BaseException:
                connection.close()
                raise
        except (sqlite3.Error, OSError) as error:
            raise AuditStoreError(f"SQLite {self.path}: {error}") from None
        self._connection = connection
        return connection

    def _run(self, sql: str, args: Sequence[Any] = ()) -> sqlite3.Cursor:
        with self._lock:
            connection = self._connect()
            try:
                return connection.execute(sql, args)
            except (sqlite3.Error, OSError) as error:
                self._drop()
                raise AuditStoreError(f"SQLite {self.path}: {error}") from None

    def write(self, rows: Sequence[tuple[Any, ...]]) -> list[str]:
        values = [_sqlite_values(row) for row in rows]
        with self._lock:
            connection = self._connect()
            try:
                with _sqlite_transaction(connection):
                    changed = sum(
                        connection.execute(*upsert).rowcount for upsert in _sqlite_upserts(connection, values)
                    )
                    return [] if changed == len(values) else _refused(connection.cursor(), values, "?")
            except (sqlite3.Error, OSError) as error:
                self._drop()
                raise AuditStoreError(f"SQLite {self.path}: {error}") from None

    def delete_older(self, cutoff: datetime, limit: int) -> int:
        sql = "DELETE FROM audit_log WHERE id IN (SELECT id FROM audit_log WHERE created_at < ? ORDER BY id LIMIT ?)"
        return self._run(sql, (_sqlite_time(cutoff), limit)).rowcount

    def query(self, sql: str, args: Sequence[Any]) -> list[tuple[Any, ...]]:
        converted = [_sqlite_time(value) if isinstance(value, datetime) else value for value in args]
        return self._run(sql, converted).fetchall()

    def _drop(self) -> None:
        if self._connection is not None:
            with contextlib.suppress(sqlite3.Error):
                self._connection.close()
            self._connection = None

    def close(self) -> None:
        with self._lock:
            self._drop()


_SQLITE_ROW = "({})".format(", ".join("?" for _ in COLUMNS))
_CREATED_AT, _UPDATED_AT = COLUMNS.index("created_at"), COLUMNS.index("updated_at")


def _sqlite_upserts(connection: sqlite3.Connection, values: list[tuple[Any, ...]]) -> Iterator[tuple[str, list[Any]]]:
    """`values` upserted by as few statements as SQLite takes (a row is as many `?` as
    columns): each statement is one step, around which the writer's thread gives the GIL to
    the event loop and waits to take it back. `executemany` took a step per row, and those
    hand-overs cost the event loop more than the rows themselves (issue 41)."""
    rows_per_statement = connection.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER) // len(COLUMNS)
    for start in range(0, len(values), rows_per_statement):
        rows = values[start : start + rows_per_statement]
        sql = _UPSERT.format(columns=", ".join(COLUMNS), values=", ".join([_SQLITE_ROW] * len(rows)))
        yield sql, [value for row in rows for value in row]


def _sqlite_values(row: tuple[Any, ...]) -> tuple[Any, ...]:
    values = list(row)
    for index in (_CREATED_AT, _UPDATED_AT):
        values[index] = _sqlite_time(values[index])
    return tuple(values)


def _sqlite_time(moment: datetime) -> str:
    """ISO 8601 in UTC to the millisecond: one format, so that text order is time order."""
    return moment.isoformat(timespec="milliseconds")


def _apply_migrations(connection: Any, dialect: str, placeholder: str) -> None:
    """Take the schema from its recorded version to `SCHEMA_VERSION`; the caller holds the
    transaction (and, in PostgreSQL, the lock), so a failed step leaves the old version."""
    connection.execute("CREATE TABLE IF NOT EXISTS audit_schema (version INTEGER NOT NULL)")
    row = connection.execute("SELECT version FROM audit_schema").fetchone()
    version = 0 if row is None else row[0]
    for step in MIGRATIONS[dialect][version:]:
        for statement in step:
            connection.execute(statement)
    if row is None:
        connection.execute(f"INSERT INTO audit_schema (version) VALUES ({placeholder})", (SCHEMA_VERSION,))
    else:
        connection.execute(f"UPDATE audit_schema SET version = {placeholder}", (SCHEMA_VERSION,))


@contextlib.contextmanager
def _sqlite_transaction(connection: sqlite3.Connection) -> Iterator[None]:
    """BEGIN IMMEDIATE (the write lock at once, not at the first write) … COMMIT, or
    ROLLBACK on any exception, the COMMIT's own included: all of it or none."""
    connection.execute("BEGIN IMMEDIATE")
    try:
        yield
        connection.execute("COMMIT")
    except BaseException:
        # SQLite may have ended the transaction itself (a full disk: SQLITE_FULL rolls it
        # all back); a ROLLBACK then failed, "cannot rollback - no transaction is active",
        # and that error was reported instead of "database or disk is full" (issue 39). A
        # rollback that fails otherwise loses nothing more: the caller drops the connection.
        if connection.in_transaction:
            with contextlib.suppress(sqlite3.Error):
                connection.execute("ROLLBACK")
        raise


def _migrate_sqlite(connection: sqlite3.Connection) -> None:
    with _sqlite_transaction(connection):
        _apply_migrations(connection, "sqlite", "?")


def _postgres_options(statement_timeout_ms: int) -> dict[str, Any]:
    return connection_options(
        connect_timeout_seconds=POSTGRES_CONNECT_TIMEOUT_SECONDS,
        statement_timeout_ms=statement_timeout_ms,
        lock_timeout_ms=POSTGRES_LOCK_TIMEOUT_MS,
    )


def _migrate_postgres(connection: Any) -> None:
    """Create or migrate the schema; idempotent, and gateways starting together wait in turn."""
    with connection.transaction():
        connection.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
        _apply_migrations(connection, "postgresql", "%s")


def _execute(connection: Any, sql: str, args: Sequence[Any]) -> Any:
    """One statement in one transaction: its rows, or its row count."""
    with connection.transaction():
        cursor = connection.cursor()
        cursor.execute(sql, args)
        rows = cursor.fetchall() if cursor.description is not None else None
        return rows if rows is not None else cursor.rowcount


def _write_postgres(connection: Any, rows: Sequence[tuple[Any, ...]]) -> list[str]:
    """`AuditStore.write` in one transaction (psycopg sums an executemany's row counts)."""
    with connection.transaction():
        cursor = connection.cursor()
        cursor.executemany(_POSTGRES_UPSERT, rows)
        return [] if cursor.rowcount == len(rows) else _refused(cursor, rows, "%s")


class PostgresAuditStore:
    """psycopg 3, synchronous, used from a worker thread (its async API is asyncio-only,
    hence threads under trio): one connection. The writer's: it writes one batch at a time,
    in order, so a pool would add threads and a second reconnect policy for nothing; and the
    CLI's, which runs one query."""

    dialect = "postgresql"
    where = "PostgreSQL"

    def __init__(self, dsn: str, statement_timeout_ms: int | None = None) -> None:
        self._dsn = dsn
        self._statement_timeout_ms = statement_timeout_ms
        self._connection: Any = None
        self._lock = threading.Lock()

    def _connect(self) -> Any:
        import psycopg

        if self._connection is not None and not self._connection.closed:
            return self._connection
        try:
            timeout_ms = self._statement_timeout_ms or POSTGRES_STATEMENT_TIMEOUT_MS
            connection = psycopg.connect(self._dsn, **_postgres_options(timeout_ms))
        except psycopg.Error as error:
            raise AuditStoreError(f"PostgreSQL: cannot connect ({_postgres_reason(error)})") from None
        try:
            _migrate_postgres(connection)
        except psycopg.Error as error:
            connection.close()
            raise AuditStoreError(f"PostgreSQL: schema: {_postgres_reason(error)}") from None
        self._connection = connection
        return connection

    def _run(self, work: Callable[[Any], T]) -> T:
        """`work(connection)` on the writer's connection, psycopg's errors as `AuditStoreError`."""
        import psycopg

        with self._lock:
            connection = self._connect()
            try:
                return work(connection)
            except psycopg.Error as error:
                if connection.closed or connection.broken:
                    self._connection = None
                raise AuditStoreError(f"PostgreSQL: {_postgres_reason(error)}") from None

    def write(self, rows: Sequence[tuple[Any, ...]]) -> list[str]:
        return self._run(partial(_write_postgres, rows=rows))

    def delete_older(self, cutoff: datetime, limit: int) -> int:
        sql = "DELETE FROM audit_log WHERE id IN (SELECT id FROM audit_log WHERE created_at < %s ORDER BY id LIMIT %s)"
        deleted: int = self._run(partial(_execute, sql=sql, args=(cutoff, limit)))
        return deleted

    def query(self, sql: str, args: Sequence[Any]) -> list[tuple[Any, ...]]:
        rows: list[tuple[Any, ...]] = self._run(partial(_execute, sql=sql.replace("?", "%s"), args=args))
        return rows

    def close(self) -> None:
        # A thread abandoned by a bounded shutdown may still hold the lock (its statement
        # ends by the server's timeouts): closing must not wait for it on the event loop.
        if not self._lock.acquire(blocking=False):
            return
        try:
            if self._connection is not None:
                self._connection.close()
                self._connection = None
        finally:
            self._lock.release()


class PostgresAuditReaders(PostgresAuditStore):
    """The gateway's readers (`GET /admin/audit`): a small psycopg_pool pool, so reads that
    arrive together run side by side, each on its own connection, instead of queueing on one.
    The pool checks a connection before lending it and replaces broken ones itself."""

    def __init__(self, dsn: str, size: int = READER_POOL_SIZE) -> None:
        from psycopg_pool import ConnectionPool

        super().__init__(dsn)
        self._pool: ConnectionPool[Any] = ConnectionPool(
            dsn,
            kwargs=_postgres_options(POSTGRES_STATEMENT_TIMEOUT_MS),
            min_size=1,
            max_size=size,
            open=False,  # opened at the first read, in a worker thread
            configure=_migrate_postgres,
            check=ConnectionPool.check_connection,
            name="audit-readers",
        )
        self._opened = False

    def _run(self, work: Callable[[Any], T]) -> T:
        import psycopg

        with self._lock:
            if not self._opened:
                self._pool.open(wait=False)
                self._opened = True
        try:
            with self._pool.connection(timeout=POSTGRES_CONNECT_TIMEOUT_SECONDS) as connection:
                return work(connection)
        except psycopg.Error as error:  # PoolTimeout included: no connection could be made in time
            raise AuditStoreError(f"PostgreSQL: {_postgres_reason(error)}") from None

    def close(self) -> None:
        if self._opened:
            self._pool.close(timeout=POOL_CLOSE_SECONDS)


_POSTGRES_UPSERT = _UPSERT.format(
    columns=", ".join(COLUMNS),
    values="({})".format(", ".join("%s::inet" if column == "client_ip" else "%s" for column in COLUMNS)),
)


def open_store(path: str | Path, postgres_dsn: str, *, readers: bool = False, command: bool = False) -> AuditStore:
    """The store the settings name: PostgreSQL when the DSN secret is set, else SQLite at `path`
    (`readers`: the gateway's concurrent reads, a pool in PostgreSQL; SQLite's WAL reads are local;
    `command`: `hairgate audit`'s one query, with the longer statement timeout).
    Nothing is opened yet: the first call connects (and creates or migrates the schema)."""
    if postgres_dsn:
        if readers:
            return PostgresAuditReaders(postgres_dsn)
        return PostgresAuditStore(postgres_dsn, POSTGRES_COMMAND_STATEMENT_TIMEOUT_MS if command else None)
    return SqliteAuditStore(path)


__all__ = [
    "FINAL_STATES",
    "AuditStore",
    "AuditStoreError",
    "PostgresAuditReaders",
    "PostgresAuditStore",
    "SqliteAuditStore",
    "open_store",
]
