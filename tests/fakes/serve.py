"""Serve a fake's Quart-trio app in-process on a free loopback port (real sockets, real HTTP)."""

from __future__ import annotations

from functools import partial

import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio import serve
from quart_trio import QuartTrio


async def serve_on_loopback(
    app: QuartTrio, *, port: int = 0, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED
) -> None:
    """Serve `app` on loopback `port` (0: a free one) until cancelled; `nursery.start` gives
    its base URL (`http://127.0.0.1:PORT`)."""
    config = HypercornConfig()
    config.bind = [f"127.0.0.1:{port}"]
    config.accesslog = None
    config.errorlog = None
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(partial(serve, app, config))
        task_status.started(binds[0])
