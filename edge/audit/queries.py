"""What the audit trail answers (audit.md § Reading): rows by id or key, who retries, what fails.

Blocking functions over an `AuditStore` (the gateway calls them in a thread, the CLI
directly); the SQL is one text for both stores (`?` placeholders, CASE instead of
FILTER), and every value comes back as JSON types: addresses and times as strings,
costs as floats, booleans as booleans.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from edge.audit.rows import COLUMNS, FAILED, FINAL_STATES
from edge.audit.store import AuditStore

MAX_ROWS = 100
LOOKUP_COLUMNS = ("execution_id", "request_id", "idempotency_key")
FAILURE_GROUPS = ("endpoint", "worker", "code", "error_type")  # error_type: the kind a host named
_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhd])")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
# Far beyond any retention_days, and well within what a datetime can go back from now (a
# cutoff before year 1 would be an OverflowError, not an answer).
MAX_SINCE = timedelta(days=36_500)
_REPLAYS = "SUM(CASE WHEN replayed THEN 1 ELSE 0 END)"
_FINAL = ", ".join(f"'{state}'" for state in FINAL_STATES)


def parse_since(text: str) -> timedelta:
    """ "90s", "30m", "1h", "7d" → a duration of at most MAX_SINCE; ValueError otherwise."""
    match = _DURATION.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"must be a number with s, m, h or d (e.g. 1h), got {text!r}")
    seconds = float(match[1]) * _UNIT_SECONDS[match[2]]
    if seconds > MAX_SINCE.total_seconds():  # compared as a float: timedelta() itself overflows past 10^9 days
        raise ValueError(f"must be at most {MAX_SINCE.days}d (100 years), got {text!r}")
    return timedelta(seconds=seconds)


def rows(store: AuditStore, column: str, value: str) -> list[dict[str, Any]]:
    """The rows whose `column` (one of LOOKUP_COLUMNS) is `value`, newest first, at most MAX_ROWS."""
    if column not in LOOKUP_COLUMNS:
        raise ValueError(f"cannot look rows up by {column!r}")
    sql = f"SELECT {', '.join(COLUMNS)} FROM audit_log WHERE {column} = ? ORDER BY created_at DESC, id DESC LIMIT ?"
    return [_row(values) for values in store.query(sql, (value, MAX_ROWS))]


def retries(store: AuditStore, since: timedelta, top: int) -> dict[str, list[dict[str, Any]]]:
    """Clients (address, user) and idempotency keys with the most retried or replayed executions."""
    cutoff = datetime.now(UTC) - since
    answer: dict[str, list[dict[str, Any]]] = {}
    for name, group, only in (
        ("clients", "client_ip, user_id", ""),
        ("keys", "idempotency_key", "AND idempotency_key IS NOT NULL"),
    ):
        sql = (
            f"SELECT {group}, COUNT(*), SUM(retry_count), {_REPLAYS} FROM audit_log"
            f" WHERE created_at >= ? {only} GROUP BY {group}"
            f" HAVING SUM(retry_count) + {_REPLAYS} > 0"
            f" ORDER BY SUM(retry_count) + {_REPLAYS} DESC, COUNT(*) DESC LIMIT ?"
        )
        names = group.split(", ")
        answer[name] = [
            {
                **{key: _json(value) for key, value in zip(names, found[: len(names)], strict=True)},
                "executions": int(found[-3]), "retries": int(found[-2]), "replays": int(found[-1]),
            }
            for found in store.query(sql, (cutoff, top))
        ]  # fmt: skip
    return answer


def failures(store: AuditStore, since: timedelta) -> dict[str, list[dict[str, Any]]]:
    """The failure share of finished executions by endpoint, by worker, by code and by the
    failure kind a host named (an execution retried elsewhere after a kind, and served, is
    one of that kind's executions, not one of its failures)."""
    cutoff = datetime.now(UTC) - since
    answer: dict[str, list[dict[str, Any]]] = {}
    for group in FAILURE_GROUPS:
        sql = (
            f"SELECT {group}, COUNT(*), SUM(CASE WHEN status = '{FAILED}' THEN 1 ELSE 0 END) FROM audit_log"
            f" WHERE created_at >= ? AND status IN ({_FINAL}) GROUP BY {group} ORDER BY 3 DESC, 2 DESC"
        )
        answer[group] = [
            {
                group: _json(value),
                "executions": int(total),
                "failed": int(failed),
                "share": round(int(failed) / int(total), 4),
            }
            for value, total, failed in store.query(sql, (cutoff,))
        ]
    return answer


def _row(values: tuple[Any, ...]) -> dict[str, Any]:
    row = {column: _json(value) for column, value in zip(COLUMNS, values, strict=True)}
    row["replayed"] = bool(row["replayed"])
    return row


def _json(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, datetime):
        return value.astimezone(UTC).isoformat(timespec="milliseconds")
    return str(value)  # an INET address
