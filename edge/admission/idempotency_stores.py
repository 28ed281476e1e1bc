"""Where idempotency records live: embedded SQLite (default) or a shared Redis.

(PostgreSQL, with Redis as a cache in front, is in `idempotency_postgres` and `idempotency_cache`.)

A record is one key's state: PENDING (an owner is running it and holds a lease it renews),
DONE (the stored response, kept for the TTL) or RELEASED (the owner answered something
that must not be stored, e.g. a gateway-made 1007; kept a few seconds so that those who
waited for it get that answer, but free for the next request to claim). Every operation
is atomic in the store itself (an IMMEDIATE transaction, a Lua script), so several
gateways sharing one store run a key once. Expired records read as absent.

Both stores raise `IdempotencyUnavailable` for any failure of the store (disk full, a
locked, read-only or corrupt file, Redis down); the caller decides what the request gets.
No failure of the store may take the process down: the SQLite file is used in WAL mode
with exclusive locking, which keeps the WAL index in this process's heap instead of a
memory-mapped `-shm` file (a page fault on an `-shm` that cannot be written — immutable,
on a full disk — is SIGBUS, the end of the gateway), and nothing else is memory-mapped.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, Protocol

import coredis
import trio

from edge.shared_state import REDIS_ERRORS
from shared.contract import is_envelope


class IdempotencyUnavailable(Exception):
    """The idempotency store failed; a keyed request gets 1007 and is not run."""


@dataclass(frozen=True)
class StoredResponse:
    """The final client-facing response, replayed byte for byte."""

    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes
    code: int | None

    @property
    def replayable(self) -> bool:
        """An answer a client could be given again: HTTP 200 with an envelope.

        Anything else (a departed client's empty 499, a record written by a buggy
        version) must never be replayed or shared with waiters: the request runs again.
        """
        if self.status != 200:
            return False
        try:
            return is_envelope(json.loads(self.body))
        except (ValueError, UnicodeDecodeError, RecursionError):
            return False


class State(Enum):
    PENDING = "P"
    DONE = "D"
    RELEASED = "R"


@dataclass(frozen=True)
class Record:
    state: State
    fingerprint: str
    response: StoredResponse | None = None  # DONE always; RELEASED when the owner answered
    # What the record has left, where the store says (PostgreSQL): a cached copy lives no longer.
    expires_in_seconds: float | None = None

    @property
    def answer(self) -> StoredResponse | None:
        """The response a client may be given from this record; None when there is none
        or it is no client-facing answer (`StoredResponse.replayable`)."""
        return self.response if self.response is not None and self.response.replayable else None


class IdempotencyStore(Protocol):
    async def claim(self, key: str, fingerprint: str, owner: str, lease_seconds: float) -> Record | None:
        """Take the key (None) unless a live PENDING or DONE record holds it (that record)."""

    async def read(self, key: str) -> Record | None:
        """The live record, or None."""

    async def renew(self, keys: Sequence[str], owner: str, lease_seconds: float) -> None:
        """Extend the leases `owner` still holds on `keys`."""

    async def complete(
        self, key: str, owner: str, fingerprint: str, response: StoredResponse, ttl_seconds: float, max_entries: int
    ) -> None:
        """Store the response (unless another owner took the key over); oldest records beyond max_entries go."""

    async def release(
        self, key: str, owner: str, fingerprint: str, response: StoredResponse | None, linger_seconds: float
    ) -> None:
        """Give the key up: RELEASED with `response` for `linger_seconds`, or deleted when None."""

    async def discard(self, key: str, fingerprint: str) -> None:
        """Delete the DONE record of (key, fingerprint): its response must not be replayed."""

    async def purge(self, max_entries: int) -> None:
        """Drop expired records and the oldest beyond max_entries."""

    async def aclose(self) -> None: ...


def headers_json(response: StoredResponse) -> str:
    """A response's headers as a table stores them (a JSON list of pairs)."""
    return json.dumps(response.headers, ensure_ascii=False)


def response_from_row(status: int, headers: str, body: bytes, code: int | None) -> StoredResponse:
    return StoredResponse(status, tuple((name, value) for name, value in json.loads(headers)), bytes(body), code)


# --- SQLite ----------------------------------------------------------------------------------

_SCHEMA = """
CREATE TABLE IF NOT EXISTS idempotency (
    key TEXT PRIMARY KEY,
    state TEXT NOT NULL,
    owner TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    created_at REAL NOT NULL,
    expires_at REAL NOT NULL,
    status INTEGER,
    headers TEXT,
    body BLOB,
    code INTEGER
);
CREATE INDEX IF NOT EXISTS idempotency_created ON idempotency (created_at);
CREATE INDEX IF NOT EXISTS idempotency_expires ON idempotency (expires_at);
"""

_COLUMNS = "state, fingerprint, status, headers, body, code"


