"""Static downloads: how many run at once, and how long a stalled one may hold its slot.

A download streams its file in pieces (`edge.annotations.static_files`), so what a client
that stops reading pins is one piece and a task — but a task, a descriptor and a slot of
the file threads all the same, and for as long as the server waits on its socket. So:
- at most `edge.static_downloads.max_concurrent` `GET /static/…` run at once; the next one
  is answered at once 503 `{"status": "error", "message": …}` with `Retry-After`, never
  queued (a queue would be the same pinning one step earlier);
- while a download is sent, a socket write that does not finish within
  `edge.static_downloads.stall_seconds` (the client took no piece for that long) ends the
  connection (`shared.http_server.ConnectionWrites.send_limit_seconds`), and the slot is
  free as soon as the request's task ends.

The slot is held by ASGI middleware around the whole request (`StaticDownloads.limit`,
installed by `edge.app`), not by the view: Quart sends the answer after the view returned,
and only middleware sees the end of that on every path (finished, cut, client gone).
Refusals and cuts are logged at most once a minute each (an attacker makes many).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from hypercorn.typing import ASGIReceiveCallable, ASGISendCallable, Scope

from edge.exchange import encode, request_path
from shared.http_server import ConnectionWrites, connection_writes
from shared.logs import FailureLog
from shared.settings import StaticDownloadSettings

ASGIApp = Callable[[Scope, ASGIReceiveCallable, ASGISendCallable], Awaitable[None]]

STATIC_PREFIX = "/static/"
RETRY_AFTER_SECONDS = 2  # a slot frees when any download ends; soon, or at the latest a stall later
MSG_TOO_MANY_DOWNLOADS = "同时进行的下载过多，请稍后重试"
MSG_STALLED = "静态文件下载停滞，已断开"
MSG_FULL = "静态文件下载已达上限，已拒绝"

log = logging.getLogger("edge.static")


@dataclass(frozen=True)
class DownloadStatistics:
    running: int
    max_concurrent: int
    refused: int  # since start: answered 503 over the cap
    cut: int  # since start: stalled, their connection ended


class StaticDownloads:
    """The cap on concurrent static downloads and the bound on a stalled one."""

    def __init__(self, settings: StaticDownloadSettings) -> None:
        self._settings = settings
        self._running = 0
        self._refused = 0
        self._cut = 0
        self._refusals = FailureLog(log, MSG_FULL, level=logging.WARNING)
        self._stalls = FailureLog(log, MSG_STALLED, level=logging.WARNING)

    def reconfigure(self, settings: StaticDownloadSettings) -> None:
        """New bounds for downloads that start from now on (a lower cap ends none)."""
        self._settings = settings

    def statistics(self) -> DownloadStatistics:
        return DownloadStatistics(self._running, self._settings.max_concurrent, self._refused, self._cut)

    def limit(self, app: ASGIApp) -> ASGIApp:
        """`app` with every `GET /static/…` counted against the cap and its writes bounded."""

        async def limited(scope: Scope, receive: ASGIReceiveCallable, send: ASGISendCallable) -> None:
            if not _is_download(scope):
                await app(scope, receive, send)
            elif self._running >= self._settings.max_concurrent:
                self._refused += 1
                self._refusals.report(f"上限={self._settings.max_concurrent}")
                await _refuse(send)
            else:
                await self._serve(app, scope, receive, send)

        return limited

    async def _serve(self, app: ASGIApp, scope: Scope, receive: ASGIReceiveCallable, send: ASGISendCallable) -> None:
        settings = self._settings  # this download's bounds, whatever a reload does meanwhile
        writes: ConnectionWrites | None = None
        self._running += 1
        try:
            with _writes_bounded(settings.stall_seconds) as writes:
                await app(scope, receive, send)
        finally:
            self._running -= 1
            if writes is not None and writes.stalled:
                self._cut += 1
                self._stalls.report(f"超过 {settings.stall_seconds:g} 秒未读取")


def _is_download(scope: Scope) -> bool:
    # HEAD sends no file: it is not counted
    return scope["type"] == "http" and scope["method"] == "GET" and request_path(scope).startswith(STATIC_PREFIX)


@contextmanager
def _writes_bounded(seconds: float) -> Iterator[ConnectionWrites | None]:
    """Within: a write of this connection that takes `seconds` ends it (or the server's own
    bound, if shorter); None when not served by Hypercorn (the tests' ASGI client)."""
    writes = connection_writes()
    if writes is None:
        yield None
        return
    before = writes.send_limit_seconds
    writes.send_limit_seconds = min(before, seconds)
    try:
        yield writes
    finally:
        writes.send_limit_seconds = before  # the connection's next request is not a download


async def _refuse(send: ASGISendCallable) -> None:
    body = encode({"status": "error", "message": MSG_TOO_MANY_DOWNLOADS}) + b"\n"
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"retry-after", str(RETRY_AFTER_SECONDS).encode()),
    ]
    await send({"type": "http.response.start", "status": 503, "headers": headers, "trailers": False})
    await send({"type": "http.response.body", "body": body, "more_body": False})
