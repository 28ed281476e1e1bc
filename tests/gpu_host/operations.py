"""A pool of real GPU hosts serving HTTPS, real gateways in front of it, and steady client load.

Shared by the operations end-to-end tests and `scripts/bench_ops.py`. Every service gets its
own secrets file, as on separate machines: a host persists its accepted tokens there, a
gateway its shared password, and a restarted service reads only that file. Certificates are
`trustme`'s (`tests.fakes.tls`); the gateways verify the hosts against that CA.
"""

from __future__ import annotations

import base64
import itertools
import re
import shutil
import ssl
import sys
import time
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import trio
from PIL import Image
from skimage import data

from cluster.files import edit_settings
from cluster.launcher import POOL_READY, REPO_ROOT, Process, free_ports, hairgate_service
from shared.contract import HEADER_TOKEN, Code
from tests.analysis.images import encode
from tests.fakes.tls import TlsFiles, tls_files
from tests.gpu_host.processes import STARTUP_DEADLINE_SECONDS, cluster_files, start

MEASURE = "/api/v1/hair/measure"
ROTATE_SCRIPT = REPO_ROOT / "scripts" / "rotate_token.py"
# One line per request a host answered (gpu_host/app.py), after the asctime of its logger.
HOST_REQUEST_LINE = re.compile(
    r"^(?P<at>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) .*request \| request_id=\S+ (?:execution_id=\S+ )?endpoint=\S+ "
    r"status=(?P<status>\d+) code=(?P<code>\d+) ms=(?P<ms>\d+)",
    re.MULTILINE,
)
# A host logs a request after encoding its answer, when its model is already free for the
# next job (whose `ms` starts with reading its body): spans from the log may touch by this
# much without two jobs in the model at once. Two jobs really overlapping overlap by a
# model run (a few hundred ms here).
AFTER_MODEL_SLACK_MS = 50


def small_face_json() -> dict[str, str]:
    """A real face at the smallest size a host accepts (480 px), as a small JPEG."""
    face = np.asarray(Image.fromarray(data.astronaut()).resize((480, 480)))
    return {"image_base64": base64.b64encode(encode(face, "JPEG")).decode(), "gender": "unknown"}


@dataclass
class TlsPool:
    """Real GPU hosts serving HTTPS on loopback, each with its own secrets file."""

    directory: Path
    tls: TlsFiles
    settings_path: Path
    token: str  # the token the pool started with
    hosts: list[Process] = field(default_factory=list)
    secrets: list[Path] = field(default_factory=list)

    @classmethod
    def start(cls, directory: Path, count: int) -> TlsPool:
        files = cluster_files(directory, hosts=count)
        tls = tls_files(directory / "tls")
        edit_settings(files.settings_path, {"gpu_host": {"certfile": str(tls.certfile), "keyfile": str(tls.keyfile)}})
        pool = cls(directory, tls, files.settings_path, files.token)
        for service in files.hosts:
            secrets = directory / f"{service.name}.secrets.toml"
            shutil.copy(files.secrets_path, secrets)
            pool.secrets.append(secrets)
            port = int(service.url.rsplit(":", 1)[1])
            https = hairgate_service(service.name, "gpu-host", files.settings_path, secrets, port, "/health")
            pool.hosts.append(start(replace(https, url=https.url.replace("http://", "https://")), directory))
        for host in pool.hosts:
            pool.wait_ready(host)
        return pool

    @property
    def urls(self) -> list[str]:
        return [host.url for host in self.hosts]

    def verify(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.tls.ca_file))

    def wait_ready(self, host: Process, token: str | None = None) -> None:
        with httpx.Client(timeout=5, verify=self.verify(), headers={HEADER_TOKEN: token or self.token}) as client:
            host.poll_until(
                lambda: client.get(host.url + "/health").status_code == 200, "ready", STARTUP_DEADLINE_SECONDS, 0.2
            )

    def restart(self, index: int) -> Process:
        """Stop host `index` and start it again with the same files (it reads its secrets file)."""
        old = self.hosts[index]
        assert old.stop() == 0, old.log_text()[-2000:]
        self.hosts[index] = start(old.service, self.directory)
        return self.hosts[index]

    def request_lines(self, index: int) -> list[re.Match[str]]:
        return list(HOST_REQUEST_LINE.finditer(self.hosts[index].log_text()))

    def stop(self) -> None:
        for host in self.hosts:
            host.stop()