def _sqlite_record(row: tuple[Any, ...] | None) -> Record | None:
    if row is None:
        return None
    state, fingerprint, status, headers, body, code = row
    response = response_from_row(status, headers, body, code) if status is not None else None
    return Record(State(state), fingerprint, response)


class SqliteStore:
    """One connection, used by one thread at a time (a CapacityLimiter of 1), WAL mode.

    Times are wall-clock seconds from `clock` (records outlive the process). The file
    belongs to one process (exclusive locking: see the module docstring): a second
    gateway naming it fails to open it ("database is locked"); gateways that share
    idempotency share a Redis (`edge.shared_state.redis_url`).
    """

    def __init__(self, connection: sqlite3.Connection, clock: Callable[[], float]) -> None:
        self._connection = connection
        self._clock = clock
        self._limiter = trio.CapacityLimiter(1)

    @classmethod
    async def open(cls, path: str | Path, clock: Callable[[], float] = time.time) -> SqliteStore:
        """Raises IdempotencyUnavailable when the file cannot be opened (bad path, full disk)."""
        try:
            return cls(await trio.to_thread.run_sync(_connect, Path(path)), clock)
        except (sqlite3.Error, OSError) as error:
            raise IdempotencyUnavailable(f"SQLite {path}: {error}") from error

    async def _call(self, function: Callable[..., Any], *args: Any) -> Any:
        try:
            return await trio.to_thread.run_sync(function, *args, limiter=self._limiter)
        except (sqlite3.Error, OSError) as error:
            raise IdempotencyUnavailable(f"SQLite: {error}") from error

    async def claim(self, key: str, fingerprint: str, owner: str, lease_seconds: float) -> Record | None:
        return await self._call(self._claim, key, fingerprint, owner, self._clock(), lease_seconds)

    def _claim(self, key: str, fingerprint: str, owner: str, now: float, lease_seconds: float) -> Record | None:
        with _transaction(self._connection):
            live = self._live(key, now)
            if live is not None and live.state is not State.RELEASED:
                return live
            self._connection.execute(
                "INSERT OR REPLACE INTO idempotency (key, state, owner, fingerprint, created_at, expires_at)"
                " VALUES (?, 'P', ?, ?, ?, ?)",
                (key, owner, fingerprint, now, now + lease_seconds),
            )
            return None

    def _live(self, key: str, now: float) -> Record | None:
        row = self._connection.execute(
            f"SELECT {_COLUMNS} FROM idempotency WHERE key = ? AND expires_at > ?", (key, now)
        ).fetchone()
        return _sqlite_record(row)

    async def read(self, key: str) -> Record | None:
        return await self._call(self._live, key, self._clock())

    async def renew(self, keys: Sequence[str], owner: str, lease_seconds: float) -> None:
        await self._call(self._renew, list(keys), owner, self._clock() + lease_seconds)

    def _renew(self, keys: list[str], owner: str, expires_at: float) -> None:
        with _transaction(self._connection):
            self._connection.executemany(
                "UPDATE idempotency SET expires_at = ? WHERE key = ? AND state = 'P' AND owner = ?",
                [(expires_at, key, owner) for key in keys],
            )

    async def complete(
        self, key: str, owner: str, fingerprint: str, response: StoredResponse, ttl_seconds: float, max_entries: int
    ) -> None:
        await self._call(
            self._store, key, owner, fingerprint, response, State.DONE, ttl_seconds, self._clock(), max_entries
        )

    async def release(
        self, key: str, owner: str, fingerprint: str, response: StoredResponse | None, linger_seconds: float
    ) -> None:
        if response is None:
            await self._call(self._delete_owned, key, owner)
        else:
            await self._call(
                self._store, key, owner, fingerprint, response, State.RELEASED, linger_seconds, self._clock()
            )

    def _store(
        self,
        key: str,
        owner: str,
        fingerprint: str,
        response: StoredResponse,
        state: State,
        keep: float,
        now: float,
        max_entries: int = 0,  # 0: no bound (a RELEASED record lingers seconds only)
    ) -> None:
        with _transaction(self._connection):
            # Ours, or nobody's any more (our lease ran out and no one took it over).
            current = self._connection.execute(
                "SELECT owner FROM idempotency WHERE key = ? AND expires_at > ? AND state != 'R'", (key, now)
            ).fetchone()
            if current is not None and current[0] != owner:
                return
            self._connection.execute(
                "INSERT OR REPLACE INTO idempotency VALUES (?, ?, '', ?, ?, ?, ?, ?, ?, ?)",
                (
                    key,
                    state.value,
                    fingerprint,
                    now,
                    now + keep,
                    response.status,
                    headers_json(response),
                    response.body,
                    response.code,
                ),
            )
            if max_entries:
                self._trim(max_entries)  # bounded on insert, not only at the next purge

    async def discard(self, key: str, fingerprint: str) -> None:
        await self._call(self._discard, key, fingerprint)

    def _discard(self, key: str, fingerprint: str) -> None:
        with _transaction(self._connection):
            self._connection.execute(
                "DELETE FROM idempotency WHERE key = ? AND state = 'D' AND fingerprint = ?", (key, fingerprint)
            )

    def _delete_owned(self, key: str, owner: str) -> None:
        with _transaction(self._connection):
            self._connection.execute(
                "DELETE FROM idempotency WHERE key = ? AND state = 'P' AND owner = ?", (key, owner)
            )

    async def purge(self, max_entries: int) -> None:
        await self._call(self._purge, max_entries, self._clock())

    def _purge(self, max_entries: int, now: float) -> None:
        with _transaction(self._connection):
            self._connection.execute("DELETE FROM idempotency WHERE expires_at <= ?", (now,))
            self._trim(max_entries)

    def _trim(self, max_entries: int) -> None:
        """Inside a transaction: drop the oldest finished records beyond `max_entries` (COUNT is µs)."""
        (count,) = self._connection.execute("SELECT COUNT(*) FROM idempotency").fetchone()
        if count > max_entries:
            self._connection.execute(
                "DELETE FROM idempotency WHERE key IN"
                " (SELECT key FROM idempotency WHERE state != 'P' ORDER BY created_at LIMIT ?)",
                (count - max_entries,),
            )

    async def aclose(self) -> None:
        await trio.to_thread.run_sync(self._connection.close, limiter=self._limiter)


