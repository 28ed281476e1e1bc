"""`hairgate dev`: the whole system on one machine — N GPU hosts and one gateway, for a first look.

Writes a fresh random token to `var/dev/secrets.toml` (mode 0600, git-ignored) and a dev
settings file `var/dev/settings.toml` that points the gateway at the hosts; starts every
service as a child process (`hairgate gpu-host` / `hairgate edge`, exactly as an operator
would), prefixes their log lines with the service name, waits until every host is ready
and the gateway sees them all, then prints a curl that works. Ctrl-C or SIGTERM stops
everything; so does any service exiting on its own (a dev cluster with a hole in it would
only confuse). Paths are relative to the working directory.
"""

from __future__ import annotations

import argparse
import os
import secrets
import signal
import subprocess
import sys
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import httpx
import tomlkit
import trio

from shared.contract import HEADER_TOKEN

DEV_DIR = Path("var/dev")
READY_POLL_SECONDS = 0.5
READY_WARN_AFTER_SECONDS = 300
SAMPLE_PHOTO = "astronaut.png"


@dataclass(frozen=True)
class Service:
    name: str
    argv: list[str]
    health_url: str


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


def hairgate_argv() -> list[str]:
    """How to run `hairgate` from this interpreter, whether installed as a script or not."""
    script = Path(sys.executable).with_name("hairgate")
    return [str(script)] if script.exists() else [sys.executable, "-m", "shared.cli"]


def write_secrets(path: Path, token: str) -> None:
    """The token file, created 0600 (never world-readable, not even for a moment)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        handle.write(tomlkit.dumps({"auth": {"shared_password": token, "accept_passwords": [token]}}))


def prepare(base_config: Path, workers: int, port: int, first_worker_port: int, directory: Path = DEV_DIR) -> DevCluster:
    """Write the dev settings and secrets; the services to start."""
    if workers < 1:
        raise ValueError("--workers must be at least 1")
    token = secrets.token_urlsafe(32)
    host_urls = [f"http://127.0.0.1:{first_worker_port + index}" for index in range(workers)]
    gateway_url = f"http://127.0.0.1:{port}"
    document = tomlkit.parse(base_config.read_text())
    edge = document.setdefault("edge", tomlkit.table())
    edge["bind"] = f"127.0.0.1:{port}"
    edge["public_base_url"] = gateway_url
    edge.setdefault("pool", tomlkit.table())
    edge["pool"]["workers"] = host_urls
    edge["pool"]["primary_workers"] = []
    # Probe often: a dev cluster should show a host as soon as its models are loaded.
    edge.setdefault("health_check", tomlkit.table())["interval_seconds"] = 1
    directory.mkdir(parents=True, exist_ok=True)
    settings_path = directory / "settings.toml"
    settings_path.write_text(tomlkit.dumps(document))
    secrets_path = directory / "secrets.toml"
    write_secrets(secrets_path, token)

    common = ["--config", str(settings_path), "--secrets", str(secrets_path)]
    hosts = [
        Service(f"gpu-host-{index + 1}", [*hairgate_argv(), "gpu-host", *common, "--bind", url[len("http://") :]], f"{url}/health")
        for index, url in enumerate(host_urls)
    ]
    gateway = Service("gateway", [*hairgate_argv(), "edge", *common, "--bind", f"127.0.0.1:{port}"], f"{gateway_url}/gateway-health")
    return DevCluster(settings_path, secrets_path, token, gateway_url, hosts, gateway)


def write_sample_photo(directory: Path = DEV_DIR) -> Path | None:
    """A real face to try (scikit-image's astronaut), when scikit-image is installed."""
    try:
        from skimage import data
        from PIL import Image
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


class ServiceExited(Exception):
    """A service stopped on its own; the cluster is torn down."""


async def _pump_output(name: str, stream: trio.abc.ReceiveStream) -> None:
    # Shielded: a service's last words (its shutdown log) come after the cancellation that
    # stops it; the stream ends when the process exits.
    prefix = f"{name:<11}| ".encode()
    pending = b""
    with trio.CancelScope(shield=True):
        async for chunk in stream:
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                sys.stdout.buffer.write(prefix + line + b"\n")
            sys.stdout.buffer.flush()
    if pending:
        sys.stdout.buffer.write(prefix + pending + b"\n")
        sys.stdout.buffer.flush()


async def _run_service(service: Service) -> None:
    async with trio.open_nursery() as nursery:
        process = await nursery.start(
            partial(trio.run_process, service.argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, check=False)
        )
        nursery.start_soon(_pump_output, service.name, process.stdout)
    raise ServiceExited(f"{service.name} exited with code {process.returncode}")


async def _wait_ready(cluster: DevCluster) -> None:
    """Poll until every host is ready and the gateway counts them all (other processes: no event)."""
    headers = {HEADER_TOKEN: cluster.token}
    warn_at = trio.current_time() + READY_WARN_AFTER_SECONDS
    async with httpx.AsyncClient(timeout=2, headers=headers) as client:
        waiting = list(cluster.services)
        while waiting:
            waiting = [service for service in waiting if not await _is_ready(client, service, len(cluster.hosts))]
            if waiting and trio.current_time() > warn_at:
                names = ", ".join(service.name for service in waiting)
                print(f"hairgate dev: {names} still not ready; see the logs above", flush=True)
                warn_at += READY_WARN_AFTER_SECONDS
            if waiting:
                await trio.sleep(READY_POLL_SECONDS)


async def _is_ready(client: httpx.AsyncClient, service: Service, hosts: int) -> bool:
    try:
        response = await client.get(service.health_url)
    except httpx.HTTPError:
        return False
    if response.status_code != 200:
        return False
    body = response.json()
    return body.get("workers_healthy", hosts) >= hosts


async def supervise(cluster: DevCluster, photo: Path | None) -> int:
    """Run every service until a signal (exit 0) or until one of them exits (exit 1)."""
    exited: list[str] = []
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(_stop_on_signal, nursery.cancel_scope)
            for service in cluster.services:
                nursery.start_soon(_run_service, service)
            await _wait_ready(cluster)
            print(banner(cluster, photo), flush=True)
    except* ServiceExited as group:
        exited = [str(error) for error in group.exceptions]
    for reason in exited:
        print(f"hairgate dev: {reason}; stopped everything", file=sys.stderr, flush=True)
    if not exited:
        print("hairgate dev: stopped", flush=True)
    return 1 if exited else 0


async def _stop_on_signal(
    scope: trio.CancelScope, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
) -> None:
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        task_status.started()
        async for signum in signals:
            print(f"\nhairgate dev: {signal.Signals(signum).name}, stopping every service", flush=True)
            scope.cancel()
            return


def run(args: argparse.Namespace) -> int:
    try:
        cluster = prepare(Path(args.config), args.workers, args.port, args.first_worker_port)
    except (OSError, ValueError, tomlkit.exceptions.ParseError) as error:
        print(f"hairgate dev: {error}", file=sys.stderr)
        return 2
    photo = write_sample_photo()
    return trio.run(supervise, cluster, photo)
