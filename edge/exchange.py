"""The `/api/` request and answer as every layer of the gateway sees them, below all of them.

`Exchange` (request id, headers, body) goes in, `ApiResponse` (status, body, headers, and
the `LogFacts` the request log records) comes out; admission and idempotency
(`edge.admission`), the forward service (`edge.forwarding`) and the routes (`edge.web`)
all import them from here, so no sub-package imports upward from `edge.web`. `encode` is
the JSON every envelope the gateway makes is written with. Nothing here imports the rest
of `edge`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class LogFacts:
    """What the request log records about an answered `/api/` request, besides HTTP facts
    (not `edge.admission.idempotency.Outcome`, which is what a keyed run came to)."""

    code: int | None
    worker: int | None = None
    attempts: int = 0
    queue_seconds: float = 0.0
    idempotent_replay: bool = False
    rate_limited: bool = False
    early_refusal: bool = False
    failed_workers: tuple[int, ...] = ()  # workers whose forward failed before the answer


@dataclass
class Exchange:
    """An `/api/` request as admission and the handlers see it: headers lower-cased
    (X-Forwarded-For hops joined), the body once it has been read."""

    method: str
    path: str
    query: str
    headers: dict[bytes, bytes]
    client_ip: str
    request_id: str
    body: bytes = b""
    admission: object | None = None  # what admission noted before the body, for after it
    execution_id: str = ""

    def header(self, name: bytes) -> str | None:
        value = self.headers.get(name)
        return None if value is None else value.decode("latin-1")


@dataclass
class ApiResponse:
    """An `/api/` answer: status, body, extra headers; `outcome` feeds the request log."""

    status: int
    body: bytes
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    outcome: LogFacts | None = None
    storable: bool = True  # may be replayed to a retry with the same Idempotency-Key


def encode(document: Any) -> bytes:
    """JSON as the gateway sends it: UTF-8, no spaces (an envelope's bytes are part of the contract)."""
    return json.dumps(document, ensure_ascii=False, separators=(",", ":")).encode()
