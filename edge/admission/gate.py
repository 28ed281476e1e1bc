"""Admission of `/api/` requests: the rate limit before the body, the Idempotency-Key around the work.

`Admission.before_body` runs before the body is read (the app's `before_request`): one
token-bucket check per POST (a limited client costs a dictionary look-up, not a body
read); with `key_header` set, the client IP's bucket is checked as well, so made-up keys
gain nothing. `Admission.around` wraps the route's handler: a keyed POST runs at most
once per (key, fingerprint) across every gateway sharing the store, and is replayed
byte for byte after that. With `key_header` set, Idempotency-Keys are scoped by that header's value: one client can
neither replay nor squat another's key. Replays are free: a replay refunds the tokens its
request took, and a client over its limit may still fetch a stored answer. Gateway-made
1007s carry `Retry-After`. What is stored: the answer of a request that ran, unless it is
a 1007 (the client is told to retry) or nobody was there to receive it.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace

import coredis
import trio

from edge.admission.idempotency import (
    Idempotency,
    IdempotencyUnavailable,
    Result,
    RunResult,
    StoredResponse,
    fingerprint,
    validate_key,
)
from edge.admission.rate_limit import ClientKeys, RateLimiter, build_rate_limiter, scoped_key
from edge.exchange import MODEL_VERSION_HEADER, ApiResponse, Exchange, LogFacts, encode
from edge.observe.metrics import GatewayMetrics
from shared.contract import (
    HEADER_IDEMPOTENCY_KEY,
    HEADER_IDEMPOTENCY_REPLAYED,
    HEADER_REQUEST_ID,
    MSG_BACKEND_UNAVAILABLE,
    MSG_IDEMPOTENCY_KEY_REUSED,
    MSG_RATE_LIMITED,
    Code,
    ContractError,
    envelope,
)
from shared.settings import RateLimitSettings

_KEY = HEADER_IDEMPOTENCY_KEY.lower().encode()
_REPLAYED = (HEADER_IDEMPOTENCY_REPLAYED.lower().encode(), b"true")
STORE_DOWN_RETRY_AFTER_SECONDS = 5
FINGERPRINT_INLINE_BYTES = 64 * 1024  # larger bodies are fingerprinted in a worker thread


@dataclass(frozen=True)
class _Admitted:
    """What `before_body` noted: whose buckets paid, and whether one was empty."""

    client_keys: tuple[str, ...]  # the buckets that gave a token (a replay gives them back)
    limited_retry_after: int | None = None  # over the limit: only a stored replay may be served


class Admission:
    """Rate limit and idempotency for the `/api/` route; either may be off (None)."""

    def __init__(
        self,
        rate_limit: RateLimitSettings,
        redis: coredis.Redis[bytes] | None,
        idempotency: Idempotency | None,
        metrics: GatewayMetrics,
    ) -> None:
        self._rate_limit = rate_limit
        self._redis = redis  # the limiter's buckets, when shared
        self.limiter: RateLimiter | None = build_rate_limiter(rate_limit, redis)
        self.client_keys = ClientKeys(rate_limit)
        self._idempotency = idempotency
        self._metrics = metrics

    def reconfigure(self, rate_limit: RateLimitSettings) -> None:
        """Reloaded rate limits, for requests that start from now on. A new limiter starts
        with full buckets: it is built only when the limits changed."""
        if rate_limit == self._rate_limit:
            return
        self._rate_limit = rate_limit
        self.limiter = build_rate_limiter(rate_limit, self._redis)
        self.client_keys = ClientKeys(rate_limit)

    async def before_body(self, request: Exchange) -> ApiResponse | None:
        if self.limiter is None or request.method != "POST":
            return None
        limiter = self.limiter
        keys = self.client_keys.keys(
            request.client_ip, request.header(b"x-forwarded-for"), self._key_header_value(request)
        )
        paid: list[str] = []
        for client_key in keys:  # the client IP first: a refused request spends no API-key token
            decision = await limiter.check(client_key)
            if not decision.allowed:
                for taken in paid:
                    await limiter.refund(taken)
                break
            paid.append(client_key)
        else:
            request.admission = _Admitted(tuple(paid))
            return None
        if self._idempotency is not None and _KEY in request.headers:
            # a stored answer costs nothing to replay: look for one once the body is here
            request.admission = _Admitted((), decision.retry_after_seconds)
            return None
        return _rate_limited(request.request_id, decision.retry_after_seconds)

    def _key_header_value(self, request: Exchange) -> str | None:
        keys = self.client_keys
        return request.header(keys.key_header_name) if keys.key_header else None

    async def around(self, request: Exchange, handle: Callable[[], Awaitable[ApiResponse]]) -> ApiResponse:
        admitted = request.admission if isinstance(request.admission, _Admitted) else None
        raw_key = request.header(_KEY)
        if raw_key is None or self._idempotency is None or request.method != "POST":
            return await handle()
        try:
            key = self._scoped(validate_key(raw_key), request)
        except ContractError as error:
            return _envelope(request.request_id, error.code, error.message)
        target = f"{request.path}?{request.query}" if request.query else request.path
        arguments = (request.method, target, request.body, request.header(b"content-type"))
        if len(request.body) <= FINGERPRINT_INLINE_BYTES:
            print_ = fingerprint(*arguments)
        else:  # parsing and hashing megabytes takes milliseconds: not on the event loop
            print_ = await trio.to_thread.run_sync(fingerprint, *arguments)
        try:
            if admitted is not None and admitted.limited_retry_after is not None:
                stored = await self._idempotency.lookup(key, print_)
                if stored is None:
                    return _rate_limited(request.request_id, admitted.limited_retry_after)
                return _replay(stored)
            produced: list[ApiResponse] = []
            outcome = await self._idempotency.execute(key, print_, lambda: _run(handle, produced, request.request_id))
        except IdempotencyUnavailable:  # never run a keyed request unprotected
            return _envelope(
                request.request_id, Code.SYSTEM_ERROR, MSG_BACKEND_UNAVAILABLE, STORE_DOWN_RETRY_AFTER_SECONDS
            )
        self._metrics.observe_idempotency(outcome.result.value)
        if outcome.result is Result.MISMATCH:
            return _envelope(request.request_id, Code.INVALID_PARAMETER, MSG_IDEMPOTENCY_KEY_REUSED)
        if outcome.replayed:
            if admitted is not None and self.limiter is not None:
                for client_key in admitted.client_keys:
                    await self.limiter.refund(client_key)
            assert outcome.response is not None
            return _replay(outcome.response)
        return produced[0]

    def _scoped(self, key: str, request: Exchange) -> str:
        """The key as stored (`rate_limit.scoped_key`)."""
        return scoped_key(key, self.client_keys.key_header, self._key_header_value(request))


async def _run(handle: Callable[[], Awaitable[ApiResponse]], produced: list[ApiResponse], request_id: str) -> RunResult:
    response = await handle()
    produced.append(response)
    code = response.log_facts.code
    headers = tuple((name.decode("latin-1"), value.decode("latin-1")) for name, value in response.headers)
    stored = StoredResponse(
        status=response.status,
        # a replay is this answer: its X-Request-ID names the request the envelope names
        headers=(*headers, (HEADER_REQUEST_ID, request_id)),
        body=response.body,
        code=code,
    )
    # A 1007 tells the client to retry (the gateway's own, or a worker's: a model restart,
    # a timeout): storing it would answer every retry with the same failure for a day.
    return RunResult(stored, storable=response.storable and code != Code.SYSTEM_ERROR)


def _replay(stored: StoredResponse) -> ApiResponse:
    headers = [(name.encode("latin-1"), value.encode("latin-1")) for name, value in stored.headers]
    # the version stored with the answer (its X-Model-Version), not the pool's now: the same bytes
    version = next((value.decode("latin-1") for name, value in headers if name == MODEL_VERSION_HEADER), None)
    return ApiResponse(
        stored.status,
        stored.body,
        headers=[*headers, _REPLAYED],
        log_facts=LogFacts(stored.code, idempotent_replay=True, model_version=version),
    )


def _rate_limited(request_id: str, retry_after_seconds: int) -> ApiResponse:
    response = _envelope(request_id, Code.SYSTEM_ERROR, MSG_RATE_LIMITED, retry_after_seconds)
    response.log_facts = replace(response.log_facts, rate_limited=True)
    return response


def _envelope(request_id: str, code: Code, message: str | None, retry_after: float | None = None) -> ApiResponse:
    seconds = None if retry_after is None else max(1, math.ceil(retry_after))
    body = encode(envelope(code, request_id, None, message))
    return ApiResponse.of_envelope(body, int(code), retry_after_seconds=seconds, storable=False)