def _connect(path: Path) -> sqlite3.Connection:
    path.parent.mkdir(parents=True, exist_ok=True)
    # isolation_level=None: transactions are explicit (_transaction); the limiter makes
    # sure only one thread at a time uses the connection.
    # timeout: only another process can hold the lock (a second gateway naming this file):
    # it never lets go, so waiting long would only delay that gateway's error at start
    connection = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=1)
    try:
        # Exclusive locking BEFORE the first access of the file: SQLite then keeps the WAL
        # index in the heap and never maps an `-shm` file (module docstring).
        connection.execute("PRAGMA locking_mode=EXCLUSIVE")
        connection.execute("PRAGMA mmap_size=0")
        (mode,) = connection.execute("PRAGMA journal_mode=WAL").fetchone()
        if mode != "wal":
            raise sqlite3.OperationalError(f"journal_mode is {mode}, not wal (a read-only file?)")
        connection.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL survives a process crash
        connection.executescript(_SCHEMA)
    except BaseException:
        connection.close()
        raise
    return connection


class _transaction:
    """BEGIN IMMEDIATE … COMMIT, or ROLLBACK on any error: atomic against other processes too."""

    def __init__(self, connection: sqlite3.Connection) -> None:
        self._connection = connection

    def __enter__(self) -> None:
        self._connection.execute("BEGIN IMMEDIATE")

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        if kind is None:
            try:
                self._connection.execute("COMMIT")
                return
            except sqlite3.Error:
                self._rollback()  # a failed COMMIT (disk full) would leave the connection stuck in it
                raise
        self._rollback()

    def _rollback(self) -> None:
        if self._connection.in_transaction:
            # the error that brought us here is the one to report
            with contextlib.suppress(sqlite3.Error):
                self._connection.execute("ROLLBACK")


# --- Redis -----------------------------------------------------------------------------------
#
# One string per key: state (1 byte) + owner (32 hex, PENDING only, else spaces) + a JSON
# header line + the body. Scripts look only at the first 33 bytes.

_OWNER_LENGTH = 32
_NO_OWNER = " " * _OWNER_LENGTH

_CLAIM = """
local v = redis.call('GET', KEYS[1])
if v and string.sub(v, 1, 1) ~= 'R' then return v end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return false
"""

_RENEW = """
for _, key in ipairs(KEYS) do
  local v = redis.call('GET', key)
  if v and string.sub(v, 1, 33) == 'P' .. ARGV[1] then redis.call('PEXPIRE', key, ARGV[2]) end
end
return 0
"""

# KEYS: record, index; ARGV: owner, value, keep_ms, now_ms, max_entries (0: no index).
_STORE = """
local v = redis.call('GET', KEYS[1])
if v and string.sub(v, 1, 1) ~= 'R' and string.sub(v, 1, 33) ~= 'P' .. ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
local max_entries = tonumber(ARGV[5])
if max_entries > 0 then
  redis.call('ZADD', KEYS[2], ARGV[4], KEYS[1])
  local excess = redis.call('ZCARD', KEYS[2]) - max_entries
  if excess > 0 then
    local oldest = redis.call('ZPOPMIN', KEYS[2], excess)
    for i = 1, #oldest, 2 do redis.call('DEL', oldest[i]) end
  end
end
return 1
"""

