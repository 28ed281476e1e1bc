"""Static downloads in the app: streamed in pieces, capped, their writes bounded (issue 39 item 2).

The real process under stalled clients: tests/edge/e2e/test_e2e_static_downloads.py.
"""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from edge.annotations.downloads import MSG_TOO_MANY_DOWNLOADS, RETRY_AFTER_SECONDS, StaticDownloads
from edge.annotations.static_files import PIECE_BYTES
from edge.app import create_app
from edge.gateway import Gateway
from shared.http_server import _WRITES, ConnectionWrites, connection_writes
from shared.settings import StaticDownloadSettings

Message = dict[str, Any]
ANNOTATION = "/static/annotations/0b9f6a2e-8d4c-4a57-9c0b-6f1f0a3c2d11.png"


def _scope(path: str = ANNOTATION, method: str = "GET") -> dict[str, Any]:
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"gateway.test")],
        "client": ("127.0.0.1", 40000),
        "server": ("127.0.0.1", 8080),
        "extensions": {},
    }


class Exchange:
    """One ASGI request: a client that sends its (empty) request and records the answer's messages."""

    def __init__(self) -> None:
        self.messages: list[Message] = []
        self.left = trio.Event()  # set: the client disconnects

    async def receive(self) -> Message:
        if not hasattr(self, "_asked"):
            self._asked = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await self.left.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: Message) -> None:
        self.messages.append(message)

    @property
    def status(self) -> int:
        return next(m["status"] for m in self.messages if m["type"] == "http.response.start")

    @property
    def headers(self) -> dict[bytes, bytes]:
        return dict(next(m["headers"] for m in self.messages if m["type"] == "http.response.start"))

    @property
    def pieces(self) -> list[bytes]:
        return [m["body"] for m in self.messages if m["type"] == "http.response.body" and m.get("body")]


class HeldApp:
    """An ASGI app that answers 200 once `release` is set (a download that is still being sent)."""

    def __init__(self) -> None:
        self.release = trio.Event()
        self.fail = False

    async def __call__(self, scope: Any, receive: Callable[[], Awaitable[Message]], send: Any) -> None:
        await self.release.wait()
        if self.fail:
            raise OSError("the disk went away")
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"png", "more_body": False})


def _downloads(max_concurrent: int, stall_seconds: float = 30) -> StaticDownloads:
    return StaticDownloads(StaticDownloadSettings(max_concurrent=max_concurrent, stall_seconds=stall_seconds))


