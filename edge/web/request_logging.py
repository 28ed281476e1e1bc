"""The request log's ASGI middleware, in the slot Quart documents for one
(`app.asgi_app = RequestLogging(app.asgi_app, …)`; `edge.app` installs it).

Every HTTP request is named on arrival: its `RequestNotes` (the request id, and for an
`/api/` request its execution id from `edge.audit`) go into the ASGI scope, where the
gateway's request (`edge.web.http.GatewayRequest`) finds them and the handlers add what the
log records of the answer (`log_facts`) and what the body was (`exchange`). Each `/api/`
request's line is taken after its answer was written — or with status 499 when its
client left first (quart-trio then cancels the handler: that is how a departed client
frees its place in the queue), or left or stopped reading during it, with the bytes its
socket took. Those bytes are not in any ASGI message: the server counts them on the
connection (`shared.http_server.connection_writes()`, read in the serving task). The
last message of every answer, logged or not, is sent shielded: the disconnect that
Hypercorn's end of the exchange causes must not cancel that end half-way (`_Sent.send`).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, cast

import trio
from hypercorn.typing import ASGIReceiveCallable, ASGISendCallable, ASGISendEvent, Scope

from edge.exchange import Exchange, LogFacts, request_path
from edge.observe.request_log import RequestRecord
from shared.contract import API_PREFIX, HEADER_REQUEST_ID, request_id_from_header
from shared.http_server import connection_writes

if TYPE_CHECKING:
    from edge.audit.trail import AuditTrail

CLIENT_CLOSED = 499  # request-log status of a client that left before its answer (nginx's)
NOTES = "hairgate.notes"  # ASGI scope key: the request's `RequestNotes`
_REQUEST_ID = HEADER_REQUEST_ID.lower().encode()

ASGIApp = Callable[[Scope, ASGIReceiveCallable, ASGISendCallable], Awaitable[None]]


@dataclass
class RequestNotes:
    """What the request log learns of one request beyond its HTTP facts: its ids (given on
    arrival), the `/api/` exchange (`bytes_in`) and the log facts of its answer (set by
    whoever made the answer)."""

    request_id: str
    execution_id: str = ""  # an `/api/` request's (`edge.audit`)
    exchange: Exchange | None = None
    log_facts: LogFacts | None = None


def request_notes(scope: Scope) -> RequestNotes:
    """The request's notes: the middleware's, or new ones for a request made without it
    (as `app.test_request_context()` makes one)."""
    notes = cast(dict[str, Any], scope).get(NOTES)
    if notes is None:
        notes = cast(dict[str, Any], scope)[NOTES] = RequestNotes(_request_id(scope))
    return cast(RequestNotes, notes)


class RequestLogging:
    """ASGI middleware: names each HTTP request on arrival, sends the end of each answer
    whole, and hands each `/api/` request's line to `record` and the audit trail once its
    exchange has ended, however it ended."""

    def __init__(self, app: ASGIApp, record: Callable[[RequestRecord], None], audit: AuditTrail) -> None:
        self._app = app
        self._record = record
        self._audit = audit

    async def __call__(self, scope: Scope, receive: ASGIReceiveCallable, send: ASGISendCallable) -> None:
        if scope["type"] != "http":  # the lifespan
            await self._app(scope, receive, send)
            return
        started = time.perf_counter()
        notes = request_notes(scope)
        path = request_path(scope)
        logged = path.startswith(API_PREFIX)
        if logged:  # named on arrival, before any check
            notes.execution_id = self._audit.received(notes.request_id, path, scope)
        sent = _Sent(send)  # every answer's: its end is sent whole (`_Sent.send`)
        try:
            await self._app(scope, receive, sent.send)
        finally:
            if logged:
                entry = _record(scope, path, notes, sent, started)
                self._record(entry)
                self._audit.finished(notes.execution_id, entry)


class _Sent:
    """What went out on an ASGI connection: the status, the body's size, and whether all of
    it reached the socket (`complete`) or how much did (`sent_bytes`)."""

    def __init__(self, send: ASGISendCallable) -> None:
        self._send = send
        self.status: int | None = None
        self.body_bytes = 0
        self.complete = False
        self._writes = connection_writes()  # None when served without Hypercorn (the tests' ASGI client)
        self._written_before = self._writes.sent_bytes if self._writes else 0

    @property
    def sent_bytes(self) -> int:
        """The body's bytes sent: all of them once complete, else what the socket took for
        this answer (its head included, so at most the body's size)."""
        if self.complete:
            return self.body_bytes
        if self._writes is None:
            return 0
        return min(self.body_bytes, self._writes.sent_bytes - self._written_before)

    async def send(self, message: ASGISendEvent) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
        elif message["type"] == "http.response.body":
            self.body_bytes += len(message.get("body", b""))
            if not message.get("more_body", False):
                # Hypercorn ends the exchange inside this call (and closes the connection
                # when it must): the client's disconnect it causes would otherwise cancel
                # that half-way (quart-trio's receiver cancels the sender). The socket's
                # write below is bounded (`shared.http_server`): a client that stops
                # reading holds this no longer than that.
                with trio.CancelScope(shield=True):
                    await self._send(message)
                self.complete = self._writes is None or not self._writes.failed
                return
        await self._send(message)


def _record(scope: Mapping[str, Any], path: str, notes: RequestNotes, sent: _Sent, started: float) -> RequestRecord:
    facts = notes.log_facts or LogFacts(None)
    client = scope.get("client")
    return RequestRecord(
        ts=datetime.now(UTC).isoformat(timespec="milliseconds"),
        request_id=notes.request_id,
        method=scope["method"],
        path=path,
        client_ip=client[0] if client else "",
        worker=facts.worker,
        attempts=facts.attempts,
        queue_ms=round(facts.queue_seconds * 1000, 3),
        duration_ms=round((time.perf_counter() - started) * 1000, 3),
        http_status=CLIENT_CLOSED if not sent.complete or sent.status is None else sent.status,
        code=facts.code,
        bytes_in=len(notes.exchange.body) if notes.exchange else 0,
        bytes_out=sent.sent_bytes,
        idempotent_replay=facts.idempotent_replay,
        rate_limited=facts.rate_limited,
        early_refusal=facts.early_refusal,
        failed_workers=facts.failed_workers,
        error_type=facts.error_type,
        model_version=facts.model_version,
    )


def _request_id(scope: Mapping[str, Any]) -> str:
    given = next((value for name, value in scope["headers"] if name == _REQUEST_ID), None)
    return request_id_from_header(None if given is None else given.decode("latin-1"))
