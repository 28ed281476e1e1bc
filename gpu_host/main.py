"""`hairgate gpu-host`: the whole serving lifecycle of one GPU host, in one place.

settings, token guard, ComfyUI workflow, TLS certificate (any of them wrong: exit 2) -> the
listening socket (bound before anything starts, so a bind error is reported as itself) ->
the model version, hashed once (`gpu_host.version`; logged with its inputs) ->
one nursery that owns the signal handler, the model supervisor, the deep checks (free disk
space; ComfyUI's `/system_stats` when `comfyui_url` is set), the ComfyUI client and
Hypercorn (trio worker) with a shutdown trigger.

SIGTERM/SIGINT: graceful stop, exit 0. Idle kept-alive connections close at once; requests
in flight get `inference_timeout_seconds` (+ `comfyui_timeout_seconds` with ComfyUI) +
`GRACE_MARGIN_SECONDS` to finish; then the model child is killed. SIGHUP: re-read the
settings, swap the accepted tokens (token rotation without a model reload) and take the
new `min_free_disk_mb` (measured against at once); bad settings keep the old ones. The tokens
also change at run time through `/admin/tokens` (`gpu_host.admin`), which persists them to the
secrets file.
"""

from __future__ import annotations

import argparse
import logging
import ssl
import sys
from collections.abc import Callable
from contextlib import AsyncExitStack
from functools import partial
from typing import Any

import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.config import Sockets
from hypercorn.trio.run import worker_serve
from hypercorn.utils import wrap_app

from gpu_host import child
from gpu_host.admin import HostTokens
from gpu_host.app import create_app
from gpu_host.auth import TokenGuard
from gpu_host.checks import HostChecks, written_paths
from gpu_host.comfyui import ComfyUIClient, load_workflow
from gpu_host.connections import close_idle_connections_on_shutdown
from gpu_host.model_process import ModelProcess
from gpu_host.protocol import ChildConfig, ChildEntry
from gpu_host.version import host_model_version
from shared.http_server import http1_only, install
from shared.logs import configure_logging
from shared.secrets_file import SecretsSource
from shared.serving import SignalLog, check_bind, handle_signals
from shared.settings import ENV_ACCEPT_PASSWORDS, GpuHostSettings, Settings, SettingsError, load_settings

log = logging.getLogger("gpu_host.main")

# Beyond the inference itself: reading the upload, encoding and sending the answer.
GRACE_MARGIN_SECONDS = 10.0
# Idle kept-alive connections close after this; the gateway drops its own sooner (4 s,
# edge/pool/upstream.py) so it never sends on a connection the host is closing.
KEEP_ALIVE_TIMEOUT_SECONDS = 5.0


def run(args: argparse.Namespace) -> int:
    configure_logging()
    reload = partial(load_settings, args.config, args.secrets)  # called again on SIGHUP
    try:
        settings = reload()
        bind = check_bind("gpu_host.bind / --bind", args.bind or settings.gpu_host.bind)
        guard = TokenGuard(settings.auth.accept_passwords)
        workflow = load_workflow(settings.gpu_host.comfyui_workflow)
        config = hypercorn_config(settings.gpu_host, bind)
        check_tls(config)
    except (SettingsError, ValueError) as error:
        print(f"hairgate gpu-host: {error}", file=sys.stderr)
        return 2
    tokens = HostTokens(
        guard,
        settings.auth.accept_passwords,
        SecretsSource.locate(args.config, args.secrets, ENV_ACCEPT_PASSWORDS),
    )
    try:
        sockets = listen(config)
    except OSError as error:  # e.g. the port is taken, the address is not ours, no permission
        print(f"hairgate gpu-host: cannot serve on {bind}: {error}", file=sys.stderr)
        return 1
    trio.run(serve, settings, config, sockets, guard, tokens, reload, workflow)
    return 0


def child_config(settings: Settings) -> ChildConfig:
    return ChildConfig(
        bisenet_weights=settings.gpu_host.bisenet_weights,
        device=settings.gpu_host.device,
        limits=settings.analysis,
        simulated_failures_file=settings.gpu_host.simulated_failures_file,
    )


def hypercorn_config(host: GpuHostSettings, bind: str) -> HypercornConfig:
    config = http1_only(HypercornConfig())  # TLS offers HTTP/1.1 alone; serve() installs the rest
    config.bind = [bind]
    # A SIGTERM must not cut a request short: the longest one may run its inference to the
    # timeout, then wait for ComfyUI to its own.
    generation_seconds = host.comfyui_timeout_seconds if host.comfyui_url else 0
    config.graceful_timeout = host.inference_timeout_seconds + generation_seconds + GRACE_MARGIN_SECONDS
    if host.certfile:
        config.certfile, config.keyfile = host.certfile, host.keyfile
    config.keep_alive_timeout = KEEP_ALIVE_TIMEOUT_SECONDS
    config.accesslog = None  # one line per request comes from the app, with its request_id
    config.errorlog = logging.getLogger("hypercorn.error")
    return config


