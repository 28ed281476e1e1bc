"""Leases on GPU hosts in the shared Redis, so that several gateways do not forward to a busy host.

gateway.md § Several gateways, one pool: with `edge.shared_state.redis_url` set, a gateway
takes `hairgate:host:<url>` (`SET NX PX`, the attempt's timeout plus the settings' margin)
before it forwards there, and gives it back (compare-and-delete: only its own) when the
forward ends, on every exit path, cancellation included. A host another gateway leases
counts as busy elsewhere without a forward (`HostLeased`, a `WorkerBusy`): the upload is
not sent to a host that would refuse it. A gateway that dies leaves its lease to expire by
itself. A lease's value names its gateway: a lease this gateway still holds (its release
did not get through) is taken over by its next forward there, never mistaken for
another gateway's (this gateway's dispatcher never runs two requests on one host). Redis
down or slow: the forward goes ahead (the host's own busy answer is the guard), logged
once a minute.

Without shared state `NO_HOST_LEASES` holds nothing and costs no round trip.
"""

from __future__ import annotations

import logging
import math
import secrets
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Protocol

import coredis
import trio

from edge.admission.shared_state import REDIS_ERRORS
from edge.pool.failures import WorkerBusy
from shared.logs import FailureLog
from shared.settings import timeout_margin_seconds

log = logging.getLogger("edge.pool")

# A lease Redis does not answer within this is given up (the forward goes ahead, guarded by
# the host's busy answer); short beside any GPU job, long beside a round trip on a busy machine.
LEASE_CALL_SECONDS = 1.0

# KEYS[1]: the host's lease; ARGV: this holder's token, its gateway's prefix, the lease in ms.
# Free, or still this gateway's own: take it. Returns 1 when taken.
_ACQUIRE = """
local held = redis.call('GET', KEYS[1])
if held and string.sub(held, 1, string.len(ARGV[2])) ~= ARGV[2] then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[3])
return 1
"""
# KEYS[1]: the host's lease; ARGV[1]: this holder's token. Deletes only its own lease.
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


class HostLeased(WorkerBusy):
    """Another gateway holds the host's lease: busy elsewhere, nothing was forwarded."""


class HostLeasing(Protocol):
    def hold(self, url: str, timeout_seconds: float) -> AbstractAsyncContextManager[None]: ...


class NoHostLeases:
    """No shared state: nothing to coordinate."""

    @asynccontextmanager
    async def hold(self, url: str, timeout_seconds: float) -> AsyncIterator[None]:
        yield


NO_HOST_LEASES = NoHostLeases()


class RedisHostLeases:
    """Host leases under `hairgate:host:<url>` in the shared Redis."""

    PREFIX = "hairgate:host:"

    def __init__(self, redis: coredis.Redis[bytes]) -> None:
        self._gateway = secrets.token_hex(8) + ":"  # this process: every lease it takes starts so
        self._acquire_script = redis.register_script(_ACQUIRE)
        self._release = redis.register_script(_RELEASE)
        self._failures = FailureLog(log, "主机租约 Redis 不可用，由 GPU 主机的忙碌回答把关")

    @asynccontextmanager
    async def hold(self, url: str, timeout_seconds: float) -> AsyncIterator[None]:
        """The host's lease for an attempt of `timeout_seconds`; `HostLeased` when another holds it."""
        key = self.PREFIX + url
        token = (self._gateway + secrets.token_hex(8)).encode()
        lease_ms = math.ceil((timeout_seconds + timeout_margin_seconds(timeout_seconds)) * 1000)
        if await self._acquire(key, token, lease_ms) is False:
            raise HostLeased
        try:
            yield
        finally:
            # shielded: a client that left (cancellation) must not leave the host leased
            with trio.CancelScope(shield=True), trio.move_on_after(LEASE_CALL_SECONDS):
                try:
                    await self._release(keys=[key], args=[token])
                except REDIS_ERRORS as error:
                    self._failures.report(error)

    async def _acquire(self, key: str, token: bytes, lease_ms: int) -> bool | None:
        """True: ours; False: another gateway's; None: Redis did not say (down, slow)."""
        with trio.move_on_after(LEASE_CALL_SECONDS):
            try:
                taken: int = await self._acquire_script(keys=[key], args=[token, self._gateway, lease_ms])
                return bool(taken)
            except REDIS_ERRORS as error:
                self._failures.report(error)
                return None
        self._failures.report("timeout")
        return None


def build_host_leases(redis: coredis.Redis[bytes] | None) -> HostLeasing:
    return NO_HOST_LEASES if redis is None else RedisHostLeases(redis)
