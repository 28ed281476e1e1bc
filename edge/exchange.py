"""The `/api/` request and answer as every layer of the gateway sees them, below all of them.

`Exchange` (request id, headers, body) goes in, `ApiResponse` (status, body, headers, and
the `LogFacts` the request log records) comes out — whoever answers: a worker through the
forward service (`edge.forwarding`), the gateway's own endpoints (`edge.local`, through
the routes), admission and idempotency (`edge.admission`: a refusal, a replay), the
refusals of `edge.web`. They all import the types from here, so no sub-package imports
upward from `edge.web`; `edge.web.api_routes.as_quart_response` is the one conversion, to
Quart's response. `encode` is the JSON every envelope the gateway makes is written with;
`request_path` the path of an ASGI request as Quart routes it. Nothing here imports the
rest of `edge`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

from shared.contract import (
    HEADER_ERROR_TYPE,
    HEADER_MODEL_VERSION,
    HEADER_RETRY_AFTER,
    HEADER_RETRY_POLICY,
    Code,
    RetryAdvice,
)

_RETRY_AFTER = HEADER_RETRY_AFTER.lower().encode()
_RETRY_POLICY = HEADER_RETRY_POLICY.lower().encode()
_ERROR_TYPE = HEADER_ERROR_TYPE.lower().encode()
MODEL_VERSION_HEADER = HEADER_MODEL_VERSION.lower().encode()  # as h11 and `ApiResponse.headers` name it


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
    error_type: str | None = None  # the last kind a host named (gateway.md § Failure kinds)
    model_version: str | None = None  # what produced the answer (its X-Model-Version); None: nothing did


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
    """An `/api/` answer: status, body, extra headers; `log_facts` feed the request log."""

    status: int
    body: bytes
    log_facts: LogFacts
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    storable: bool = True  # may be replayed to a retry with the same Idempotency-Key

    @classmethod
    def of_envelope(
        cls,
        body: bytes,
        code: int | None,
        *,
        retry_after_seconds: int | None = None,
        storable: bool = True,
        retry_policy: RetryAdvice | None = None,
        error_type: str | None = None,
        model_version: str | None = None,
    ) -> ApiResponse:
        """An envelope (its JSON bytes) as the contract sends it: HTTP 200, `Retry-After`
        when given, with `X-Retry-Policy` (`retry_policy`; a 1007's default is `fixed`: its
        Retry-After is the time to wait), `X-Error-Type` when a kind is known,
        `X-Model-Version` when a model produced it; its code, kind and version in the log facts
        (a stored answer keeps its headers: a replay names the version that produced it)."""
        headers = [] if retry_after_seconds is None else [(_RETRY_AFTER, str(retry_after_seconds).encode())]
        if retry_policy is None and code == Code.SYSTEM_ERROR:
            retry_policy = RetryAdvice.FIXED
        if retry_policy is not None:
            headers.append((_RETRY_POLICY, retry_policy.value.encode()))
        if error_type is not None:
            headers.append((_ERROR_TYPE, error_type.encode()))
        if model_version is not None:
            headers.append((MODEL_VERSION_HEADER, model_version.encode()))
        return cls(200, body, LogFacts(code, error_type=error_type, model_version=model_version), headers, storable)


def encode(document: Any) -> bytes:
    """JSON as the gateway sends it: UTF-8, no spaces (an envelope's bytes are part of the contract)."""
    return json.dumps(document, ensure_ascii=False, separators=(",", ":")).encode()


def request_path(scope: Mapping[str, Any]) -> str:
    """An ASGI request's path as Quart routes it: an absolute-form target ("POST
    http://host/api/…") by its path; the gateway is served at the root (no root_path)."""
    path: str = scope["path"]
    return path if path.startswith("/") else urlparse(path).path
