#!/usr/bin/env python3
"""Zero-downtime rotation of the shared token across every gateway and every GPU host.

    scripts/rotate_token.py --gateway URL [--gateway URL ...] [--secrets FILE | --token T]
                            [--new-token T] [--grace-seconds 60] [--ca-file F] [--dry-run]

Over the admin endpoints only (gateway.md, gpu_host.md), so the hosts may be other
machines; seed 000 §7's order, each step printed with fingerprints only:

1. list the hosts from each gateway's `GET /admin/workers`;
2. add the new token to every host (`POST /admin/tokens {"add"}`): hosts accept both;
3. verify every host accepts the new token;
4. switch every gateway (`POST /admin/token`);
5. verify each gateway still sees online every host that was online before;
6. wait until no host has seen the old token for `--grace-seconds`;
7. verify step 5 again (every probe now carries the new token), then remove the old
   token from every host (`{"remove": <fingerprint>}`);
8. write the new token to `--secrets` if given.

Resumable: every step is idempotent and hosts accepting both tokens is always safe, so
after a failure (exit 1) running the same command again completes the rotation. A
generated new token is kept until the end in a pending file (mode 0600) beside
`--secrets` (else in the current directory), so that a re-run uses the same one.
Exit 0: rotated; 1: a step failed (the message says which and why); 2: bad usage.
"""

from __future__ import annotations

import argparse
import math
import os
import secrets
import ssl
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import trio

from shared.contract import HEADER_TOKEN
from shared.errors import reason
from shared.secrets_file import SecretsFileError, is_acceptable_token, read_secret, write_secret
from shared.settings import ENV_SHARED_PASSWORD, token_fingerprint

STEPS = 8
SHARED_PASSWORD_KEY = "auth.shared_password"
PENDING_KEY = "pending.new_token"
PENDING_OLD_KEY = "pending.old_token"  # --secrets may be a gateway's own, which it rewrites at step 4
PENDING_FILE = ".rotate_token.pending.toml"
REQUEST_TIMEOUT_SECONDS = 10.0
VERIFY_SECONDS = 30.0  # for a gateway to show its hosts online again after the switch
WAIT_LIMIT_BEYOND_GRACE_SECONDS = 600.0  # an old token still in use this long: a gateway not named
PROGRESS_SECONDS = 10.0  # while step 6 waits, a line this often: which host still sees the old token


class RotationFailed(Exception):
    """A step did not hold; the message says which host or gateway, and what to do."""


class UsageError(Exception):
    pass


@dataclass(frozen=True)
class Options:
    gateways: tuple[str, ...]
    old: str
    new: str
    grace_seconds: float
    secrets: Path | None
    pending: Path
    dry_run: bool = False
    ca_file: str = ""


@dataclass
class Host:
    url: str
    online_in: list[str] = field(default_factory=list)  # the gateways that see it online
    reachable: bool = True


Print = Callable[[str], None]


class Admin:
    """The admin API calls; each tries the given tokens in order and returns the one that worked."""

    def __init__(self, client: httpx.AsyncClient) -> None:
        self._client = client

    async def call(self, method: str, url: str, tokens: Sequence[str], body: Any = None) -> tuple[str, Any]:
        for token in tokens:
            try:
                response = await self._client.request(method, url, headers={HEADER_TOKEN: token}, json=body)
            except httpx.HTTPError as error:
                raise RotationFailed(f"{method} {url}: {reason(error)}") from None
            if response.status_code == 401:
                continue
            if response.status_code != 200:
                raise RotationFailed(f"{method} {url}: HTTP {response.status_code}: {_message(response)}")
            return token, response.json()
        raise RotationFailed(f"{method} {url}: neither the old nor the new token is accepted (401)")


def _message(response: httpx.Response) -> str:
    try:
        return str(response.json().get("message", response.text))
    except ValueError:
        return response.text[:200]


