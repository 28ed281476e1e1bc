"""Serve a fake's Quart-trio app in-process on a free loopback port (real sockets, real HTTP)."""

from __future__ import annotations

from functools import partial

import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio import serve
from quart_trio import QuartTrio


async def serve_on_loopback(app: QuartTrio, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
    """Serve `app` until cancelled; `nursery.start` gives its base URL (`http://127.0.0.1:PORT`)."""
    config = HypercornConfig()
    config.bind = ["127.0.0.1:0"]
    config.accesslog = None
    config.errorlog = None
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(partial(serve, app, config))
        task_status.started(binds[0])
