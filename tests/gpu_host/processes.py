"""Real `hairgate` processes on loopback for the GPU host's tests, and what to observe them by.

Files come from `gpu_host.dev.prepare` (the same settings/secrets `hairgate dev` writes),
so these tests also check what dev produces. Other processes give no event to wait on:
readiness is polled with a deadline, never a bare sleep.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import tomlkit
from skimage import data

from gpu_host.dev import DevCluster, Service, prepare
from shared.contract import HEADER_TOKEN
from tests.analysis.images import encode, side_by_side
from tests.fakes.launch import child_env

REPO_ROOT = Path(__file__).resolve().parents[2]
PORT_RANGE = (20000, 20499)
STARTUP_DEADLINE_SECONDS = 120.0  # model loading on a busy 2-core machine


def free_ports(count: int) -> list[int]:
    """`count` consecutive free loopback ports in this package's range."""
    for _ in range(200):
        first = random.randint(PORT_RANGE[0], PORT_RANGE[1] - count)
        ports = list(range(first, first + count))
        if all(_is_free(port) for port in ports):
            return ports
    raise RuntimeError(f"no {count} consecutive free ports in {PORT_RANGE}")


def _is_free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def cluster_files(directory: Path, hosts: int) -> DevCluster:
    """Settings + secrets for `hosts` GPU hosts and a gateway, all under `directory`."""
    gateway_port, *_ = ports = free_ports(hosts + 1)
    cluster = prepare(REPO_ROOT / "settings.toml", hosts, gateway_port, ports[1], directory)
    _point_var_paths_into(cluster.settings_path, directory)
    return cluster


def _point_var_paths_into(settings_path: Path, directory: Path) -> None:
    document = tomlkit.parse(settings_path.read_text())
    edge = document["edge"]
    edge["static_dir"] = str(directory / "static")
    edge["request_log"] = str(directory / "request_log.jsonl")
    edge.setdefault("idempotency", tomlkit.table())["path"] = str(directory / "idempotency.sqlite3")
    edge["health_check"]["interval_seconds"] = 0.3
    edge["health_check"]["timeout_seconds"] = 1
    settings_path.write_text(tomlkit.dumps(document))


def set_settings(settings_path: Path, section: str, **values: Any) -> None:
    document = tomlkit.parse(settings_path.read_text())
    for key, value in values.items():
        document[section][key] = value
    settings_path.write_text(tomlkit.dumps(document))


class ServiceProcess:
    """One started service; its combined output goes to a log file."""

    def __init__(self, service: Service, log_path: Path) -> None:
        self.service = service
        self.log_path = log_path
        with open(log_path, "ab") as log:
            self.process = subprocess.Popen(
                service.argv, cwd=log_path.parent, env=child_env(), stdout=log, stderr=subprocess.STDOUT
            )

    @property
    def url(self) -> str:
        return self.service.health_url.rsplit("/", 1)[0]

    @property
    def pid(self) -> int:
        return self.process.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, signum: int = signal.SIGTERM, timeout: float = 30) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signum)
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise


def start(service: Service, directory: Path) -> ServiceProcess:
    return ServiceProcess(service, directory / f"{service.name}.log")


def wait_for(service: ServiceProcess, token: str, predicate: Any, what: str) -> httpx.Response:
    """Poll the service's health URL until `predicate(response)`; the response."""
    deadline = time.monotonic() + STARTUP_DEADLINE_SECONDS
    with httpx.Client(timeout=5, headers={HEADER_TOKEN: token}) as client:
        while time.monotonic() < deadline:
            if service.process.poll() is not None:
                raise AssertionError(f"{service.service.name} exited ({service.process.returncode}):\n{service.log()}")
            try:
                response = client.get(service.service.health_url)
                if predicate(response):
                    return response
            except httpx.TransportError:
                pass
            time.sleep(0.1)
    raise AssertionError(f"{service.service.name}: {what} not within {STARTUP_DEADLINE_SECONDS} s:\n{service.log()}")


def child_pids(pid: int) -> list[int]:
    """Direct children of `pid` (Linux /proc)."""
    children: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        children += [int(p) for p in (task / "children").read_text().split()]
    return children


def model_child_pid(host_pid: int) -> int:
    """The host's model child (its other child is multiprocessing's resource tracker)."""
    (pid,) = [p for p in child_pids(host_pid) if b"spawn_main" in Path(f"/proc/{p}/cmdline").read_bytes()]
    return pid


def mapped_libraries(pid: int) -> str:
    """The shared objects a process has mapped: proof of what it imported."""
    return Path(f"/proc/{pid}/maps").read_text()


def is_running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    status = Path(f"/proc/{pid}/status")
    return not status.exists() or "zombie" not in status.read_text()


def astronaut_png() -> bytes:
    return encode(data.astronaut(), "PNG")


def two_faces_png() -> bytes:
    face = data.astronaut()
    return encode(side_by_side(face, face), "PNG")