async def rotate(options: Options, admin: Admin, out: Print) -> None:
    old_fp, new_fp = token_fingerprint(options.old), token_fingerprint(options.new)
    gateway_first = (options.old, options.new)  # a gateway not yet switched takes only the old
    host_first = (options.new, options.old)  # every use of the old one would delay step 6
    out(f"[1/{STEPS}] list the hosts from {len(options.gateways)} gateway(s)")
    hosts, online_before = await _list_hosts(options, admin, gateway_first, out)
    if options.dry_run:
        _print_plan(options, hosts, out)
        return
    out(f"[2/{STEPS}] add the new token {new_fp} to every host")
    for host in hosts:
        await _add(admin, host, options, host_first, out)
    live = [host for host in hosts if host.reachable]
    out(f"[3/{STEPS}] verify every host accepts {new_fp}")
    for host in live:
        _, body = await admin.call("GET", host.url + "/admin/tokens", (options.new,))
        if new_fp not in _fingerprints(body):
            raise RotationFailed(f"{host.url} authenticates {new_fp} but does not list it")
        out(f"  {host.url}: accepts {new_fp}")
    out(f"[4/{STEPS}] switch every gateway to {new_fp}")
    for gateway in options.gateways:
        used, _ = await admin.call("GET", gateway + "/admin/workers", gateway_first)
        if used == options.new:
            out(f"  {gateway}: already sends {new_fp}")
            continue
        _, body = await admin.call("POST", gateway + "/admin/token", (options.old,), {"shared_password": options.new})
        if body.get("fingerprint") != new_fp:
            raise RotationFailed(f"{gateway} answered fingerprint {body.get('fingerprint')}, expected {new_fp}")
        out(f"  {gateway}: switched to {new_fp}")
    out(f"[5/{STEPS}] verify each gateway still sees every host that was online")
    for gateway in options.gateways:
        await _verify_online(admin, gateway, online_before[gateway], options.new, out)
    out(
        f"[6/{STEPS}] wait until no host has seen the old token {old_fp} for {options.grace_seconds:g}s"
        f" (gives up after {options.grace_seconds + WAIT_LIMIT_BEYOND_GRACE_SECONDS:g}s)"
    )
    await _wait_for_quiet(admin, live, options, out)
    out(f"[7/{STEPS}] remove the old token {old_fp} from every host")
    for gateway in options.gateways:  # their probes now carry only the new token: still online?
        await _verify_online(admin, gateway, online_before[gateway], options.new, out)
    for host in live:
        _, body = await admin.call("POST", host.url + "/admin/tokens", (options.new,), {"remove": old_fp})
        if old_fp in _fingerprints(body):
            raise RotationFailed(f"{host.url} still lists {old_fp} after removing it")
        out(f"  {host.url}: accepts {', '.join(_fingerprints(body))}")
    out(f"[8/{STEPS}] update the secrets file")
    _finish_files(options, out)
    out(f"done: every gateway sends {new_fp}; the old token {old_fp} is accepted nowhere")


async def _list_hosts(
    options: Options, admin: Admin, tokens: Sequence[str], out: Print
) -> tuple[list[Host], dict[str, set[str]]]:
    hosts: dict[str, Host] = {}
    online_before: dict[str, set[str]] = {}
    for gateway in options.gateways:
        _, body = await admin.call("GET", gateway + "/admin/workers", tokens)
        workers = body["workers"]
        online_before[gateway] = {worker["url"] for worker in workers if worker["online"]}
        for worker in workers:
            host = hosts.setdefault(worker["url"], Host(worker["url"]))
            if worker["online"]:
                host.online_in.append(gateway)
        out(f"  {gateway}: {len(workers)} worker(s), {len(online_before[gateway])} online")
    return list(hosts.values()), online_before


