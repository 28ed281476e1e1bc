"""Admission of `/api/` requests: the rate limit before the body, the Idempotency-Key around the work.

`Admission.before_body` is the `/api/` route's `admit` hook: one token-bucket check per POST
(a limited client costs a dictionary look-up, not a body read). `Admission.around` wraps
the route's handler: a keyed POST runs at most once per (key, fingerprint) across every
gateway sharing the store, and is replayed byte for byte after that. Replays are free: a
replay refunds the token its request took, and a client over its limit may still fetch a
stored answer. Gateway-made 1007s carry `Retry-After`.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace

from edge.web.http import Outcome, Request, Response, encode
from edge.admission.idempotency import (
    Idempotency,
    IdempotencyUnavailable,
    Result,
    RunResult,
    StoredResponse,
    fingerprint,
    validate_key,
)
from edge.observe.metrics import GatewayMetrics
from edge.admission.rate_limit import ClientKeys, RateLimiter
from shared.contract import (
    HEADER_IDEMPOTENCY_KEY,
    HEADER_IDEMPOTENCY_REPLAYED,
    HEADER_RETRY_AFTER,
    MSG_BACKEND_UNAVAILABLE,
    MSG_IDEMPOTENCY_KEY_REUSED,
    MSG_RATE_LIMITED,
    Code,
    ContractError,
    envelope,
)

_KEY = HEADER_IDEMPOTENCY_KEY.lower().encode()
_REPLAYED = (HEADER_IDEMPOTENCY_REPLAYED.lower().encode(), b"true")
_RETRY_AFTER = HEADER_RETRY_AFTER.lower().encode()
STORE_DOWN_RETRY_AFTER_SECONDS = 5


@dataclass(frozen=True)
class _Admitted:
    """What `before_body` noted: whose bucket paid, and whether it was empty."""

    client_key: str
    limited_retry_after: int | None = None  # over the limit: only a stored replay may be served


class Admission:
    """Rate limit and idempotency for the `/api/` route; either may be off (None)."""

    def __init__(
        self,
        limiter: RateLimiter | None,
        client_keys: ClientKeys,
        idempotency: Idempotency | None,
        metrics: GatewayMetrics,
    ) -> None:
        self.limiter = limiter  # replaceable on a settings reload
        self.client_keys = client_keys
        self._idempotency = idempotency
        self._metrics = metrics

    async def before_body(self, request: Request) -> Response | None:
        if self.limiter is None or request.method != "POST":
            return None
        keys = self.client_keys
        header = request.header(keys.key_header_name) if keys.key_header else None
        client_key = keys.key(request.client_ip, request.header(b"x-forwarded-for"), header)
        decision = await self.limiter.check(client_key)
        if decision.allowed:
            request.admission = _Admitted(client_key)
            return None
        if self._idempotency is not None and _KEY in request.headers:
            # a stored answer costs nothing to replay: look for one once the body is here
            request.admission = _Admitted(client_key, decision.retry_after_seconds)
            return None
        return _rate_limited(request.request_id, decision.retry_after_seconds)

    async def around(self, request: Request, handle: Callable[[], Awaitable[Response]]) -> Response:
        admitted = request.admission if isinstance(request.admission, _Admitted) else None
        raw_key = request.header(_KEY)
        if raw_key is None or self._idempotency is None or request.method != "POST":
            return await handle()
        try:
            key = validate_key(raw_key)
        except ContractError as error:
            return _envelope(request.request_id, error.code, error.message)
        target = f"{request.path}?{request.query}" if request.query else request.path
        print_ = fingerprint(request.method, target, request.body, request.header(b"content-type"))
        try:
            if admitted is not None and admitted.limited_retry_after is not None:
                stored = await self._idempotency.lookup(key, print_)
                if stored is None:
                    return _rate_limited(request.request_id, admitted.limited_retry_after)
                return _replay(stored)
            produced: list[Response] = []
            outcome = await self._idempotency.execute(key, print_, lambda: _run(handle, produced))
        except IdempotencyUnavailable:  # never run a keyed request unprotected
            return _envelope(request.request_id, Code.SYSTEM_ERROR, MSG_BACKEND_UNAVAILABLE, STORE_DOWN_RETRY_AFTER_SECONDS)
        self._metrics.observe_idempotency(outcome.result.value)
        if outcome.result is Result.MISMATCH:
            return _envelope(request.request_id, Code.INVALID_PARAMETER, MSG_IDEMPOTENCY_KEY_REUSED)
        if outcome.replayed:
            if admitted is not None and self.limiter is not None:
                await self.limiter.refund(admitted.client_key)
            assert outcome.response is not None
            return _replay(outcome.response)
        return produced[0]


async def _run(handle: Callable[[], Awaitable[Response]], produced: list[Response]) -> RunResult:
    response = await handle()
    produced.append(response)
    stored = StoredResponse(
        status=response.status,
        headers=tuple((name.decode("latin-1"), value.decode("latin-1")) for name, value in response.headers),
        body=response.body,
        code=response.outcome.code if response.outcome else None,
    )
    return RunResult(stored, storable=response.storable)


def _replay(stored: StoredResponse) -> Response:
    headers = [(name.encode("latin-1"), value.encode("latin-1")) for name, value in stored.headers]
    return Response(
        stored.status,
        stored.body,
        headers=[*headers, _REPLAYED],
        outcome=Outcome(stored.code, idempotent_replay=True),
    )


def _rate_limited(request_id: str, retry_after_seconds: int) -> Response:
    response = _envelope(request_id, Code.SYSTEM_ERROR, MSG_RATE_LIMITED, retry_after_seconds)
    assert response.outcome is not None
    response.outcome = replace(response.outcome, rate_limited=True)
    return response


def _envelope(request_id: str, code: Code, message: str | None, retry_after: float | None = None) -> Response:
    headers = [] if retry_after is None else [(_RETRY_AFTER, str(max(1, math.ceil(retry_after))).encode())]
    body = encode(envelope(code, request_id, None, message))
    return Response(200, body, headers=headers, outcome=Outcome(int(code)), storable=False)