@dataclass
class Gateway:
    process: Process
    settings_path: Path
    secrets_path: Path
    log_path: Path

    @property
    def url(self) -> str:
        return self.process.url


def start_gateway(pool: TlsPool, name: str, ca_file: Path | None = None, wait_online: int | None = None) -> Gateway:
    """`hairgate edge` serving HTTPS in front of every host of `pool`, verified against `ca_file`
    (default: the pool's CA); returned once its port answers and `wait_online` hosts are online."""
    directory = pool.directory / name
    directory.mkdir()
    (port,) = free_ports(1)
    url = f"https://127.0.0.1:{port}"
    settings = directory / "settings.toml"
    shutil.copy(pool.settings_path, settings)
    edge = {
        "bind": f"127.0.0.1:{port}",
        "public_base_url": url,
        "certfile": str(pool.tls.certfile),
        "keyfile": str(pool.tls.keyfile),
        "static_dir": str(directory / "static"),
        "request_log": str(directory / "request_log.jsonl"),
        "idempotency": {"path": str(directory / "idempotency.sqlite3")},
        "metrics_bind": "",
        "rate_limit": {"enabled": False},  # every client here is 127.0.0.1
        "pool": {"workers": pool.urls, "primary_workers": [], "ca_file": str(ca_file or pool.tls.ca_file)},
    }
    edit_settings(settings, {"edge": edge})
    secrets = directory / "secrets.toml"
    shutil.copy(pool.secrets[0], secrets)
    service = replace(hairgate_service(name, "edge", settings, secrets, port, "/gateway-health"), url=url)
    process = start(service, directory)
    gateway = Gateway(process, settings, secrets, directory / f"{name}.log")
    try:
        process.wait_for_log(POOL_READY, 60)
        expected = len(pool.hosts) if wait_online is None else wait_online
        with httpx.Client(timeout=5, verify=pool.verify()) as client:

            def online() -> bool:
                response = client.get(url + "/gateway-health")
                return response.status_code == 200 and response.json()["workers_healthy"] >= expected

            process.poll_until(online, f"{expected} host(s) online", 60, 0.1)
    except BaseException:
        process.kill()
        raise
    return gateway


@dataclass
class Load:
    """What a steady client loop saw: one entry per request, failures with their reason."""

    codes: list[int] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)

    @property
    def count(self) -> int:
        return len(self.codes) + len(self.failures)


async def steady_load(
    url: str, verify: ssl.SSLContext, body: dict[str, Any], stop: trio.Event, load: Load, rate_per_s: float = 10
) -> None:
    """Requests at `rate_per_s` (one at a time per loop) until `stop`; a failure is a transport
    error, an HTTP status other than 200 or a 1007 — anything a client would have to retry."""
    async with httpx.AsyncClient(base_url=url, verify=verify, timeout=60) as client:
        while not stop.is_set():
            due = trio.current_time() + 1 / rate_per_s
            try:
                response = await client.post(MEASURE, json=body)
            except httpx.HTTPError as error:
                load.failures.append(f"{type(error).__name__}: {error}")
            else:
                code = response.json().get("code") if response.status_code == 200 else None
                if code is None or code == Code.SYSTEM_ERROR:
                    load.failures.append(f"HTTP {response.status_code}: {response.text[:200]}")
                else:
                    load.codes.append(code)
            await trio.sleep_until(due)


def overlapping_jobs(lines: list[re.Match[str]]) -> int:
    """Jobs a host ran (status 200) that began before the previous one ended, from its log:
    each line gives the end (asctime) and the duration, so the start is end - ms."""
    spans = []
    for line in lines:
        if line["status"] != "200":
            continue
        end = datetime.strptime(line["at"], "%Y-%m-%d %H:%M:%S,%f").timestamp() * 1000
        spans.append((end - int(line["ms"]), end))
    spans.sort(key=lambda span: span[1])
    return sum(1 for before, after in itertools.pairwise(spans) if after[0] < before[1] - AFTER_MODEL_SLACK_MS)


def busy_answers(lines: list[re.Match[str]]) -> int:
    return sum(1 for line in lines if line["status"] == "503")


def rotate_argv(gateways: list[Gateway], secrets: Path, ca_file: Path, grace_seconds: float = 2) -> list[str]:
    argv = [sys.executable, str(ROTATE_SCRIPT), "--secrets", str(secrets), "--grace-seconds", f"{grace_seconds:g}"]
    argv += ["--ca-file", str(ca_file)]
    for gateway in gateways:
        argv += ["--gateway", gateway.url]
    return argv