def _print_plan(options: Options, hosts: list[Host], out: Print) -> None:
    old_fp, new_fp = token_fingerprint(options.old), token_fingerprint(options.new)
    out(f"dry run: nothing changed. The plan, old {old_fp} -> new {new_fp}:")
    for host in hosts:
        seen = ", ".join(host.online_in) or "no gateway"
        out(f"  host {host.url} (online in {seen}): add {new_fp}, later remove {old_fp}")
    for gateway in options.gateways:
        out(f"  gateway {gateway}: switch to {new_fp}")
    out(f"  then wait until no host has seen {old_fp} for {options.grace_seconds:g}s")
    if options.secrets is not None:
        out(f"  finally write {new_fp} to {options.secrets}")


async def _add(admin: Admin, host: Host, options: Options, tokens: Sequence[str], out: Print) -> None:
    new_fp = token_fingerprint(options.new)
    try:
        _, body = await admin.call("POST", host.url + "/admin/tokens", tokens, {"add": options.new})
    except RotationFailed as error:
        if host.online_in:
            raise  # switching the gateways now would take this host out of their pools
        host.reachable = False
        out(f"  {host.url}: SKIPPED (offline in every gateway and not reachable: {error});")
        out(f"    add {new_fp} to its secrets file before it comes back")
        return
    out(f"  {host.url}: accepts {', '.join(_fingerprints(body))}")


async def _verify_online(admin: Admin, gateway: str, expected: set[str], token: str, out: Print) -> None:
    with trio.move_on_after(VERIFY_SECONDS):
        while True:
            _, body = await admin.call("GET", gateway + "/admin/workers", (token,))
            missing = expected - {worker["url"] for worker in body["workers"] if worker["online"]}
            if not missing:
                out(f"  {gateway}: {len(expected)} host(s) online, as before")
                return
            await trio.sleep(1.0)
    raise RotationFailed(f"{gateway} no longer sees online: {', '.join(sorted(missing))}")


async def _wait_for_quiet(admin: Admin, hosts: list[Host], options: Options, out: Print) -> None:
    old_fp = token_fingerprint(options.old)
    poll_seconds = min(5.0, max(0.1, options.grace_seconds / 10))
    noisy: dict[str, float] = {}
    limit_seconds = options.grace_seconds + WAIT_LIMIT_BEYOND_GRACE_SECONDS
    started = next_progress = trio.current_time()
    next_progress += PROGRESS_SECONDS
    with trio.move_on_after(limit_seconds):
        while True:
            noisy = {}
            for host in hosts:
                _, body = await admin.call("GET", host.url + "/admin/tokens", (options.new,))
                for token in body["tokens"]:
                    ago = token["last_used_seconds_ago"]
                    if token["fingerprint"] == old_fp and ago is not None and ago < options.grace_seconds:
                        noisy[host.url] = ago
            if not noisy:
                out(f"  no host has seen {old_fp} for {options.grace_seconds:g}s")
                return
            if trio.current_time() >= next_progress:
                waited = trio.current_time() - started
                out(f"  still waiting ({waited:.0f}s of at most {limit_seconds:g}s): {old_fp} seen on {_seen(noisy)}")
                next_progress += PROGRESS_SECONDS
            await trio.sleep(poll_seconds)
    raise RotationFailed(f"the old token is still in use at {_seen(noisy)}: is a gateway missing from --gateway?")


def _seen(noisy: dict[str, float]) -> str:
    return ", ".join(f"{url} ({ago:.1f}s ago)" for url, ago in noisy.items())


def _fingerprints(body: Any) -> list[str]:
    return [token["fingerprint"] for token in body["tokens"]]


def _finish_files(options: Options, out: Print) -> None:
    if options.secrets is not None:
        try:
            write_secret(options.secrets, SHARED_PASSWORD_KEY, options.new)
        except SecretsFileError as error:
            raise RotationFailed(f"every service is rotated, but {error}; put the new token there by hand") from None
        out(f"  {options.secrets}: shared_password = {token_fingerprint(options.new)}")
    else:
        out("  no --secrets given: nothing to update")
    options.pending.unlink(missing_ok=True)


# --- command line ----------------------------------------------------------------------


