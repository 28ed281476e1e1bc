#!/usr/bin/env python3
"""Seed 002 §5.4's pre-launch checks that are safe against a LIVE gateway, as a pass/fail table.

    scripts/prelaunch.py --gateway URL [--token T | --secrets FILE] [--timeout S]

Point URL at ONE gateway (not a load balancer): the log check reads that gateway's
`/admin/stats`. What it runs, in order (about ten requests, well inside the default burst):

1. idempotency  — 4 concurrent POSTs with one fresh random Idempotency-Key: identical
   answers, exactly 3 marked `Idempotency-Replayed: true`; a 5th later is a replay too;
   the key with another body is refused 1001. The image is 8x6 px, so a GPU host refuses
   it for its resolution without running a model: no GPU time is spent.
2. parameters   — `mark` with `drop_mm: 1000` (range 0–40) and a valid 480x640 image → 1001.
3. oversize     — a 4 MB upload → 1003 (the round trip is printed; the server-side time
   is in the request log's `duration_ms`).
4. request log  — `/admin/stats` `since_start.requests` grew by at least what this script
   sent, and `replays` by at least the replays it got.
5. audit        — every answer named its execution (`X-Execution-ID`); `/admin/audit` has
   one finished row for each, and every completed row has every column filled
   (`cost_usd`, `duration_ms`, `retry_count`, `gpu_ms`, `worker` — none for a replay — …).

Not run, because they are not safe or not observable on a live system (run them as the
end-to-end tests in tests/edge/e2e/test_e2e_prelaunch.py): the retry storm (it needs
hosts that fail on purpose), 1,000 identical requests (a client that fast is rate-limited,
by design) and "no worker saw it" (only the fakes can count jobs).

Exit 0 only if every check run passed; 1 otherwise; 2 on bad usage. The token is never printed.
"""

from __future__ import annotations

import argparse
import base64
import io
import os
import sys
import time
import tomllib
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: shared.contract

from drill_monitor import UsageError, _token

from shared.contract import (
    HEADER_EXECUTION_ID,
    HEADER_IDEMPOTENCY_KEY,
    HEADER_IDEMPOTENCY_REPLAYED,
    HEADER_TOKEN,
    MSG_IDEMPOTENCY_KEY_REUSED,
    Code,
)

STATS_CATCH_UP_SECONDS = 3.0  # /admin/stats trails the request log by one flush (0.5 s)
AUDIT_CATCH_UP_SECONDS = 5.0  # a row is written within 1 s of its last change
FINISHED = ("completed", "failed")
# NULL by design: without a key, without edge.rate_limit.key_header; `worker` only for a replay
# reason: only on a row closed at a restart; error_type: only when a host named a failure on the way.
# model_version is not here: every completed answer came from a model that names its version.
MAY_BE_EMPTY = {"idempotency_key", "user_id", "reason", "error_type"}
MEASURE = "/api/v1/hair/measure"
MARK = "/api/v1/hair/mark"
CONCURRENT_DUPLICATES = 4
OVERSIZE_BYTES = 4 * 1024 * 1024
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
NOT_RUN = (
    ("retry storm", "needs hosts failing on purpose: tests/edge/e2e/test_e2e_prelaunch.py::test_b_*"),
    ("1,000 identical", "rate-limited by design from one client: test_a_* (here: 4 concurrent)"),
)


class CheckFailed(Exception):
    """A check did not hold; the message says what was seen instead."""


@dataclass
class Row:
    name: str
    result: str  # PASS, FAIL, NOT RUN
    detail: str


def png(width: int, height: int) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), (200, 170, 150)).save(buffer, format="PNG")
    return buffer.getvalue()


