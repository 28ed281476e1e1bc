"""Rate limiting (gateway.md § Rate limiting): a token bucket per client over `/api/` POSTs.

A bucket holds up to `burst` tokens and refills at `requests_per_minute / 60` per second;
a request takes one token or is refused with `Retry-After` = whole seconds until the next
token (≥ 1; waiting that long lets the next request through). The router checks it before
reading the body, and gives the token back (`refund`) when the request turns out to be a
replay of a stored idempotent answer, which is free.

The client is its IP (`X-Forwarded-For` is believed only from `trusted_proxies`: the
right-most address that is not one of them) and, when `key_header` is set and sent, also
the header's value: such a request takes a token from both buckets, so a client inventing
a new key per request is still held to its IP's limit. With `key_header` the IP's bucket
is the wider one (`ip_requests_per_minute`, `ip_burst`; 10x the key's by default): one
office or backend behind one address serves many keys (`BucketsByKind`). Header values
(API keys) are hashed before they name a bucket, so they never sit in memory dumps or in
Redis.

Buckets live in this process (bounded: buckets that refilled are dropped, and the least
recently used beyond `max_clients`), or in Redis when `edge.shared_state.redis_url` is set
(one Lua script per check: atomic, so several gateways enforce one limit). A failing
Redis never refuses traffic: each gateway falls back to its own buckets, logged once a
minute.
"""

from __future__ import annotations

import hashlib
import ipaddress
import logging
import math
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import coredis

from edge.shared_state import REDIS_ERRORS
from shared.logs import FailureLog
from shared.settings import RateLimitSettings

log = logging.getLogger("edge.rate_limit")

MAX_CLIENTS = 100_000
IP_PREFIX, KEY_PREFIX = "ip:", "key:"  # the two kinds of bucket a client key names
# Float refills may land a hair under a whole token at the advertised Retry-After.
_EPSILON = 1e-9


@dataclass(frozen=True)
class Decision:
    allowed: bool
    retry_after_seconds: int  # 0 when allowed; ≥ 1 when refused


ALLOWED = Decision(True, 0)


class RateLimiter(Protocol):
    async def check(self, client_key: str) -> Decision: ...

    async def refund(self, client_key: str) -> None: ...


class ClientKeys:
    """Who a request counts against: `keys(peer, forwarded_for, key_header_value)`."""

    def __init__(self, settings: RateLimitSettings) -> None:
        self.key_header = settings.key_header  # the header the router passes the value of; "" for none
        self.key_header_name = settings.key_header.lower().encode()  # as ASGI spells it
        networks = [ipaddress.ip_network(entry, strict=False) for entry in settings.trusted_proxies]
        self._trusted_addresses = frozenset(str(n.network_address) for n in networks if n.num_addresses == 1)
        self._trusted_networks = tuple(n for n in networks if n.num_addresses > 1)

    def keys(self, peer: str, forwarded_for: str | None = None, key_header_value: str | None = None) -> tuple[str, ...]:
        """The buckets a request takes a token from: its IP's, then its API key's (if any)."""
        by_ip = IP_PREFIX + self.client_ip(peer, forwarded_for)
        if self.key_header and key_header_value:
            return by_ip, header_key(key_header_value)
        return (by_ip,)

    def client_ip(self, peer: str, forwarded_for: str | None) -> str:
        if not forwarded_for or not self._is_trusted(peer):
            return peer
        hops = [hop.strip() for hop in forwarded_for.split(",") if hop.strip()]
        for hop in reversed(hops):  # proxies append on the right; the left is the client's to forge
            if not self._is_trusted(hop):
                return hop
        return hops[0] if hops else peer

    def _is_trusted(self, address: str) -> bool:
        if address in self._trusted_addresses:
            return True
        if not self._trusted_networks:
            return False
        try:
            parsed = ipaddress.ip_address(address)
        except ValueError:
            return False
        return any(parsed in network for network in self._trusted_networks)


def header_key(value: str) -> str:
    """The name of a `key_header` value's bucket (and idempotency key space): a hash, never the value."""
    return KEY_PREFIX + hashlib.blake2b(value.encode(), digest_size=16).hexdigest()


def scoped_key(key: str, key_header: str, key_header_value: str | None) -> str:
    """An Idempotency-Key as it is stored: with `key_header` set, in the space of that header's
    value (hashed: an API key never sits in the store); requests without one share a space."""
    if not key_header:
        return key
    return f"{header_key(key_header_value)}:{key}" if key_header_value else "anon:" + key