def options_from(args: argparse.Namespace) -> Options:
    secrets_path = Path(args.secrets) if args.secrets else None
    old = _old_token(args, secrets_path)
    pending = secrets_path.with_name(secrets_path.name + ".pending") if secrets_path else Path(PENDING_FILE)
    new = _new_token(args, pending, old)
    if new == old:
        saved_old = read_secret(pending, PENDING_OLD_KEY) if pending.exists() else None
        if isinstance(saved_old, str) and saved_old != new:
            old = saved_old  # --secrets already holds the new token: a switched gateway wrote it
        elif pending.exists():  # the last run updated --secrets, then stopped before its clean-up
            raise UsageError(f"the rotation saved in {pending} is complete: delete that file")
        else:
            raise UsageError("the new token is the current one")
    return Options(
        gateways=tuple(url.rstrip("/") for url in args.gateway),
        old=old,
        new=new,
        grace_seconds=args.grace_seconds,
        secrets=secrets_path,
        pending=pending,
        dry_run=args.dry_run,
        ca_file=args.ca_file or "",
    )


def _old_token(args: argparse.Namespace, secrets_path: Path | None) -> str:
    if args.token:
        return args.token
    if secrets_path is not None:
        token = read_secret(secrets_path, SHARED_PASSWORD_KEY)
        if not isinstance(token, str) or not token:
            raise UsageError(f"no [auth] shared_password in {secrets_path}")
        return token
    if os.environ.get(ENV_SHARED_PASSWORD):
        return os.environ[ENV_SHARED_PASSWORD]
    raise UsageError(f"give --token, --secrets FILE or set {ENV_SHARED_PASSWORD}")


def _new_token(args: argparse.Namespace, pending: Path, old: str) -> str:
    saved = read_secret(pending, PENDING_KEY) if pending.exists() else None
    if args.new_token:
        if saved is not None and saved != args.new_token:
            raise UsageError(
                f"a rotation to {token_fingerprint(str(saved))} is pending in {pending}: "
                "re-run without --new-token to finish it, or delete that file"
            )
        token = args.new_token
    elif isinstance(saved, str):
        return saved
    else:
        token = secrets.token_urlsafe(32)
    if not is_acceptable_token(token):
        raise UsageError(
            "the new token must be at least 16 printable ASCII characters without spaces, at least 8 of them distinct"
        )
    if not args.dry_run and saved is None:
        write_secret(pending, PENDING_KEY, token)  # before any change: a re-run must find it
        write_secret(pending, PENDING_OLD_KEY, old)
    return token


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gateway", action="append", required=True, help="a gateway's base URL (repeat for each)")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--token", help=f"the current shared token (default: ${ENV_SHARED_PASSWORD})")
    source.add_argument("--secrets", help="a secrets TOML holding [auth] shared_password; updated at the end")
    parser.add_argument("--new-token", help="the new token (default: generated)")
    parser.add_argument("--grace-seconds", type=float, default=60.0, help="default: %(default)s")
    parser.add_argument("--ca-file", help="CA bundle for https:// gateways and hosts (default: the system store)")
    parser.add_argument("--dry-run", action="store_true", help="print the plan, change nothing")
    return parser


async def run(options: Options, out: Print) -> None:
    verify: ssl.SSLContext | bool = ssl.create_default_context(cafile=options.ca_file) if options.ca_file else True
    async with httpx.AsyncClient(timeout=REQUEST_TIMEOUT_SECONDS, verify=verify) as client:
        await rotate(options, Admin(client), out)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if not math.isfinite(args.grace_seconds) or args.grace_seconds < 0:
        print("error: --grace-seconds must be a number >= 0", file=sys.stderr)
        return 2
    try:
        options = options_from(args)
    except (UsageError, SecretsFileError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    out = partial(print, flush=True)
    try:
        trio.run(run, options, out)
    except RotationFailed as error:
        out(f"FAILED: {error}")
        if not options.dry_run:
            out("nothing unsafe is left behind: run the same command again to complete the rotation")
        return 1
    except KeyboardInterrupt:
        out("interrupted: run the same command again to complete the rotation")
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
