"""The fake worker as a process, and a gateway's test settings, on top of `cluster.launcher`.

A fake is started as the gateway's tests start it (`python -m tests.fakes.fake_worker`) and
returned once it printed its ready line; its control API (`/_fake/...`) is async for tests
that run requests concurrently (pytest-trio).
"""

from __future__ import annotations

import secrets
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import httpx

from cluster.files import merge, write_secrets, write_settings
from cluster.launcher import Process, free_port, start_announcing, start_gateway


class FakeWorkerProcess:
    """One `tests.fakes.fake_worker` process, and its control API."""

    def __init__(self, process: Process, token: str) -> None:
        self.process = process
        self.token = token

    @classmethod
    def start(
        cls, token: str, latency_ms: float = 0, log_path: Path | None = None, timeout_s: float = 30
    ) -> FakeWorkerProcess:
        argv = [sys.executable, "-m", "tests.fakes.fake_worker", "--port", "0", "--token", token]
        argv += ["--latency-ms", str(latency_ms)]
        return cls(start_announcing("fake-worker", argv, log_path, timeout_s), token)

    @property
    def url(self) -> str:
        return self.process.url

    def alive(self) -> bool:
        return self.process.alive()

    def kill(self) -> None:
        self.process.kill()

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
        "audit": {"path": str(directory / "audit.sqlite3")},
        # every test client is 127.0.0.1: tests of the limit turn it on with their own numbers
        "rate_limit": {"enabled": False},
        "metrics_bind": "",  # tests that read metrics name a free port
        "cpu": {"start_workers_at_start": False},  # face workers (4, 99) only when a test uses them
    }
    # The loader refuses a host inference timeout not well below the gateway's request timeout.
    hosts = {"inference_timeout_seconds": 0.5}
    return write_settings(directory / "settings.toml", {"edge": merge(section, edge or {}), "gpu_host": hosts})


class FakeCluster:
    """Fake workers and real gateways of one benchmark or test run, under one token and one
    folder; `stop()` kills every process it started."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.token = secrets.token_hex(16)
        self.secrets = write_secrets(directory / "secrets.toml", self.token)
        self.started: list[FakeWorkerProcess | Process] = []

    async def fakes(self, count: int, **knobs: Any) -> list[FakeWorkerProcess]:
        """`count` fake workers answering without images, configured with `knobs`."""
        started = [FakeWorkerProcess.start(self.token) for _ in range(count)]
        self.started.extend(started)
        for fake in started:
            await fake.configure(image="none", **knobs)
        return started

    def gateway(self, name: str, fakes: Iterable[FakeWorkerProcess], edge: dict[str, Any]) -> tuple[Process, Path]:
        """A real `hairgate edge` over `fakes`, its files in `directory/name`; (process, settings path)."""
        directory = self.directory / name
        directory.mkdir()
        port = free_port()
        config = write_gateway_settings(directory, port, [fake.url for fake in fakes], edge=edge)
        gateway = start_gateway(config, self.secrets, port, directory / "gateway.log")
        self.started.append(gateway)
        return gateway, config

    def stop(self) -> None:
        for process in self.started:
            process.kill()