async def test_a_large_annotation_is_sent_in_pieces_never_read_whole(gateway: Gateway) -> None:
    # Issue 39: the file was read whole and handed over as one message; a client that did not
    # read pinned all of it (72 MB each)
    folder = Path(gateway.settings.edge.static_dir) / "annotations"
    folder.mkdir(parents=True)
    name = f"{uuid.uuid4()}.png"
    content = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * (40 * PIECE_BYTES // 256)
    (folder / name).write_bytes(content)
    exchange = Exchange()
    await create_app(gateway)(_scope(f"/static/annotations/{name}"), exchange.receive, exchange.send)
    assert exchange.status == 200 and exchange.headers[b"content-length"] == str(len(content)).encode()
    assert max(len(piece) for piece in exchange.pieces) <= PIECE_BYTES
    assert b"".join(exchange.pieces) == content


async def test_a_head_sends_the_size_and_no_file(gateway: Gateway) -> None:
    folder = Path(gateway.settings.edge.static_dir) / "annotations"
    folder.mkdir(parents=True)
    name = f"{uuid.uuid4()}.png"
    (folder / name).write_bytes(b"\x89PNG\r\n\x1a\n" * 1000)
    exchange = Exchange()
    await create_app(gateway)(_scope(f"/static/annotations/{name}", "HEAD"), exchange.receive, exchange.send)
    assert exchange.status == 200 and exchange.headers[b"content-length"] == b"8000"
    assert exchange.pieces == []


async def test_a_download_over_the_cap_is_refused_at_once_with_retry_after() -> None:
    downloads, app = _downloads(max_concurrent=2), HeldApp()
    limited = downloads.limit(app)
    async with trio.open_nursery() as nursery:
        for _ in range(2):
            nursery.start_soon(limited, _scope(), Exchange().receive, Exchange().send)
        await trio.testing.wait_all_tasks_blocked()
        refused = Exchange()
        with trio.fail_after(1):  # answered now, never queued behind the two
            await limited(_scope(), refused.receive, refused.send)
        assert refused.status == 503
        assert refused.headers[b"retry-after"] == str(RETRY_AFTER_SECONDS).encode()
        assert refused.headers[b"content-type"] == b"application/json"
        assert json.loads(b"".join(refused.pieces)) == {"status": "error", "message": MSG_TOO_MANY_DOWNLOADS}
        stats = downloads.statistics()
        assert (stats.running, stats.max_concurrent, stats.refused) == (2, 2, 1)
        # meanwhile whatever is not a download passes: a HEAD (no file sent), a page, the API
        not_downloads = [_scope(method="HEAD"), _scope("/health"), _scope("/api/v1/hair/measure", "POST")]
        others = {Exchange(): scope for scope in not_downloads}
        for other, scope in others.items():
            nursery.start_soon(limited, scope, other.receive, other.send)
        await trio.testing.wait_all_tasks_blocked()
        assert downloads.statistics().running == 2
        app.release.set()
    assert [other.status for other in others] == [200, 200, 200]
    served = Exchange()
    await limited(_scope(), served.receive, served.send)  # both slots back
    assert served.status == 200 and downloads.statistics().running == 0


async def test_an_absolute_form_target_counts_as_its_path() -> None:
    downloads, app = _downloads(max_concurrent=1), HeldApp()
    limited = downloads.limit(app)
    disguised = _scope(f"http://gateway.test{ANNOTATION}")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(limited, disguised, Exchange().receive, Exchange().send)
        await trio.testing.wait_all_tasks_blocked()
        assert downloads.statistics().running == 1
        app.release.set()


async def test_the_slot_is_freed_when_the_answer_fails() -> None:
    downloads, app = _downloads(max_concurrent=1), HeldApp()
    app.fail = True
    app.release.set()
    with pytest.raises(OSError):
        await downloads.limit(app)(_scope(), Exchange().receive, Exchange().send)
    assert downloads.statistics().running == 0


async def test_the_slot_is_freed_when_the_client_leaves() -> None:
    downloads = _downloads(max_concurrent=1)
    limited = downloads.limit(HeldApp())
    async with trio.open_nursery() as nursery:
        nursery.start_soon(limited, _scope(), Exchange().receive, Exchange().send)
        await trio.testing.wait_all_tasks_blocked()
        assert downloads.statistics().running == 1
        nursery.cancel_scope.cancel()  # as quart-trio cancels the answer of a client that left
    assert downloads.statistics().running == 0


async def test_a_reload_changes_the_cap_for_downloads_that_start_after_it() -> None:
    downloads, app = _downloads(max_concurrent=1), HeldApp()
    limited = downloads.limit(app)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(limited, _scope(), Exchange().receive, Exchange().send)
        await trio.testing.wait_all_tasks_blocked()
        downloads.reconfigure(StaticDownloadSettings(max_concurrent=2))
        second = Exchange()
        nursery.start_soon(limited, _scope(), second.receive, second.send)
        await trio.testing.wait_all_tasks_blocked()
        assert downloads.statistics().running == 2
        app.release.set()
    assert second.status == 200


async def test_a_download_bounds_its_connection_writes_by_stall_seconds_then_restores_them() -> None:
    # Hypercorn's server bounds a write by SEND_LIMIT_SECONDS (300 s): a stalled download held
    # its slot that long. While a download is sent the bound is stall_seconds; the
    # connection's next request (keep-alive) is not a download and gets the server's again.
    downloads = _downloads(max_concurrent=1, stall_seconds=2.5)
    writes = ConnectionWrites()
    seen: list[float] = []

    async def stalled_app(scope: Any, receive: Any, send: Any) -> None:
        current = connection_writes()
        assert current is not None
        seen.append(current.send_limit_seconds)
        current.stalled = current.failed = True  # what the server records when the bound fired

    token = _WRITES.set(writes)
    try:
        await downloads.limit(stalled_app)(_scope(), Exchange().receive, Exchange().send)
    finally:
        _WRITES.reset(token)
    assert seen == [2.5] and writes.send_limit_seconds == math.inf
    assert downloads.statistics().cut == 1