class Prelaunch:
    """The checks against one gateway; counts what it sent for the log check."""

    def __init__(self, client: httpx.Client, token: str) -> None:
        self.client = client
        self.token = token
        self.sent = 0
        self.replays = 0
        self.executions: list[str | None] = []  # X-Execution-ID of every answer

    def post(self, path: str, **kwargs: Any) -> tuple[httpx.Response, dict[str, Any]]:
        self.sent += 1
        response = self.client.post(path, **kwargs)
        self.executions.append(response.headers.get(HEADER_EXECUTION_ID))
        if response.status_code != 200:
            raise CheckFailed(f"POST {path} answered HTTP {response.status_code}: {response.text[:200]}")
        body = response.json()
        if response.headers.get(HEADER_IDEMPOTENCY_REPLAYED) == "true":
            self.replays += 1
        return response, body

    def stats(self) -> dict[str, Any]:
        response = self.client.get("/admin/stats", headers={HEADER_TOKEN: self.token})
        if response.status_code != 200:
            raise CheckFailed(f"GET /admin/stats answered HTTP {response.status_code} (401: the token was refused)")
        return response.json()["since_start"]

    def idempotency(self) -> str:
        key = f"prelaunch-{uuid.uuid4()}"
        body = {"image_base64": _base64(png(8, 6)), "gender": "unknown"}
        headers = {HEADER_IDEMPOTENCY_KEY: key}
        with ThreadPoolExecutor(CONCURRENT_DUPLICATES) as threads:
            answers = list(
                threads.map(lambda _: self.post(MEASURE, json=body, headers=headers), range(CONCURRENT_DUPLICATES))
            )
        later, _ = self.post(MEASURE, json=body, headers=headers)
        responses = [response for response, _ in answers] + [later]
        if len({response.content for response in responses}) != 1:
            raise CheckFailed(f"duplicates got different answers: codes {[b['code'] for _, b in answers]}")
        replayed = sum(response.headers.get(HEADER_IDEMPOTENCY_REPLAYED) == "true" for response in responses)
        if replayed != len(responses) - 1:
            raise CheckFailed(f"{replayed} of {len(responses)} answers marked replayed, expected {len(responses) - 1}")
        _, other = self.post(MEASURE, json={**body, "gender": "male"}, headers=headers)
        if (other["code"], other.get("message")) != (Code.INVALID_PARAMETER, MSG_IDEMPOTENCY_KEY_REUSED):
            raise CheckFailed(f"the key reused for another body answered {other['code']} {other.get('message')!r}")
        return f"{len(responses)} answers identical, {replayed} replayed (code {answers[0][1]['code']}); reuse refused"

    def parameters(self) -> str:
        started = time.perf_counter()
        _, body = self.post(MARK, json={"image_base64": _base64(png(480, 640)), "drop_mm": 1000})
        elapsed_ms = (time.perf_counter() - started) * 1000
        if body["code"] != Code.INVALID_PARAMETER:
            raise CheckFailed(f"drop_mm=1000 answered {body['code']} {body.get('message')!r}, expected 1001")
        return f"1001 {body.get('message')!r} in {elapsed_ms:.1f} ms round trip"

    def oversize(self) -> str:
        photo = PNG_SIGNATURE + os.urandom(OVERSIZE_BYTES)
        started = time.perf_counter()
        _, body = self.post(MEASURE, files={"image": ("prelaunch.png", photo, "image/png")})
        elapsed_ms = (time.perf_counter() - started) * 1000
        if body["code"] != Code.TOO_LARGE:
            raise CheckFailed(f"a 4 MB upload answered {body['code']} {body.get('message')!r}, expected 1003")
        return f"1003 in {elapsed_ms:.0f} ms round trip (includes sending 4 MB)"

    def request_log(self, before: dict[str, Any]) -> str:
        # the stats are fed from the request log's batches: up to a flush interval behind
        deadline = time.monotonic() + STATS_CATCH_UP_SECONDS
        while True:
            after = self.stats()
            requests, replays = after["requests"] - before["requests"], after["replays"] - before["replays"]
            if (requests >= self.sent and replays >= self.replays) or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        if requests < self.sent or replays < self.replays:
            raise CheckFailed(
                f"sent {self.sent} requests ({self.replays} replays), /admin/stats counted {requests} ({replays}): "
                "is --gateway one gateway, not a load balancer?"
            )
        return f"sent {self.sent} ({self.replays} replays), counted {requests} ({replays}) incl. others' traffic"

    def audit(self) -> str:
        unnamed = sum(execution is None for execution in self.executions)
        if unnamed:
            raise CheckFailed(f"{unnamed} of {len(self.executions)} answers had no {HEADER_EXECUTION_ID}")
        deadline = time.monotonic() + AUDIT_CATCH_UP_SECONDS
        while True:  # rows are written in batches, and a finished state follows within a second
            rows = {execution: self.audit_rows(execution) for execution in self.executions if execution}
            unfinished = [name for name, found in rows.items() if len(found) != 1 or found[0]["status"] not in FINISHED]
            if not unfinished or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        if unfinished:
            raise CheckFailed(f"{len(unfinished)} of {len(rows)} executions have no finished row, e.g. {unfinished[0]}")
        completed = [found[0] for found in rows.values() if found[0]["status"] == "completed"]
        empty = sorted(
            f"{row['execution_id']}.{column}"
            for row in completed
            for column, value in row.items()
            if value is None and column not in MAY_BE_EMPTY and not (column == "worker" and row["replayed"])
        )
        if empty:
            raise CheckFailed(f"completed rows with empty columns: {', '.join(empty[:5])}")
        if not completed:  # a live host refuses this script's tiny images: nothing completes
            return f"{len(rows)} finished rows for {self.sent} requests; none completed, so no columns to check"
        return f"{len(rows)} finished rows for {self.sent} requests; {len(completed)} completed, every column filled"

    def audit_rows(self, execution_id: str) -> list[dict[str, Any]]:
        response = self.client.get(
            "/admin/audit", params={"execution_id": execution_id}, headers={HEADER_TOKEN: self.token}
        )
        if response.status_code != 200:
            raise CheckFailed(f"GET /admin/audit answered HTTP {response.status_code}: {response.text[:200]}")
        rows: list[dict[str, Any]] = response.json()["rows"]
        return rows


