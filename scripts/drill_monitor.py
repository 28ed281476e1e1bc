#!/usr/bin/env python3
"""The alert drill of the gateway's /monitor (seed 001 §9), as five checked steps.

    scripts/drill_monitor.py --gateway URL [--token T | --secrets FILE] [--wait S]

1. GET /monitor is 200;
2. POST /monitor/fault {"enabled": true};
3. GET /monitor is 503 with "simulated": true, a message starting with 模拟故障, and the
   real counts (workers_healthy not 0 when it was not);
4. wait S seconds: the monitoring system should alert now (30 s per poll; twice that when it
   alerts after 2 failures, hence the default 60);
5. POST {"enabled": false}, and GET /monitor is 200 again.

The switch is ALWAYS turned off on exit — a failed check, an error, Ctrl-C or SIGTERM —
because a forgotten drill keeps the alert firing. Exit 0 only if every step held; 1 if a
check failed, 2 on bad usage, 130 when interrupted. The token is never printed.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
import tomllib
from collections.abc import Sequence
from typing import Any

import httpx

TOKEN_HEADER = "X-Internal-Token"  # shared.contract.HEADER_TOKEN; the script runs without the package
TOKEN_ENV = "HAIRGATE_SHARED_PASSWORD"
COUNT_KEYS = ("workers_total", "workers_healthy", "workers_primary_total", "workers_primary_healthy")


class StepFailed(Exception):
    """A drill step did not hold; the message says what was seen instead."""


class UsageError(Exception):
    """No usable token source; the message says which options to give."""


def _counts(body: dict[str, Any]) -> str:
    return " ".join(f"{key}={body.get(key)}" for key in COUNT_KEYS)


class Drill:
    def __init__(self, client: httpx.Client, token: str, wait_s: float) -> None:
        self.client = client
        self.token = token
        self.wait_s = wait_s
        self.switch_touched = False
        self.switch_off_confirmed = False

    def monitor(self) -> tuple[int, dict[str, Any]]:
        response = self.client.get("/monitor")
        try:
            return response.status_code, response.json()
        except ValueError:
            raise StepFailed(f"/monitor answered {response.status_code} without JSON") from None

    def set_fault(self, enabled: bool) -> dict[str, Any]:
        self.switch_touched = True
        response = self.client.post("/monitor/fault", json={"enabled": enabled}, headers={TOKEN_HEADER: self.token})
        if response.status_code == 401:
            raise StepFailed("POST /monitor/fault answered 401: the token was refused")
        if response.status_code != 200:
            raise StepFailed(f"POST /monitor/fault answered {response.status_code}: {response.text[:200]}")
        try:
            body = response.json()
        except ValueError:
            raise StepFailed("POST /monitor/fault answered 200 without JSON") from None
        if body.get("simulated") is not enabled:
            raise StepFailed(f"POST /monitor/fault answered simulated={body.get('simulated')!r}, expected {enabled}")
        if not enabled:
            self.switch_off_confirmed = True
        return body

    def run(self) -> None:
        status, before = self.monitor()
        if status != 200 or before.get("status") != "ok":
            message = before.get("message", "")
            raise StepFailed(f"GET /monitor is {status} {message}: fix the real outage before a drill")
        _step(1, f"GET /monitor -> 200 ({_counts(before)})")

        _step(2, f"POST /monitor/fault enabled=true -> 200: {self.set_fault(True).get('message', '')}")
        self.switch_off_confirmed = False

        status, during = self.monitor()
        _check_simulated_outage(status, during, before)
        _step(3, f"GET /monitor -> 503 simulated ({_counts(during)}): {during['message']}")

        _step(4, f"waiting {self.wait_s:g} s: confirm that the alert fired")
        time.sleep(self.wait_s)

        self.set_fault(False)
        status, after = self.monitor()
        if status != 200 or "simulated" in after:
            raise StepFailed(f"after disabling, GET /monitor is {status} {after}")
        _step(5, f"POST /monitor/fault enabled=false, GET /monitor -> 200 ({_counts(after)})")
        print("      confirm that the alert cleared", flush=True)

    def ensure_switch_off(self) -> None:
        """The safety net: whatever happened, leave the drill off (and say so if that fails)."""
        if not self.switch_touched or self.switch_off_confirmed:
            return
        try:
            self.set_fault(False)
            print("cleanup: the fault switch is OFF", flush=True)
        except (StepFailed, httpx.HTTPError) as error:
            print(f"cleanup FAILED, the fault switch may still be ON — turn it off by hand: {error}", flush=True)


def _check_simulated_outage(status: int, during: dict[str, Any], before: dict[str, Any]) -> None:
    if status != 503:
        raise StepFailed(f"GET /monitor during the drill is {status}, expected 503")
    if during.get("simulated") is not True:
        raise StepFailed(f"GET /monitor during the drill lacks simulated=true: {during}")
    if not str(during.get("message", "")).startswith("模拟故障"):
        raise StepFailed(f"the drill message does not start with 模拟故障: {during.get('message')!r}")
    if during.get("workers_total") != before.get("workers_total"):
        raise StepFailed(f"workers_total changed during the drill: {_counts(before)} -> {_counts(during)}")
    if before.get("workers_healthy") and not during.get("workers_healthy"):
        raise StepFailed("workers_healthy dropped to 0 during the drill: the drill must not touch the pool")


def _step(number: int, text: str) -> None:
    print(f"[{number}/5] {text}", flush=True)


def _token(args: argparse.Namespace) -> str:
    if args.token:
        return args.token
    if args.secrets:
        with open(args.secrets, "rb") as handle:
            token = tomllib.load(handle).get("auth", {}).get("shared_password", "")
        if not token:
            raise UsageError(f"no [auth] shared_password in {args.secrets}")
        return token
    if os.environ.get(TOKEN_ENV):
        return os.environ[TOKEN_ENV]
    raise UsageError(f"give --token, --secrets FILE or set {TOKEN_ENV}")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gateway", required=True, help="base URL of the gateway, e.g. https://hair.example.com")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--token", help=f"the gateway's shared_password (default: ${TOKEN_ENV})")
    source.add_argument("--secrets", help="a secrets TOML holding [auth] shared_password")
    parser.add_argument("--wait", type=float, default=60.0, help="seconds the drill stays on (default: %(default)s)")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds per HTTP request")
    return parser


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        token = _token(args)
    except (OSError, tomllib.TOMLDecodeError) as error:
        print(f"error: cannot read the secrets file {args.secrets}: {error}", file=sys.stderr)
        return 2
    except UsageError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _raise_interrupt)  # systemd/kill: clean up like Ctrl-C
    with httpx.Client(base_url=args.gateway.rstrip("/"), timeout=args.timeout) as client:
        drill = Drill(client, token, args.wait)
        try:
            drill.run()
        except StepFailed as error:
            print(f"FAILED: {error}", flush=True)
            return 1
        except httpx.HTTPError as error:
            print(f"FAILED: the gateway could not be reached: {type(error).__name__}: {error}", flush=True)
            return 1
        except KeyboardInterrupt:
            print("interrupted", flush=True)
            return 130
        finally:
            drill.ensure_switch_off()
    print("drill passed: every step held", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