class MemoryRateLimiter:
    """Buckets in this process; `check_now` is the whole cost (about a microsecond)."""

    def __init__(
        self,
        requests_per_minute: float,
        burst: int,
        clock: Callable[[], float] = time.monotonic,
        max_clients: int = MAX_CLIENTS,
    ) -> None:
        self._rate = requests_per_minute / 60
        self._burst = float(burst)
        self._refill_seconds = burst / self._rate  # an untouched bucket is full again after this
        self._clock = clock
        self._max_clients = max_clients
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # key -> (tokens, when), LRU first

    async def check(self, client_key: str) -> Decision:
        return self.check_now(client_key)

    async def refund(self, client_key: str) -> None:
        self.take(client_key, -1)

    def check_now(self, client_key: str) -> Decision:
        return self.take(client_key, 1)

    def take(self, client_key: str, cost: int) -> Decision:
        now = self._clock()
        buckets = self._buckets
        state = buckets.get(client_key)
        tokens = self._burst if state is None else min(self._burst, state[0] + (now - state[1]) * self._rate)
        decision = ALLOWED
        if tokens >= cost - _EPSILON:
            tokens = min(self._burst, tokens - cost)
        else:
            decision = Decision(False, retry_after(tokens, self._rate))
        buckets[client_key] = (tokens, now)
        buckets.move_to_end(client_key)
        self._evict(now)
        return decision

    def _evict(self, now: float) -> None:
        # One look at the least recently used bucket per check keeps memory bounded in O(1).
        if len(self._buckets) > self._max_clients:
            self._buckets.popitem(last=False)
            return
        oldest_key, (_, when) = next(iter(self._buckets.items()))
        if now - when >= self._refill_seconds:  # full again: forgetting it changes nothing
            del self._buckets[oldest_key]

    def __len__(self) -> int:
        return len(self._buckets)


def retry_after(tokens: float, rate_per_second: float) -> int:
    """Whole seconds until `tokens` reaches one token again, at least 1."""
    return max(1, math.ceil((1 - tokens) / rate_per_second - _EPSILON))


# KEYS[1]: the bucket; ARGV: rate per second, burst, now (s), cost (1 to take, -1 to refund).
# Returns {allowed (0/1), tokens after, as a string: Lua numbers become integers on the way out}.
_TAKE = """
local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local now = tonumber(ARGV[3])
local cost = tonumber(ARGV[4])
local state = redis.call('HMGET', KEYS[1], 't', 's')
local tokens = tonumber(state[1])
if tokens == nil then
  tokens = burst
else
  tokens = math.min(burst, tokens + math.max(0, now - tonumber(state[2])) * rate)
end
local allowed = 0
if tokens >= cost - 1e-9 then
  tokens = math.min(burst, tokens - cost)
  allowed = 1
end
redis.call('HSET', KEYS[1], 't', string.format('%.17g', tokens), 's', string.format('%.17g', now))
redis.call('PEXPIRE', KEYS[1], math.ceil((burst - tokens) / rate * 1000) + 1000)
return {allowed, string.format('%.17g', tokens)}
"""


class RedisRateLimiter:
    """Buckets under `hairgate:rate:<client>` in the shared Redis; this gateway's own buckets if it fails."""

    PREFIX = "hairgate:rate:"

    def __init__(
        self,
        redis: coredis.Redis[bytes],
        requests_per_minute: float,
        burst: int,
        clock: Callable[[], float] = time.time,
        fallback: MemoryRateLimiter | None = None,
    ) -> None:
        self._rate = requests_per_minute / 60
        self._burst = burst
        self._clock = clock
        self._take = redis.register_script(_TAKE)
        self._fallback = fallback or MemoryRateLimiter(requests_per_minute, burst)
        self._failures = FailureLog(log, "限流 Redis 不可用，本网关改用内存计数")

    async def check(self, client_key: str) -> Decision:
        return await self._take_token(client_key, 1)

    async def refund(self, client_key: str) -> None:
        await self._take_token(client_key, -1)

    async def _take_token(self, client_key: str, cost: int) -> Decision:
        try:
            allowed: int
            tokens: bytes
            allowed, tokens = await self._take(
                keys=[self.PREFIX + client_key], args=[self._rate, self._burst, self._clock(), cost]
            )
        except REDIS_ERRORS as error:
            self._failures.report(error)
            return self._fallback.take(client_key, cost)
        return ALLOWED if allowed else Decision(False, retry_after(float(tokens), self._rate))


class BucketsByKind:
    """With `key_header`: client IPs' buckets ("ip:…") at their own, wider numbers, API keys'
    ("key:…") at the key's."""

    def __init__(self, by_ip: RateLimiter, by_key: RateLimiter) -> None:
        self._by_ip, self._by_key = by_ip, by_key

    def _of(self, client_key: str) -> RateLimiter:
        return self._by_ip if client_key.startswith(IP_PREFIX) else self._by_key

    async def check(self, client_key: str) -> Decision:
        return await self._of(client_key).check(client_key)

    async def refund(self, client_key: str) -> None:
        await self._of(client_key).refund(client_key)


def build_rate_limiter(settings: RateLimitSettings, redis: coredis.Redis[bytes] | None) -> RateLimiter | None:
    """The configured limiter; None when `enabled` is false."""
    if not settings.enabled:
        return None

    def buckets(requests_per_minute: float, burst: int) -> RateLimiter:
        if redis is not None:
            return RedisRateLimiter(redis, requests_per_minute, burst)
        return MemoryRateLimiter(requests_per_minute, burst)

    by_ip = buckets(*settings.ip_limits)
    if not settings.key_header:
        return by_ip
    return BucketsByKind(by_ip, buckets(settings.requests_per_minute, settings.burst))