_DELETE_OWNED = """
local v = redis.call('GET', KEYS[1])
if v and string.sub(v, 1, 33) == 'P' .. ARGV[1] then redis.call('DEL', KEYS[1]) end
return 0
"""


# KEYS: record; ARGV: fingerprint. The JSON header starts after state + owner (byte 34).
_DISCARD = """
local v = redis.call('GET', KEYS[1])
if v and string.sub(v, 1, 1) == 'D' then
  local header_end = string.find(v, '\\n', 34, true)
  if header_end and cjson.decode(string.sub(v, 34, header_end - 1))['fp'] == ARGV[1] then redis.call('DEL', KEYS[1]) end
end
return 0
"""


def _encode(state: State, owner: str, fingerprint: str, response: StoredResponse | None) -> bytes:
    header: dict[str, Any] = {"fp": fingerprint}
    body = b""
    if response is not None:
        header.update(status=response.status, headers=response.headers, code=response.code)
        body = response.body
    return (state.value + owner).encode() + json.dumps(header, ensure_ascii=False).encode() + b"\n" + body


def _decode(value: bytes) -> Record:
    state = State(value[:1].decode())
    header_end = value.index(b"\n", _OWNER_LENGTH + 1)
    header = json.loads(value[_OWNER_LENGTH + 1 : header_end])
    response = None
    if "status" in header:
        response = StoredResponse(
            header["status"], tuple((n, v) for n, v in header["headers"]), value[header_end + 1 :], header["code"]
        )
    return Record(state, header["fp"], response)


class RedisStore:
    """Records under `hairgate:idem:<key>`; a sorted set indexes DONE records by age for max_entries.

    Expiry is Redis' own (PX), so purging is Redis' job; `purge` only trims the index.
    """

    PREFIX = "hairgate:idem:"
    INDEX = "hairgate:idem-index"

    def __init__(self, redis: coredis.Redis[bytes], ttl_seconds: float, clock: Callable[[], float] = time.time) -> None:
        self._redis = redis
        self._ttl_seconds = ttl_seconds
        self._clock = clock
        self._claim = redis.register_script(_CLAIM)
        self._renew = redis.register_script(_RENEW)
        self._store = redis.register_script(_STORE)
        self._delete_owned = redis.register_script(_DELETE_OWNED)
        self._discard = redis.register_script(_DISCARD)

    async def _call(self, operation: Any) -> Any:
        try:
            return await operation
        except REDIS_ERRORS as error:
            raise IdempotencyUnavailable(f"Redis: {error}") from error

    async def claim(self, key: str, fingerprint: str, owner: str, lease_seconds: float) -> Record | None:
        pending = _encode(State.PENDING, owner, fingerprint, None)
        value = await self._call(self._claim(keys=[self.PREFIX + key], args=[pending, _ms(lease_seconds)]))
        return None if value is None else _decode(value)

    async def read(self, key: str) -> Record | None:
        value = await self._call(self._redis.get(self.PREFIX + key))
        return None if value is None else _decode(value)

    async def renew(self, keys: Sequence[str], owner: str, lease_seconds: float) -> None:
        if keys:
            await self._call(self._renew(keys=[self.PREFIX + k for k in keys], args=[owner, _ms(lease_seconds)]))

    async def complete(
        self, key: str, owner: str, fingerprint: str, response: StoredResponse, ttl_seconds: float, max_entries: int
    ) -> None:
        value = _encode(State.DONE, _NO_OWNER, fingerprint, response)
        await self._write(key, owner, value, ttl_seconds, max_entries)

    async def release(
        self, key: str, owner: str, fingerprint: str, response: StoredResponse | None, linger_seconds: float
    ) -> None:
        if response is None:
            await self._call(self._delete_owned(keys=[self.PREFIX + key], args=[owner]))
        else:
            await self._write(key, owner, _encode(State.RELEASED, _NO_OWNER, fingerprint, response), linger_seconds, 0)

    async def discard(self, key: str, fingerprint: str) -> None:
        await self._call(self._discard(keys=[self.PREFIX + key], args=[fingerprint]))

    async def _write(self, key: str, owner: str, value: bytes, keep_seconds: float, max_entries: int) -> None:
        args: list[str | bytes | int] = [owner, value, _ms(keep_seconds), _ms(self._clock()), max_entries]
        await self._call(self._store(keys=[self.PREFIX + key, self.INDEX], args=args))

    async def purge(self, max_entries: int) -> None:
        expired_before = _ms(self._clock() - self._ttl_seconds)
        await self._call(self._redis.zremrangebyscore(self.INDEX, float("-inf"), expired_before))

    async def aclose(self) -> None:
        """The client belongs to whoever opened it (shared with the rate limiter)."""


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))
