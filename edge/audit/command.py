"""`hairgate audit show|key|retries|failures`: the audit trail from a shell (audit.md § Reading).

Reads the store the settings name (`--config`, `--secrets`: PostgreSQL when the DSN
secret is set, else the SQLite file at `edge.audit.path`), a table by default, `--json`
for scripts. Those three go before or after the question, as people type them
(`hairgate audit failures --since 1h --json`). Exit 0 with rows or without, 1 when the
store cannot be read, 2 on bad usage (argparse's usage line and a message, never a traceback).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

SHOW_COLUMNS = (
    "execution_id", "request_id", "endpoint", "status", "code", "worker", "retry_count", "replayed",
    "queue_ms", "gpu_ms", "duration_ms", "cost_usd", "client_ip", "created_at", "reason", "model_version",
)  # fmt: skip
MAX_TOP = 1000  # rows per list: a screenful is the point; a LIMIT the stores take whatever the int


def add_arguments(parser: argparse.ArgumentParser) -> None:
    _add_common(parser, defaults=True)
    questions = parser.add_subparsers(dest="question", required=True)

    def question(name: str, what: str) -> argparse.ArgumentParser:
        asked = questions.add_parser(name, help=what)
        _add_common(asked, defaults=False)
        return asked

    question("show", "the rows of one execution id (or request id)").add_argument(
        "id", help="an execution id (exec_…) or a request id"
    )
    key = question("key", "the executions of one Idempotency-Key")
    key.add_argument("key", help="the key as the client sent it")
    key.add_argument("--api-key", default=None, help="the client's edge.rate_limit.key_header value, when one is set")
    retries = question("retries", "clients and keys with the most retried or replayed executions")
    failures = question("failures", "failure share by endpoint, by worker, by code and by failure kind")
    for asked in (retries, failures):
        asked.add_argument("--since", type=_since, default="1h", help="how far back: 90s, 30m, 1h, 7d (default: 1h)")
    retries.add_argument("--top", type=_top, default=10, help=f"rows per list, 1-{MAX_TOP} (default: %(default)s)")


def _add_common(parser: argparse.ArgumentParser, *, defaults: bool) -> None:
    """--config, --secrets, --json: on `audit` with their defaults, and again on each question
    with none (argparse.SUPPRESS), so that one given after the question is kept and one given
    before it is not reset by the question's parser."""

    def default(value: Any) -> Any:
        return value if defaults else argparse.SUPPRESS

    parser.add_argument("--config", default=default("settings.toml"), help="settings TOML (default: settings.toml)")
    parser.add_argument("--secrets", default=default(None), help="secrets TOML (default: secrets.toml beside --config)")
    parser.add_argument("--json", action="store_true", default=default(False), help="JSON instead of a table")


def _since(text: str) -> timedelta:
    from edge.audit.queries import parse_since  # imported when used: `hairgate --help` stays instant

    try:
        return parse_since(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _top(text: str) -> int:
    try:
        top = int(text)
    except ValueError:
        top = 0
    if not 1 <= top <= MAX_TOP:
        raise argparse.ArgumentTypeError(f"must be a whole number from 1 to {MAX_TOP}, got {text!r}")
    return top


def run(args: argparse.Namespace) -> int:
    from edge.audit import queries
    from edge.audit.store import AuditStoreError, SqliteAuditStore, open_store
    from edge.audit.trail import key_hash
    from shared.settings import SettingsError, load_settings

    try:
        settings = load_settings(args.config, args.secrets)
    except SettingsError as error:
        print(f"hairgate audit: {error}", file=sys.stderr)
        return 2
    since = getattr(args, "since", None)  # parsed by argparse (`_since`)
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