def check_tls(config: HypercornConfig) -> None:
    """Load the certificate and key now, so a wrong file stops the start (ValueError naming
    the keys) instead of failing every handshake later."""
    if not config.ssl_enabled:
        return
    try:
        config.create_ssl_context()
    except (OSError, ssl.SSLError) as error:
        raise ValueError(
            f"gpu_host.certfile / gpu_host.keyfile ({config.certfile}, {config.keyfile}): cannot load: {error}"
        ) from None


def listen(config: HypercornConfig) -> Sockets:
    """The listening sockets, bound now: OSError (with the system's own words) if they cannot be."""
    sockets = config.create_sockets()
    for sock in sockets.insecure_sockets + sockets.secure_sockets:
        sock.listen(config.backlog)
    return sockets


async def serve(
    settings: Settings,
    config: HypercornConfig,
    sockets: Sockets,
    guard: TokenGuard,
    tokens: HostTokens,
    reload: Callable[[], Settings],
    workflow: dict[str, Any],
    *,
    entry: ChildEntry = child.serve,
) -> None:
    """The host's one nursery: signals, the model supervisor, Hypercorn; returns once stopped.
    `workflow`: the ComfyUI graph, used when `gpu_host.comfyui_url` is set."""
    install()  # Hypercorn HTTP/1.1-only and contained, before it serves
    host = settings.gpu_host
    model = ModelProcess(
        child_config(settings),
        inference_timeout_seconds=host.inference_timeout_seconds,
        model_load_timeout_seconds=host.model_load_timeout_seconds,
        entry=entry,
    )
    shutdown = trio.Event()
    # once, before the port opens (hashing BiSeNet's weights takes a moment: not on the loop)
    version = await trio.to_thread.run_sync(
        host_model_version, host.bisenet_weights, workflow if host.comfyui_url else None
    )
    async with AsyncExitStack() as resources, trio.open_nursery() as nursery:
        comfyui = None
        if host.comfyui_url:
            comfyui = await resources.enter_async_context(
                ComfyUIClient(host.comfyui_url, workflow, host.comfyui_timeout_seconds)
            )
        checks = HostChecks(
            written_paths(tokens.secrets_path, host.comfyui_output_dir),
            host.min_free_disk_mb,
            comfyui_probe=comfyui.unreachable if comfyui else None,
            comfyui_probe_interval_seconds=host.comfyui_probe_interval_seconds,
        )
        await nursery.start(checks.run_disk)  # measured once before the port answers
        nursery.start_soon(checks.run_comfyui)
        app = create_app(
            model, guard, settings.analysis, model_version=version.value, comfyui=comfyui, tokens=tokens, checks=checks
        )
        await nursery.start(handle_signals, shutdown, partial(_reload, tokens, checks, reload), _SIGNAL_LOG)
        log.info(
            "GPU host starting | bind=%s tls=%s device=%s bisenet_weights=%s generator=%s tokens=%d "
            "min_free_disk_mb=%d model_version=%s (%s)",
            ",".join(config.bind),
            "on" if config.ssl_enabled else "off",
            host.device,
            host.bisenet_weights or "(none: the hair network)",
            f"comfyui at {host.comfyui_url}" if comfyui else "preview",
            len(settings.auth.accept_passwords),
            host.min_free_disk_mb,
            version.value,
            version.describe(),
        )
        await nursery.start(model.run)
        # Returns after the graceful stop: requests in flight have finished (or hit the grace).
        asgi = wrap_app(close_idle_connections_on_shutdown(app), config.wsgi_max_body_size, "asgi")
        await worker_serve(asgi, config, sockets=sockets, shutdown_trigger=shutdown.wait)
        nursery.cancel_scope.cancel()  # the supervisor kills and reaps the child on its way out
    log.info("GPU host stopped")


_SIGNAL_LOG = SignalLog(
    log,
    stopping="%s received: stopping",
    reload_refused="SIGHUP: settings not reloaded, keeping the current tokens: %s",
)


async def _reload(tokens: HostTokens, checks: HostChecks, reload: Callable[[], Settings]) -> None:
    """SIGHUP: what a running host can take from its settings file without a restart
    (SettingsError: the running tokens and threshold stay)."""
    settings = reload()
    try:
        tokens.reload(settings.auth.accept_passwords)
    except ValueError as error:  # no token at all: a settings file this host cannot serve with
        raise SettingsError(str(error)) from None
    checks.set_min_free_disk_mb(settings.gpu_host.min_free_disk_mb)
