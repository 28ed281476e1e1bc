"""How the gateway's PostgreSQL stores connect (the audit trail, the idempotency records).

psycopg 3, synchronous, used from worker threads: its async API is asyncio-only, hence
threads under trio. Both stores share the connection options (bounded waits, keepalives)
and the one way a failure is named in a log: never the DSN, which may hold a password.
"""

from __future__ import annotations

from typing import Any

# A peer gone without a word (a half-open TCP after a failover) is noticed within seconds.
KEEPALIVE_IDLE_SECONDS, KEEPALIVE_INTERVAL_SECONDS, KEEPALIVE_COUNT = 10, 5, 3


def connection_options(
    *, connect_timeout_seconds: int, statement_timeout_ms: int, lock_timeout_ms: int, autocommit: bool = False
) -> dict[str, Any]:
    """psycopg.connect's keyword arguments: a statement the server holds up (another session's
    lock, a stuck server) ends in an error within these bounds instead of holding a thread."""
    return {
        "connect_timeout": connect_timeout_seconds,
        "options": f"-c statement_timeout={statement_timeout_ms} -c lock_timeout={lock_timeout_ms}",
        "autocommit": autocommit,
        "keepalives": 1,
        "keepalives_idle": KEEPALIVE_IDLE_SECONDS,
        "keepalives_interval": KEEPALIVE_INTERVAL_SECONDS,
        "keepalives_count": KEEPALIVE_COUNT,
    }


def failure_reason(error: Exception) -> str:
    """psycopg's first line (the server's message or libpq's), which names no password."""
    sqlstate = getattr(error, "sqlstate", None)
    first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return f"{first} [{sqlstate}]" if sqlstate else first
