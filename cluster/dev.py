"""`hairgate dev`: the whole system on one machine — N GPU hosts and one gateway, for a first look.

Writes a fresh random token to `var/dev/secrets.toml` (mode 0600, git-ignored) and a dev
settings file `var/dev/settings.toml` that points the gateway at the hosts; starts every
service as a child process (`hairgate gpu-host` / `hairgate edge`, exactly as an operator
would), prefixes their log lines with the service name, waits until every host is ready
and the gateway sees them all, then prints a curl that works. Ctrl-C or SIGTERM stops
everything; so does any service exiting on its own (a dev cluster with a hole in it would
only confuse). Paths are relative to the working directory; one `hairgate dev` at a time
may use it (a second would overwrite the first one's token and settings under it).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import tomlkit

from cluster.files import merge, new_token, write_secrets, write_settings
from cluster.launcher import Process, Service, hairgate_service, start
from shared.contract import HEADER_TOKEN

DEV_DIR = Path("var/dev")
READY_POLL_SECONDS = 0.5
READY_WARN_AFTER_SECONDS = 300
SAMPLE_PHOTO = "astronaut.png"
LOCK_FILE = "dev.lock"


class DirectoryInUse(OSError):
    """Another `hairgate dev` holds the dev directory."""


@dataclass(frozen=True)
class DevCluster:
    """The files and services of one `hairgate dev` run."""

    settings_path: Path
    secrets_path: Path
    token: str
    gateway_url: str
    hosts: list[Service]
    gateway: Service

    @property
    def services(self) -> list[Service]:
        return [*self.hosts, self.gateway]


@contextlib.contextmanager
def holding(directory: Path = DEV_DIR) -> Iterator[None]:
    """The dev directory to this run alone, until it exits (the kernel drops the lock with the
    process, so a killed run leaves nothing to clean up)."""
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / LOCK_FILE, "a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            owner = lock.read().strip() or "?"
            raise DirectoryInUse(
                f"another `hairgate dev` (pid {owner}) runs from {directory}: stop it first"
                " (a second one would overwrite its token and settings)"
            ) from None
        lock.truncate(0)
        lock.write(str(os.getpid()))
        lock.flush()
        yield


def prepare(
    base_config: Path,
    workers: int,
    port: int,
    first_worker_port: int,
    directory: Path = DEV_DIR,
    *,
    metrics_port: int | None = None,
) -> DevCluster:
    """Write the dev settings and secrets; the services to start (no metrics listener
    without `metrics_port`: the committed default port would clash between clusters)."""
    if workers < 1:
        raise ValueError("--workers must be at least 1")
    host_ports = [first_worker_port + index for index in range(workers)]
    gateway_url = f"http://127.0.0.1:{port}"
    edge = {
        "bind": f"127.0.0.1:{port}",
        "public_base_url": gateway_url,
        "pool": {"workers": [f"http://127.0.0.1:{p}" for p in host_ports], "primary_workers": []},
        # Probe often: a dev cluster should show a host as soon as its models are loaded.
        "health_check": {"interval_seconds": 1},
        "metrics_bind": f"127.0.0.1:{metrics_port}" if metrics_port else "",
        # One developer and the benchmarks, all from 127.0.0.1: bursts far beyond a
        # phone's, and the limit stays on (its answers can still be tried with curl).
        "rate_limit": {"requests_per_minute": 6000, "burst": 1000},
    }
    settings = merge(tomlkit.parse(base_config.read_text()), {"edge": edge})
    settings_path = write_settings(directory / "settings.toml", settings)
    token = new_token()
    secrets_path = write_secrets(directory / "secrets.toml", token)

    files = (settings_path, secrets_path)
    hosts = [
        hairgate_service(f"gpu-host-{index + 1}", "gpu-host", *files, host_port, "/health")
        for index, host_port in enumerate(host_ports)
    ]
    gateway = hairgate_service("gateway", "edge", *files, port, "/gateway-health")
    return DevCluster(settings_path, secrets_path, token, gateway_url, hosts, gateway)


def write_sample_photo(directory: Path = DEV_DIR) -> Path | None:
    """A real face to try (scikit-image's astronaut), when scikit-image is installed."""
    try:
        from PIL import Image
        from skimage import data
    except ImportError:
        return None
    path = directory / SAMPLE_PHOTO
    Image.fromarray(data.astronaut()).save(path)
    return path


def banner(cluster: DevCluster, photo: Path | None) -> str:
    image = str(photo) if photo else "photo.jpg"
    return "\n".join(
        [
            "",
            f"hairgate dev: ready — {len(cluster.hosts)} GPU host(s) behind the gateway at {cluster.gateway_url}",
            "  send a photo:",
            f"    curl -F image=@{image} {cluster.gateway_url}/api/v1/hair/measure",
            f"  pool status:  curl {cluster.gateway_url}/monitor",
            f"  token (for the hosts' own ports) is in {cluster.secrets_path}",
            "  Ctrl-C stops everything.",
            "",
        ]
    )


# -- supervision -------------------------------------------------------------------------


class _Signalled(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)


def _raise_signalled(signum: int, _frame: object) -> None:
    raise _Signalled(signum)


def supervise(cluster: DevCluster, photo: Path | None) -> int:
    """Run every service until a signal (exit 0) or until one of them exits (exit 1)."""
    exited: list[Process] = []
    wake = threading.Event()  # a service ended

    def on_exit(process: Process) -> None:
        exited.append(process)
        wake.set()

    processes: list[Process] = []
    previous = {signum: signal.signal(signum, _raise_signalled) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        for service in cluster.services:
            processes.append(start(service, echo=True, on_exit=on_exit))
        if _wait_ready(cluster, wake):
            print(banner(cluster, photo), flush=True)
            wake.wait()
    except _Signalled as received:
        print(f"\nhairgate dev: {received}, stopping every service", flush=True)
    finally:
        for signum in previous:
            signal.signal(signum, signal.SIG_IGN)  # a second Ctrl-C must not cut the stop short
        unexpected = [f"{p.name} exited with code {p.process.returncode}" for p in list(exited)]
        for process in processes:
            process.terminate()  # all at once: they stop in parallel
        for process in processes:
            process.stop()
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    for reason in unexpected:
        print(f"hairgate dev: {reason}; stopped everything", file=sys.stderr, flush=True)
    if not unexpected:
        print("hairgate dev: stopped", flush=True)
    return 1 if unexpected else 0


def _wait_ready(cluster: DevCluster, ended: threading.Event) -> bool:
    """Poll until every host is ready and the gateway counts them all (no event to wait on);
    False if a service ended."""
    warn_at = time.monotonic() + READY_WARN_AFTER_SECONDS
    with httpx.Client(timeout=2, headers={HEADER_TOKEN: cluster.token}) as client:
        waiting = list(cluster.services)
        while waiting and not ended.is_set():
            waiting = [service for service in waiting if not _is_ready(client, service, len(cluster.hosts))]
            if waiting and time.monotonic() > warn_at:
                names = ", ".join(service.name for service in waiting)
                print(f"hairgate dev: {names} still not ready; see the logs above", flush=True)
                warn_at += READY_WARN_AFTER_SECONDS
            if waiting:
                ended.wait(READY_POLL_SECONDS)
    return not ended.is_set()


def _is_ready(client: httpx.Client, service: Service, hosts: int) -> bool:
    try:
        response = client.get(service.health_url)
    except httpx.HTTPError:
        return False
    if response.status_code != 200:
        return False
    return response.json().get("workers_healthy", hosts) >= hosts


def run(args: argparse.Namespace) -> int:
    try:
        with holding():
            return _run_holding(args)
    except DirectoryInUse as error:
        print(f"hairgate dev: {error}", file=sys.stderr)
        return 2


def _run_holding(args: argparse.Namespace) -> int:
    try:
        cluster = prepare(
            Path(args.config), args.workers, args.port, args.first_worker_port, metrics_port=args.metrics_port
        )
    except (OSError, ValueError, tomlkit.exceptions.ParseError) as error:
        print(f"hairgate dev: {error}", file=sys.stderr)
        return 2
    photo = write_sample_photo()
    return supervise(cluster, photo)
