"""Hypercorn as the gateway runs it: its configuration from `edge` settings, and the one
decision Hypercorn takes before the app is asked — `100 Continue`.

- The header block: h11's `h11_max_incomplete_size` is `edge.max_header_bytes` plus the
  request line's own bytes (`GatewayConfig`), so the server never refuses a head the setting allows. The
  setting itself is enforced by the app (`edge.web.refusals`, with the envelope under
  `/api/`); a head that h11 cannot even finish buffering is refused by the server with the
  same words and limit (`head_limit_bytes`; the envelope under `/api/`, elsewhere 431).
- Body timeouts are the app's (`GatewayRequest`), not Hypercorn's `read_timeout`: that
  one bounds every read of the connection, also while the client quietly waits for a
  long answer, and would cut off a 20 s generation.
- `Expect: 100-continue`: Hypercorn answers `100 Continue` as soon as it has parsed the
  head, before the app runs. For a `Content-Length` over `edge.max_body_bytes` the
  gateway's protocol (`GatewayH11Protocol`) withholds it, so that the client reads
  the 1003 instead of sending megabytes to be dropped.
- HTTP/1.1 only, and a failing connection contained: `shared.http_server`, whose
  protocol this one extends; `edge.main.serve` installs it (`shared.http_server.install`)
  before Hypercorn runs; importing this module changes nothing. An answer is written as
  the base writes it: its head held until the bytes after it, one write.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

import h11
from hypercorn.config import Config

from shared.http_server import HTTP1Protocol, http1_only
from shared.settings import EdgeSettings

REQUEST_LINE_BYTES = 64  # method, spaces, "?", "HTTP/1.1", CRLFs: beyond what the setting counts


LISTEN_BACKLOG = 1024


class GatewayConfig(Config):
    """Hypercorn's config, with what the gateway's `edge` settings decide; a reload calls
    `reconfigure`, and Hypercorn reads the new values where it uses them (the header buffer
    for each new connection, the grace at shutdown, the body limit for each request)."""

    def __init__(self, edge: EdgeSettings) -> None:
        super().__init__()
        self.bind = [edge.bind]
        self.include_server_header = False
        # Hypercorn's 100 overflowed when 200 clients connected at once (the prelaunch test's
        # 1000 keyed requests): connections the kernel had accepted were dropped unanswered.
        # A public entry takes a burst of phones; the kernel caps it at net.core.somaxconn.
        self.backlog = LISTEN_BACKLOG
        self.accesslog = None  # the request log is ours; hypercorn's would double it
        self.errorlog = logging.getLogger("hypercorn.error")  # through our handler, once
        if edge.certfile:
            self.certfile, self.keyfile = edge.certfile, edge.keyfile
        http1_only(self)
        self.reconfigure(edge)

    def reconfigure(self, edge: EdgeSettings) -> None:
        """The settings a reload may change (the listener's own stay as they were bound)."""
        self.h11_max_incomplete_size = edge.max_header_bytes + REQUEST_LINE_BYTES
        # Stopping lets requests in flight finish: up to the longest request timeout.
        self.graceful_timeout = max(edge.dispatch.request_timeout_seconds, edge.dispatch.slow_request_timeout_seconds)
        self.body_limit = edge.max_body_bytes


class GatewayH11Protocol(HTTP1Protocol):
    """Hypercorn's HTTP/1.1 protocol, HTTP/1.1 only (`shared.http_server`); on a gateway
    listener (`GatewayConfig`) it sends no `100 Continue` to a request whose declared body
    is over the limit. Hypercorn has no hook for that decision: `_create_stream` and
    `_send_h11_event` are overridden (pinned, tests/test_framework_pins.py)."""

    _withhold_continue = False

    async def _create_stream(self, request: h11.Request) -> None:
        self._withhold_continue = isinstance(self.config, GatewayConfig) and withholds_continue(
            request.headers, self.config.body_limit
        )
        await super()._create_stream(request)

    async def _send_h11_event(self, event: Any) -> None:
        if isinstance(event, h11.InformationalResponse) and event.status_code == 100 and self._withhold_continue:
            return
        await super()._send_h11_event(event)

    def head_limit_bytes(self) -> int:
        # what the app's own refusal of a large head says (`edge.max_header_bytes`), not h11's
        # buffer, which is larger by the request line's allowance
        if isinstance(self.config, GatewayConfig):
            return self.config.h11_max_incomplete_size - REQUEST_LINE_BYTES
        return super().head_limit_bytes()


def withholds_continue(headers: Iterable[tuple[bytes, bytes]], body_limit: int) -> bool:
    """Whether the gateway sends no `100 Continue` to a request with these (lower-cased)
    headers: its declared Content-Length is over `body_limit`. A chunked body's size is
    unknown until it arrives: it is told to continue, and a refusal drains it."""
    for name, value in headers:
        if name == b"content-length" and value.isdigit():
            return int(value) > body_limit
    return False
