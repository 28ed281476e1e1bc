"""Start, wait for and stop the system's processes on loopback.

Every child runs as an operator runs it (`hairgate gpu-host|edge --config … --secrets …
--bind …`, or any argv, such as the tests' fake worker) with an environment that carries no
secret. Its combined output is read line by line by a thread that writes it to a log file
or echoes it with the service's name, so a line is an event: `wait_for_log` wakes when the
line arrives (the gateway's pool-ready line, a fake's ready line) or the process ends.
What a child gives no line for (a port opening, a health answer) is polled with a
deadline. Stopping is a signal (SIGTERM by default), then SIGKILL once a grace period
passed; `Process` is a context manager that stops on exit.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, TypeVar

import httpx

from shared.settings import ENV_ACCEPT_PASSWORDS, ENV_SHARED_PASSWORD

REPO_ROOT = Path(__file__).resolve().parents[1]
LOOPBACK = "127.0.0.1"
STOP_GRACE_SECONDS = 30.0  # longer than a host's graceful shutdown, which lets inferences end
OUTPUT_DRAIN_SECONDS = 10.0  # a stopped child's last lines (its model child may close later)
POLL_SECONDS = 0.02
POOL_READY = re.compile(r"Worker 池初始化完成 \| 总数=(\d+) \| 在线=(\d+) \| 主worker=(\d+)")
READY_LINE = re.compile(r'^\{"event": "ready".*\}$', re.MULTILINE)
LOG_TAIL_CHARS = 3000
CONSECUTIVE_PORTS = (20000, 20499)  # below the ephemeral range, where port 0 picks

T = TypeVar("T")


@dataclass(frozen=True)
class Service:
    """What to start: a name for its output, the argv, and where it answers."""

    name: str
    argv: list[str]
    url: str
    health_path: str = "/health"

    @property
    def health_url(self) -> str:
        return self.url + self.health_path


def hairgate_argv() -> list[str]:
    """How to run `hairgate` from this interpreter, whether installed as a script or not."""
    script = Path(sys.executable).with_name("hairgate")
    return [str(script)] if script.exists() else [sys.executable, "-m", "cluster.cli"]


def hairgate_service(name: str, role: str, settings: Path, secrets: Path, port: int, health_path: str) -> Service:
    """`hairgate <role>` on loopback `port`, with these settings and secrets files."""
    bind = f"{LOOPBACK}:{port}"
    argv = [*hairgate_argv(), role, "--config", str(settings), "--secrets", str(secrets), "--bind", bind]
    return Service(name, argv, f"http://{bind}", health_path)


def child_env() -> dict[str, str]:
    # Secrets reach a child only through its secrets file, never from this process's environment.
    env = {k: v for k, v in os.environ.items() if k not in (ENV_SHARED_PASSWORD, ENV_ACCEPT_PASSWORDS)}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    env["PYTHONUNBUFFERED"] = "1"
    return env


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind((LOOPBACK, 0))
        return probe.getsockname()[1]


def free_ports(count: int) -> list[int]:
    """`count` consecutive free loopback ports (`hairgate dev` takes the first host's port)."""
    for _ in range(200):
        first = random.randint(CONSECUTIVE_PORTS[0], CONSECUTIVE_PORTS[1] - count)
        ports = list(range(first, first + count))
        if all(_is_free(port) for port in ports):
            return ports
    raise RuntimeError(f"no {count} consecutive free ports in {CONSECUTIVE_PORTS}")


def _is_free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind((LOOPBACK, port))
        except OSError:
            return False
    return True


class Process:
    """One started child, its output, and how to stop it."""

    def __init__(
        self,
        service: Service,
        process: subprocess.Popen,
        log_path: Path | None,
        echo: bool,
        on_exit: Callable[[Process], None] | None,
    ) -> None:
        self.service = service
        self.name = service.name
        self.url = service.url
        self.process = process
        self.log_path = log_path
        # The text is kept for `wait_for_log` unless echoed: a dev cluster runs for hours.
        self._lines: list[str] | None = None if echo else []
        self._changed = threading.Condition()
        self._ended = threading.Event()
        self._reader = threading.Thread(
            target=self._read, args=(echo, on_exit), name=f"output of {self.name}", daemon=True
        )
        self._reader.start()

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def log_text(self) -> str:
        with self._changed:
            return "".join(self._lines or [])

    def _read(self, echo: bool, on_exit: Callable[[Process], None] | None) -> None:
        # closed in the finally below, before the wait and the ended event: not a `with` around it all
        log: BinaryIO | None = open(self.log_path, "ab") if self.log_path else None  # noqa: SIM115
        prefix = f"{self.name:<11}| ".encode()
        assert self.process.stdout is not None  # started with stdout=PIPE
        try:
            for line in self.process.stdout:
                if log:
                    log.write(line)
                    log.flush()
                if echo:
                    sys.stdout.buffer.write(prefix + line)
                    sys.stdout.buffer.flush()
                with self._changed:
                    if self._lines is not None:
                        self._lines.append(line.decode(errors="replace"))
                    self._changed.notify_all()
        finally:
            if log:
                log.close()
            self.process.wait()
            with self._changed:
                self._ended.set()
                self._changed.notify_all()
        if on_exit:
            on_exit(self)

    def wait_for_log(self, pattern: re.Pattern[str] | str, timeout_s: float) -> re.Match[str]:
        """The first match of `pattern` in the output, as soon as its line arrives (not for an echoed process)."""
        pattern = re.compile(pattern) if isinstance(pattern, str) else pattern
        with self._changed:
            self._changed.wait_for(lambda: pattern.search(self.log_text()) or self._ended.is_set(), timeout_s)
            match = pattern.search(self.log_text())
        if match:
            return match
        state = f"exited ({self.process.returncode})" if self._ended.is_set() else f"not within {timeout_s} s"
        raise RuntimeError(f"{self.name}: no {pattern.pattern!r} in its output, {state}:\n{self._tail()}")

    def poll_until(self, check: Callable[[], T], what: str, timeout_s: float, interval_s: float = POLL_SECONDS) -> T:
        """`check()`'s first true value (a refused connection counts as not yet); fails if the process exits."""
        deadline = time.monotonic() + timeout_s
        while self.alive():
            try:
                result = check()
            except httpx.TransportError:
                result = None
            if result:
                return result
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.name}: {what} not within {timeout_s} s:\n{self._tail()}")
            self._ended.wait(interval_s)
        raise RuntimeError(f"{self.name} exited ({self.process.returncode}) before {what}:\n{self._tail()}")

    def _tail(self) -> str:
        return self.log_text()[-LOG_TAIL_CHARS:]

    def reload(self) -> None:
        """SIGHUP: re-read settings and secrets (systemd's ExecReload)."""
        self.process.send_signal(signal.SIGHUP)

    def terminate(self) -> None:
        """SIGTERM, the graceful stop systemd sends, without waiting."""
        if self.alive():
            self.process.send_signal(signal.SIGTERM)

    def wait_exit(self, timeout_s: float) -> int:
        """The exit code, once its output is read (`subprocess.TimeoutExpired` if still running)."""
        code = self.process.wait(timeout=timeout_s)
        self._reader.join(OUTPUT_DRAIN_SECONDS)
        return code

    def stop(self, signum: int = signal.SIGTERM, grace_s: float = STOP_GRACE_SECONDS) -> int:
        """Send `signum`, SIGKILL if still running after `grace_s`; the exit code, once its output is read."""
        if self.alive():
            self.process.send_signal(signum)
        try:
            return self.wait_exit(grace_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.wait_exit(OUTPUT_DRAIN_SECONDS)

    def kill(self) -> None:
        """SIGKILL: the machine vanished (no graceful close of open connections)."""
        self.stop(signal.SIGKILL)

    def __enter__(self) -> Process:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def start(
    service: Service,
    log_path: Path | None = None,
    *,
    cwd: Path | None = None,
    echo: bool = False,
    on_exit: Callable[[Process], None] | None = None,
) -> Process:
    """Start `service`: output appended to `log_path` and/or echoed with its name; `on_exit` runs once it ended."""
    popen = subprocess.Popen(service.argv, cwd=cwd, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    return Process(service, popen, log_path, echo, on_exit)


def start_announcing(name: str, argv: Sequence[str], log_path: Path | None = None, timeout_s: float = 30) -> Process:
    """Start a child that prints `{"event": "ready", "url": …}` once it listens; return when it has."""
    process = start(Service(name, list(argv), url=""), log_path)
    with _killed_on_error(process):
        process.url = json.loads(process.wait_for_log(READY_LINE, timeout_s).group(0))["url"]
    return process


def start_gateway(settings: Path, secrets: Path, port: int, log_path: Path, timeout_s: float = 30) -> Process:
    """`hairgate edge`, returned once it has probed its pool (it logs that) and its port answers."""
    gateway = start(hairgate_service("gateway", "edge", settings, secrets, port, "/health"), log_path)
    with _killed_on_error(gateway):
        gateway.wait_for_log(POOL_READY, timeout_s)
        gateway.poll_until(
            lambda: httpx.get(gateway.service.health_url, timeout=1).status_code == 200, "its port", timeout_s
        )
    return gateway


@contextmanager
def _killed_on_error(process: Process) -> Iterator[None]:
    # A start that failed or was interrupted: nobody owns the process yet.
    try:
        yield
    except BaseException:
        process.kill()
        raise
