"""`hairgate audit show|key|retries|failures`: the audit trail from a shell (audit.md § Reading).

Reads the store the settings name (`--config`, `--secrets`: PostgreSQL when the DSN
secret is set, else the SQLite file at `edge.audit.path`), a table by default, `--json`
for scripts. Exit 0 with rows or without, 1 when the store cannot be read, 2 on bad usage.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

SHOW_COLUMNS = (
    "execution_id", "request_id", "endpoint", "status", "code", "worker", "retry_count", "replayed",
    "queue_ms", "gpu_ms", "duration_ms", "cost_usd", "client_ip", "created_at",
)  # fmt: skip


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", default="settings.toml", help="settings TOML (default: %(default)s)")
    parser.add_argument("--secrets", default=None, help="secrets TOML (default: secrets.toml beside --config)")
    parser.add_argument("--json", action="store_true", help="JSON instead of a table")
    questions = parser.add_subparsers(dest="question", required=True)
    show = questions.add_parser("show", help="the rows of one execution id (or request id)")
    show.add_argument("id", help="an execution id (exec_…) or a request id")
    key = questions.add_parser("key", help="the executions of one Idempotency-Key")
    key.add_argument("key", help="the key as the client sent it")
    key.add_argument("--api-key", default=None, help="the client's edge.rate_limit.key_header value, when one is set")
    for name, what in (("retries", "clients and keys with the most retried or replayed executions"),
                       ("failures", "failure share by endpoint, by worker and by code")):  # fmt: skip
        question = questions.add_parser(name, help=what)
        question.add_argument("--since", default="1h", help="how far back: 90s, 30m, 1h, 7d (default: %(default)s)")
        if name == "retries":
            question.add_argument("--top", type=int, default=10, help="rows per list (default: %(default)s)")


def run(args: argparse.Namespace) -> int:
    from edge.audit import queries
    from edge.audit.store import AuditStoreError, SqliteAuditStore, open_store
    from edge.audit.trail import key_hash
    from shared.settings import SettingsError, load_settings

    try:
        settings = load_settings(args.config, args.secrets)
        since = queries.parse_since(args.since) if args.question in ("retries", "failures") else None
    except (SettingsError, ValueError) as error:
        print(f"hairgate audit: {error}", file=sys.stderr)
        return 2
    audit = settings.edge.audit
    store = open_store(audit.path, settings.audit.postgres_dsn, command=True)
    if isinstance(store, SqliteAuditStore) and not Path(audit.path).exists():
        print(
            f"hairgate audit: no audit file at {audit.path} (edge.audit.path): has a gateway run here?", file=sys.stderr
        )
        return 1
    try:
        if args.question == "show":
            found = queries.rows(store, "execution_id", args.id) or queries.rows(store, "request_id", args.id)
            answer: Any = {"rows": found}
        elif args.question == "key":
            key_header = settings.edge.rate_limit.key_header
            answer = {"rows": queries.rows(store, "idempotency_key", key_hash(args.key, key_header, args.api_key))}
        elif args.question == "retries":
            assert since is not None
            answer = queries.retries(store, since, args.top)
        else:
            assert since is not None
            answer = queries.failures(store, since)
    except AuditStoreError as error:
        print(f"hairgate audit: cannot read the audit store: {error}", file=sys.stderr)
        return 1
    finally:
        store.close()
    if args.json:
        print(json.dumps(answer, ensure_ascii=False, indent=2))
    else:
        _print_tables(answer, SHOW_COLUMNS if args.question in ("show", "key") else None)
    return 0


def _print_tables(answer: dict[str, list[dict[str, Any]]], columns: Sequence[str] | None) -> None:
    for title, rows in answer.items():
        if len(answer) > 1:
            print(f"\n{title}:")
        if not rows:
            print("(none)")
            continue
        names = list(columns or rows[0])
        cells = [[_cell(row.get(name)) for name in names] for row in rows]
        widths = [max(len(name), *(len(line[i]) for line in cells)) for i, name in enumerate(names)]
        print("  ".join(name.ljust(width) for name, width in zip(names, widths, strict=True)))
        for line in cells:
            print("  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)))


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)
