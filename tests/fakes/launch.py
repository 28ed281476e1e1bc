"""Start real processes on loopback for end-to-end tests and benchmarks: fake workers and the gateway.

Both are started as the operator starts them (`python -m tests.fakes.fake_worker`,
`hairgate edge --config … --secrets … --bind …`) and waited for by an event, never by a
sleep: a fake prints a ready line once its socket listens; the gateway logs
`Worker 池初始化完成` after its first probe round and only then accepts connections, which
is polled with a deadline. `kill()` ends what was started, whatever state it is in.
"""

from __future__ import annotations

import json
import os
import re
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import httpx
import tomlkit

from gpu_host.dev import hairgate_argv

REPO_ROOT = Path(__file__).resolve().parents[2]
POOL_READY = re.compile(r"Worker 池初始化完成 \| 总数=(\d+) \| 在线=(\d+) \| 主worker=(\d+)")
_SECRET_ENV = ("HAIRGATE_SHARED_PASSWORD", "HAIRGATE_ACCEPT_PASSWORDS")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def child_env() -> dict[str, str]:
    # Secrets reach a child only through the files a test writes, never from this shell.
    env = {k: v for k, v in os.environ.items() if k not in _SECRET_ENV}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _kill(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.kill()
    process.wait(timeout=10)


class FakeWorkerProcess:
    """One `tests.fakes.fake_worker` process, and its control API (`/_fake/...`)."""

    def __init__(self, process: subprocess.Popen, url: str, token: str) -> None:
        self.process = process
        self.url = url
        self.token = token

    @classmethod
    def start(
        cls, token: str, latency_ms: float = 0, log_path: Path | None = None, timeout_s: float = 30
    ) -> FakeWorkerProcess:
        stderr = open(log_path, "ab") if log_path else subprocess.DEVNULL
        command = [sys.executable, "-m", "tests.fakes.fake_worker", "--port", "0", "--token", token]
        command += ["--latency-ms", str(latency_ms)]
        process = subprocess.Popen(command, cwd=REPO_ROOT, env=child_env(), stdout=subprocess.PIPE, stderr=stderr)
        if log_path:
            stderr.close()
        try:
            url = cls._wait_ready_line(process, timeout_s)
        except BaseException:
            _kill(process)
            raise
        return cls(process, url, token)

    @staticmethod
    def _wait_ready_line(process: subprocess.Popen, timeout_s: float) -> str:
        readable, _, _ = select.select([process.stdout], [], [], timeout_s)
        line = process.stdout.readline() if readable else b""
        if not line:
            raise RuntimeError(f"fake worker not ready within {timeout_s} s (exit code {process.poll()})")
        return json.loads(line)["url"]

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    def alive(self) -> bool:
        return self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL: the machine vanished (no graceful close of open connections)."""
        _kill(self.process)
        if self.process.stdout:
            self.process.stdout.close()

    # The control API, async for tests that run requests concurrently (pytest-trio).
    async def configure(self, **knobs: Any) -> dict[str, Any]:
        return await self._call("POST", "/_fake/config", json=knobs)

    async def stats(self) -> dict[str, Any]:
        return await self._call("GET", "/_fake/stats")

    async def release(self) -> None:
        await self._call("POST", "/_fake/release")

    async def reset(self) -> None:
        await self._call("POST", "/_fake/reset")

    async def _call(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        async with httpx.AsyncClient(base_url=self.url, timeout=10) as client:
            response = await client.request(method, path, **kwargs)
            response.raise_for_status()
            return response.json()


def write_secrets(directory: Path, token: str) -> Path:
    path = directory / "secrets.toml"
    path.write_text(tomlkit.dumps({"auth": {"shared_password": token}}))
    path.chmod(0o600)
    return path


def _deep_update(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            _deep_update(base[key], value)
        else:
            base[key] = value
    return base


def write_gateway_settings(
    directory: Path,
    port: int,
    workers: Iterable[str],
    primary_workers: Iterable[str] = (),
    edge: dict[str, Any] | None = None,
) -> Path:
    """A settings.toml for one gateway whose every file lives in `directory`.

    Defaults suit tests: fast probes, short waits. `edge` overrides any `[edge]` key, nested.
    """
    section: dict[str, Any] = {
        "bind": f"127.0.0.1:{port}",
        "public_base_url": f"http://127.0.0.1:{port}",
        "static_dir": str(directory / "static"),
        "request_log": str(directory / "request_log.jsonl"),
        "max_body_bytes": 2 * 1024 * 1024,
        "pool": {"workers": list(workers), "primary_workers": list(primary_workers)},
        "health_check": {
            "interval_seconds": 0.3,
            "timeout_seconds": 1,
            "unhealthy_threshold": 2,
            "healthy_threshold": 1,
            "cooldown_seconds": 2,
        },
        "dispatch": {
            "max_inflight": 64,
            "queue_wait_seconds": 5,
            "max_queue_wait_seconds": 10,
            "request_timeout_seconds": 10,
            "slow_request_timeout_seconds": 20,
            "retry_on_failure": True,
            "max_retries": 1,
        },
        "idempotency": {"path": str(directory / "idempotency.sqlite3")},
    }
    path = directory / "settings.toml"
    path.write_text(tomlkit.dumps({"edge": _deep_update(section, edge or {})}))
    return path


class GatewayProcess:
    """The real gateway, `hairgate edge`, with its log in a file."""

    def __init__(self, process: subprocess.Popen, url: str, log_path: Path) -> None:
        self.process = process
        self.url = url
        self.log_path = log_path

    @classmethod
    def start(
        cls, config: Path, secrets: Path, port: int, log_path: Path, timeout_s: float = 30
    ) -> GatewayProcess:
        command = hairgate_argv() + ["edge", "--config", str(config), "--secrets", str(secrets)]
        command += ["--bind", f"127.0.0.1:{port}"]
        with open(log_path, "ab") as log:
            process = subprocess.Popen(
                command, cwd=REPO_ROOT, env=child_env(), stdout=log, stderr=subprocess.STDOUT
            )
        gateway = cls(process, f"http://127.0.0.1:{port}", log_path)
        try:
            gateway.wait_ready(timeout_s)
        except BaseException:
            gateway.kill()
            raise
        return gateway

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_for_log(self, pattern: re.Pattern[str] | str, timeout_s: float) -> re.Match[str]:
        """Poll the log file until `pattern` appears; fail early if the process exits."""
        pattern = re.compile(pattern) if isinstance(pattern, str) else pattern
        deadline = time.monotonic() + timeout_s
        while True:
            match = pattern.search(self.log_text())
            if match:
                return match
            if self.process.poll() is not None:
                raise RuntimeError(f"gateway exited ({self.process.returncode}):\n{self.log_text()[-3000:]}")
            if time.monotonic() > deadline:
                tail = self.log_text()[-3000:]
                raise TimeoutError(f"no {pattern.pattern!r} in the gateway log after {timeout_s} s:\n{tail}")
            time.sleep(0.02)

    def wait_ready(self, timeout_s: float) -> re.Match[str]:
        """The pool-ready log line, then the port answering `/health`."""
        started = time.monotonic()
        match = self.wait_for_log(POOL_READY, timeout_s)
        while True:
            try:
                if httpx.get(f"{self.url}/health", timeout=1).status_code == 200:
                    return match
            except httpx.TransportError:
                pass
            if self.process.poll() is not None or time.monotonic() - started > timeout_s:
                raise RuntimeError(f"gateway port never answered:\n{self.log_text()[-3000:]}")
            time.sleep(0.02)

    def reload(self) -> None:
        """SIGHUP: re-read settings and secrets (systemd's ExecReload)."""
        self.process.send_signal(signal.SIGHUP)

    def terminate(self) -> None:
        """SIGTERM: the graceful stop systemd sends."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)

    def wait_exit(self, timeout_s: float) -> int:
        return self.process.wait(timeout=timeout_s)

    def kill(self) -> None:
        _kill(self.process)
