"""Real `hairgate` processes on loopback for the GPU host's tests, and what to observe them by.

Files come from `cluster.dev.prepare` (the same settings/secrets `hairgate dev` writes),
so these tests also check what dev produces; processes are started and stopped by
`cluster.launcher`. Health gives no event to wait on: it is polled with a deadline.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from skimage import data

from cluster.dev import DevCluster, prepare
from cluster.files import edit_settings
from cluster.launcher import REPO_ROOT, Process, Service, free_ports
from cluster.launcher import start as start_service
from shared.contract import HEADER_TOKEN
from tests.analysis.images import encode, side_by_side

STARTUP_DEADLINE_SECONDS = 120.0  # model loading on a busy 2-core machine


def cluster_files(directory: Path, hosts: int) -> DevCluster:
    """Settings + secrets for `hosts` GPU hosts and a gateway, all under `directory`."""
    gateway_port, *_ = ports = free_ports(hosts + 1)
    cluster = prepare(REPO_ROOT / "settings.toml", hosts, gateway_port, ports[1], directory)
    edge = {
        "static_dir": str(directory / "static"),
        "request_log": str(directory / "request_log.jsonl"),
        "idempotency": {"path": str(directory / "idempotency.sqlite3")},
        "health_check": {"interval_seconds": 0.3, "timeout_seconds": 1},
    }
    edit_settings(cluster.settings_path, {"edge": edge})
    return cluster


def set_settings(settings_path: Path, section: str, **values: Any) -> None:
    edit_settings(settings_path, {section: values})


def start(service: Service, directory: Path) -> Process:
    """`service` running in `directory`, its output in `directory/<name>.log`."""
    return start_service(service, directory / f"{service.name}.log", cwd=directory)


def wait_for(service: Process, token: str, predicate: Callable[[httpx.Response], bool], what: str) -> httpx.Response:
    """Poll the service's health URL until `predicate(response)`; the response."""
    with httpx.Client(timeout=5, headers={HEADER_TOKEN: token}) as client:

        def matching() -> httpx.Response | None:
            response = client.get(service.service.health_url)
            return response if predicate(response) else None

        found = service.poll_until(matching, what, STARTUP_DEADLINE_SECONDS, interval_s=0.1)
        assert found is not None  # poll_until returns only a true value
        return found


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
