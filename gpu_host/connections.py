"""Kept-alive connections that close when the host stops: a fix between Hypercorn and quart-trio.

Hypercorn's trio worker watches every idle kept-alive connection with a small task that
closes it at shutdown (or after `keep_alive_timeout`). It starts that task from inside the
app's last `send` of a response. quart-trio cancels the request's nursery as soon as the
response is sent, and trio quietly drops a task whose `nursery.start` was called from a
cancelled scope (`TaskStatus.started`). So after its first response no connection had a
watcher: at SIGTERM an idle connection stayed open, and a request sent on it waited for the
whole grace period before the host went away under it (issue 7, defect 14).

Shielding the app's `send` lets the watcher start. The socket writes under it are shielded
already and bounded (`shared.http_server.SEND_LIMIT_SECONDS`): a reader that stopped cannot
hold this send longer than that.
"""

from __future__ import annotations

import trio
from hypercorn.typing import ASGIFramework, ASGIReceiveCallable, ASGISendCallable, ASGISendEvent, Scope


def close_idle_connections_on_shutdown(app: ASGIFramework) -> ASGIFramework:
    """`app` with every `send` shielded from the app's own cancellations."""

    async def shielded_app(scope: Scope, receive: ASGIReceiveCallable, send: ASGISendCallable) -> None:
        async def shielded_send(message: ASGISendEvent) -> None:
            with trio.CancelScope(shield=True):
                await send(message)

        await app(scope, receive, shielded_send)

    return shielded_app