def _base64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _check(name: str, run: Callable[[], str]) -> Row:
    try:
        return Row(name, "PASS", run())
    except CheckFailed as error:
        return Row(name, "FAIL", str(error))
    except (httpx.HTTPError, ValueError, KeyError) as error:
        return Row(name, "FAIL", f"{type(error).__name__}: {error}")


def run_checks(client: httpx.Client, token: str) -> list[Row]:
    checks = Prelaunch(client, token)
    try:
        before = checks.stats()
    except (CheckFailed, httpx.HTTPError) as error:
        return [Row("admin/stats", "FAIL", str(error))]
    rows = [
        _check("idempotency", checks.idempotency),
        _check("parameters", checks.parameters),
        _check("oversize", checks.oversize),
    ]
    rows.append(_check("request log", lambda: checks.request_log(before)))
    rows.append(_check("audit", checks.audit))
    return rows + [Row(name, "NOT RUN", why) for name, why in NOT_RUN]


def print_table(rows: Sequence[Row]) -> None:
    width = max(len(row.name) for row in rows)
    for row in rows:
        print(f"{row.name:<{width}}  {row.result:<7}  {row.detail}", flush=True)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gateway", required=True, help="base URL of ONE gateway, e.g. https://gw1.example.com")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--token", help="the gateway's shared_password (default: $HAIRGATE_SHARED_PASSWORD)")
    source.add_argument("--secrets", help="a secrets TOML holding [auth] shared_password")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds per HTTP request")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        token = _token(args)
    except (OSError, tomllib.TOMLDecodeError, UsageError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    with httpx.Client(base_url=args.gateway.rstrip("/"), timeout=args.timeout) as client:
        rows = run_checks(client, token)
    print_table(rows)
    return 0 if all(row.result != "FAIL" for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
