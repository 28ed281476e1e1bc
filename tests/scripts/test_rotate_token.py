"""`scripts/rotate_token.py` step by step against admin servers on loopback.

The hosts are the real `gpu_host.admin` behind the real `TokenGuard` (no models); the
gateways are small fakes of gateway.md's admin API that probe their hosts every 50 ms
with their current token, as a real gateway's traffic would. The end-to-end rotation
against real gateways and hosts under load is in the slow suite.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import hypercorn.trio
import pytest
import trio
from hypercorn.config import Config
from quart import jsonify, request
from quart_trio import QuartTrio

from gpu_host.admin import HostTokens
from gpu_host.auth import TokenGuard
from shared.contract import HEADER_TOKEN
from shared.secrets_file import SecretsSource, read_secret, write_secret
from shared.settings import ENV_ACCEPT_PASSWORDS, token_fingerprint
from tests.fakes.admin_host import host_app
from tests.fakes.tls import TlsFiles, tls_files

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "rotate_token.py"
_spec = importlib.util.spec_from_file_location("rotate_token", SCRIPT)
assert _spec is not None and _spec.loader is not None
rotate_token = importlib.util.module_from_spec(_spec)
sys.modules["rotate_token"] = rotate_token
_spec.loader.exec_module(rotate_token)

OLD = "old-shared-token-0123456789"
NEW = "new-shared-token-abcdefghij"
GRACE = 0.3


class FakeGateway:
    """gateway.md's `GET /admin/workers` and `POST /admin/token`, over hosts it keeps probing."""

    def __init__(self, token: str, hosts: list[str]) -> None:
        self.token = token
        self.online = dict.fromkeys(hosts, False)
        self.fail_switch = False
        self.app = QuartTrio(__name__)
        self.app.add_url_rule("/admin/workers", view_func=self._workers, methods=["GET"])
        self.app.add_url_rule("/admin/token", view_func=self._switch, methods=["POST"])

    async def _workers(self) -> Any:
        if request.headers.get(HEADER_TOKEN) != self.token:
            return jsonify(status="error"), 401
        workers = [
            {"index": i, "url": url, "online": up, "primary": True} for i, (url, up) in enumerate(self.online.items())
        ]
        return jsonify(workers=workers)

    async def _switch(self) -> Any:
        if request.headers.get(HEADER_TOKEN) != self.token:
            return jsonify(status="error"), 401
        if self.fail_switch:
            return jsonify(status="error", message="secrets file not writable"), 500
        self.token = (await request.get_json())["shared_password"]
        return jsonify(status="ok", fingerprint=token_fingerprint(self.token))

    async def probe(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with httpx.AsyncClient(timeout=5) as client:
            while True:
                for url in self.online:
                    answer = await client.get(url + "/admin/tokens", headers={HEADER_TOKEN: self.token})
                    self.online[url] = answer.status_code == 200
                task_status.started()
                task_status = trio.TASK_STATUS_IGNORED
                await trio.sleep(0.05)


async def serve(nursery: trio.Nursery, app: QuartTrio, tls: TlsFiles | None = None) -> str:
    config = Config()
    config.bind = ["127.0.0.1:0"]
    config.accesslog = None
    if tls is not None:
        config.certfile, config.keyfile = str(tls.certfile), str(tls.keyfile)
    urls = await nursery.start(partial(hypercorn.trio.serve, app, config))
    return urls[0]


class Cluster:
    def __init__(self, guards: list[TokenGuard], hosts: list[str], gateways: list[FakeGateway], urls: list[str]):
        self.guards, self.hosts, self.gateways, self.gateway_urls = guards, hosts, gateways, urls


@asynccontextmanager
async def cluster(tmp_path: Path, gateways: int = 2, hosts: int = 2) -> AsyncIterator[Cluster]:
    async with trio.open_nursery() as nursery:
        guards, host_urls = [], []
        for index in range(hosts):
            secrets = tmp_path / f"host{index}.toml"
            secrets.write_text(f'[auth]\naccept_passwords = ["{OLD}"]\n')
            guard = TokenGuard((OLD,))
            tokens = HostTokens(guard, (OLD,), SecretsSource(secrets, ENV_ACCEPT_PASSWORDS, False))
            guards.append(guard)
            host_urls.append(await serve(nursery, host_app(guard, tokens)))
        fakes = [FakeGateway(OLD, host_urls) for _ in range(gateways)]
        gateway_urls = []
        for fake in fakes:
            gateway_urls.append(await serve(nursery, fake.app))
            await nursery.start(fake.probe)
        yield Cluster(guards, host_urls, fakes, gateway_urls)
        nursery.cancel_scope.cancel()


def options(tmp_path: Path, gateway_urls: list[str], secrets: Path | None = None, **extra: Any) -> Any:
    argv = [arg for url in gateway_urls for arg in ("--gateway", url)]
    argv += ["--secrets", str(secrets)] if secrets else ["--token", OLD]
    argv += ["--grace-seconds", str(GRACE)]
    for name, value in extra.items():
        argv += [f"--{name.replace('_', '-')}"] + ([] if value is True else [str(value)])
    return rotate_token.options_from(rotate_token._parser().parse_args(argv))


async def test_full_rotation_across_two_gateways_and_two_hosts(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.chdir(tmp_path)
    secrets = tmp_path / "operator.toml"
    secrets.write_text(f'# the operator copy\n[auth]\nshared_password = "{OLD}"\n')
    lines: list[str] = []
    async with cluster(tmp_path) as c:
        opts = options(tmp_path, c.gateway_urls, secrets)
        new = opts.new  # generated
        await rotate_token.run(opts, lines.append)
        assert [g.token for g in c.gateways] == [new, new]
        for guard in c.guards:
            assert guard.is_accepted(new) and not guard.is_accepted(OLD)
        assert all(all(g.online.values()) for g in c.gateways)
    assert read_secret(secrets, "auth.shared_password") == new
    assert "# the operator copy" in secrets.read_text()
    assert not opts.pending.exists()
    output = "\n".join(lines)
    assert OLD not in output and new not in output
    assert token_fingerprint(new) in output and lines[-1].startswith("done:")
    assert [line[:5] for line in lines if line.startswith("[")] == [f"[{n}/8]" for n in range(1, 9)]
    print(output)  # the runbook quotes this


async def test_dry_run_changes_nothing(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.chdir(tmp_path)
    lines: list[str] = []
    async with cluster(tmp_path, gateways=1) as c:
        opts = options(tmp_path, c.gateway_urls, new_token=NEW, dry_run=True)
        await rotate_token.run(opts, lines.append)
        assert c.gateways[0].token == OLD
        assert all(guard.is_accepted(OLD) and not guard.is_accepted(NEW) for guard in c.guards)
    assert not opts.pending.exists()
    assert "dry run" in "\n".join(lines) and NEW not in "\n".join(lines)


async def test_a_rotation_failed_half_way_completes_when_run_again(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.chdir(tmp_path)
    async with cluster(tmp_path) as c:
        c.gateways[1].fail_switch = True
        first = options(tmp_path, c.gateway_urls)
        with pytest.raises(rotate_token.RotationFailed, match="HTTP 500"):
            await rotate_token.run(first, lambda line: None)
        # half-way: hosts accept both, one gateway switched, the other not; all hosts online
        assert c.gateways[0].token == first.new and c.gateways[1].token == OLD
        assert all(guard.is_accepted(OLD) and guard.is_accepted(first.new) for guard in c.guards)
        assert first.pending.exists()
        c.gateways[1].fail_switch = False
        again = options(tmp_path, c.gateway_urls)  # the same command
        assert again.new == first.new  # from the pending file
        lines: list[str] = []
        await rotate_token.run(again, lines.append)
        assert [g.token for g in c.gateways] == [first.new, first.new]
        assert all(not guard.is_accepted(OLD) for guard in c.guards)
        assert any("already sends" in line for line in lines)
    assert not again.pending.exists()


async def test_resumes_when_secrets_is_a_gateways_own_file_that_it_already_rewrote(
    tmp_path: Path, monkeypatch: Any
) -> None:
    monkeypatch.chdir(tmp_path)
    secrets = tmp_path / "gateway-secrets.toml"
    secrets.write_text(f'[auth]\nshared_password = "{OLD}"\n')
    async with cluster(tmp_path) as c:
        c.gateways[1].fail_switch = True
        first = options(tmp_path, c.gateway_urls, secrets)
        with pytest.raises(rotate_token.RotationFailed):
            await rotate_token.run(first, lambda line: None)
        write_secret(secrets, "auth.shared_password", first.new)  # the switched gateway persisted it
        c.gateways[1].fail_switch = False
        again = options(tmp_path, c.gateway_urls, secrets)  # the same command
        assert (again.old, again.new) == (OLD, first.new)
        await rotate_token.run(again, lambda line: None)
        assert [g.token for g in c.gateways] == [first.new, first.new]
        assert all(not guard.is_accepted(OLD) for guard in c.guards)
    assert not again.pending.exists()


async def test_old_token_still_in_use_blocks_the_removal(tmp_path: Path, monkeypatch: Any) -> None:
    """A gateway left out of --gateway keeps sending the old token: it is never removed."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(rotate_token, "WAIT_LIMIT_BEYOND_GRACE_SECONDS", 0.5)
    async with cluster(tmp_path) as c:
        opts = options(tmp_path, c.gateway_urls[:1], new_token=NEW)
        with pytest.raises(rotate_token.RotationFailed, match="still in use"):
            await rotate_token.run(opts, lambda line: None)
        assert all(guard.is_accepted(OLD) for guard in c.guards)
        assert c.gateways[1].token == OLD and all(c.gateways[1].online.values())


async def test_a_long_wait_says_which_fingerprint_is_still_seen_on_which_host(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(rotate_token, "WAIT_LIMIT_BEYOND_GRACE_SECONDS", 0.6)
    monkeypatch.setattr(rotate_token, "PROGRESS_SECONDS", 0.2)
    lines: list[str] = []
    async with cluster(tmp_path) as c:
        opts = options(tmp_path, c.gateway_urls[:1], new_token=NEW)  # the second gateway keeps the old token
        with pytest.raises(rotate_token.RotationFailed, match="still in use"):
            await rotate_token.run(opts, lines.append)
    step = next(line for line in lines if line.startswith("[6/"))
    assert f"gives up after {GRACE + 0.6:g}s" in step
    progress = [line for line in lines if line.startswith("  still waiting")]
    assert 1 <= len(progress) <= (GRACE + 0.6) / 0.2  # every PROGRESS_SECONDS, not at every poll
    assert token_fingerprint(OLD) in progress[0] and all(host in progress[0] for host in c.hosts)
    assert OLD not in "\n".join(lines) and NEW not in "\n".join(lines)


def test_a_pending_rotation_is_not_silently_replaced(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.chdir(tmp_path)
    options(tmp_path, ["http://127.0.0.1:1"])  # generates and saves a pending token
    with pytest.raises(rotate_token.UsageError, match="pending"):
        options(tmp_path, ["http://127.0.0.1:1"], new_token=NEW)


def test_unreachable_gateway_is_exit_1_with_a_message(tmp_path: Path, monkeypatch: Any, capsys: Any) -> None:
    monkeypatch.chdir(tmp_path)
    code = rotate_token.main(["--gateway", "http://127.0.0.1:1", "--token", OLD, "--new-token", NEW])
    assert code == 1
    out = capsys.readouterr().out
    assert "FAILED" in out and "127.0.0.1:1" in out and OLD not in out and NEW not in out


@pytest.mark.parametrize("trusted", [True, False])
async def test_https_gateway_is_verified_against_the_ca_file(tmp_path: Path, monkeypatch: Any, trusted: bool) -> None:
    monkeypatch.chdir(tmp_path)
    served = tls_files(tmp_path / "served")
    ca_file = served.ca_file if trusted else tls_files(tmp_path / "other").ca_file
    lines: list[str] = []
    async with trio.open_nursery() as nursery:
        url = await serve(nursery, FakeGateway(OLD, ["http://127.0.0.1:9"]).app, served)
        opts = options(tmp_path, [url], new_token=NEW, dry_run=True, ca_file=ca_file)
        if trusted:
            await rotate_token.run(opts, lines.append)
            assert any("1 worker(s)" in line for line in lines)
        else:
            with pytest.raises(rotate_token.RotationFailed, match="CERTIFICATE_VERIFY_FAILED"):
                await rotate_token.run(opts, lines.append)
        nursery.cancel_scope.cancel()
