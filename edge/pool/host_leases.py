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

Giving a lease back publishes the host's URL on `hairgate:host-released`; every gateway
subscribes (`watch`, which also makes the dispatcher its `Listener`), so a gateway that
found a host leased elsewhere takes it the moment it is free instead of at its next look
(`HostLeased.seconds` bounds that hold: the lease's own expiry, for a holder that died).
A (re)subscription reports `None`: a release published while nobody listened may have
been missed, so every such hold ends.

A gateway whose next waiter will take the host at once (`Listener.turn`) keeps the lease
across that local hand-over (for `HANDOVER_GRACE_SECONDS`; the next forward takes it
over): no other gateway's process has to wake up between two jobs. Unless another gateway
*wants* the host: one whose waiter has waited too long (the dispatcher's rule) and found
the host leased marks it wanted (`hairgate:wants:<url>`, for `WANT_SECONDS`); the holder
then gives it back instead of keeping it, and until that mark ends only the gateway that
set it may take the host. So hosts stay where they are while every gateway is served,
and move to one that is not.

Without shared state `NO_HOST_LEASES` holds nothing and costs no round trip.
"""

from __future__ import annotations

import logging
import math
import secrets
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
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

# Where a lease given back is announced (the message: the host's URL).
RELEASE_CHANNEL = "hairgate:host-released"
# A lease kept for this gateway's next waiter lasts this long if that forward never comes.
HANDOVER_GRACE_SECONDS = 0.5
# A host marked wanted by an impatient gateway stays reserved for it this long (it renews
# the mark each time it finds the host leased, at least every LEASE_RECHECK of dispatch.py).
WANT_SECONDS = 1.5

# Resubscribing after the subscription failed waits this long (Redis down: no busy loop).
RESUBSCRIBE_SECONDS = 1.0

# KEYS: the host's lease, its wanted mark. ARGV: this holder's token, its gateway's prefix,
# the lease in ms, "1" when impatient, the mark's ms. Free (and not wanted by another), or
# still this gateway's own: take it. Returns -1 when taken, else the milliseconds before
# another gateway's lease (or mark) ends; an impatient gateway refused marks it wanted.
_ACQUIRE = """
local held = redis.call('GET', KEYS[1])
local wanted = redis.call('GET', KEYS[2])
local mine = ARGV[2]
if held and string.sub(held, 1, string.len(mine)) ~= mine then
  if ARGV[4] == '1' and (not wanted or wanted == mine) then redis.call('SET', KEYS[2], mine, 'PX', ARGV[5]) end
  return redis.call('PTTL', KEYS[1])
end
if wanted and wanted ~= mine and ARGV[4] ~= '1' then return redis.call('PTTL', KEYS[2]) end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[3])
if wanted == mine then redis.call('DEL', KEYS[2]) end
return -1
"""
# KEYS: the host's lease, its wanted mark. ARGV: this holder's token, its gateway's prefix,
# the channel, the host's URL, "1" when its next waiter takes the host, the grace in ms.
# Only its own lease: kept for the next waiter unless another gateway wants the host (2),
# else deleted and announced (1); 0: not ours any more.
_RELEASE = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
local wanted = redis.call('GET', KEYS[2])
if ARGV[5] == '1' and (not wanted or wanted == ARGV[2]) then
  redis.call('PEXPIRE', KEYS[1], ARGV[6])
  return 2
end
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', ARGV[3], ARGV[4])
return 1
"""


class HostLeased(WorkerBusy):
    """Another gateway holds the host's lease: busy elsewhere, nothing was forwarded. Its
    lease ends by itself within `seconds`, if no release is announced before."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"leased by another gateway for up to {seconds:.3f}s")
        self.seconds = seconds


@dataclass(frozen=True)
class Turn:
    """The forward a lease is for, as the dispatcher sees it."""

    impatient: bool = False  # its request has waited long enough not to defer to another gateway
    successor_waiting: bool = False  # a waiter here takes this host as soon as the forward ends


ALONE = Turn()  # what a lease assumes before a listener is known


class Listener(Protocol):
    """The dispatcher, as the leases see it."""

    def turn(self, url: str) -> Turn:
        """The forward to `url` that holds or takes its lease now."""
        ...

    def lease_released(self, url: str | None) -> None:
        """Another gateway gave back its lease on `url`; None: any may have been missed."""
        ...


class HostLeasing(Protocol):
    def hold(self, url: str, timeout_seconds: float) -> AbstractAsyncContextManager[None]: ...

    async def watch(self, listener: Listener, *, task_status: trio.TaskStatus[None] = ...) -> None: ...


class NoHostLeases:
    """No shared state: nothing to coordinate."""

    @asynccontextmanager
    async def hold(self, url: str, timeout_seconds: float) -> AsyncIterator[None]:
        yield

    async def watch(self, listener: Listener, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()  # nothing is ever released elsewhere


NO_HOST_LEASES = NoHostLeases()


class RedisHostLeases:
    """Host leases under `hairgate:host:<url>` in the shared Redis."""

    PREFIX = "hairgate:host:"
    WANTS = "hairgate:wants:"

    def __init__(self, redis: coredis.Redis[bytes]) -> None:
        self._redis = redis
        self._gateway = secrets.token_hex(8) + ":"  # this process: every lease it takes starts so
        self._acquire_script = redis.register_script(_ACQUIRE)
        self._release = redis.register_script(_RELEASE)
        self._listener: Listener | None = None
        self._failures = FailureLog(log, "主机租约 Redis 不可用，由 GPU 主机的忙碌回答把关")

    @asynccontextmanager
    async def hold(self, url: str, timeout_seconds: float) -> AsyncIterator[None]:
        """The host's lease for an attempt of `timeout_seconds`; `HostLeased` when another
        holds it (or it is wanted by another). Given back at the end unless this gateway's
        next waiter takes it over (see the module docstring)."""
        keys = [self.PREFIX + url, self.WANTS + url]
        token = (self._gateway + secrets.token_hex(8)).encode()
        lease_ms = math.ceil((timeout_seconds + timeout_margin_seconds(timeout_seconds)) * 1000)
        left_ms = await self._acquire(
            keys, [token, self._gateway, lease_ms, _flag(self._turn(url).impatient), _ms(WANT_SECONDS)]
        )
        if left_ms is not None and left_ms >= 0:
            raise HostLeased(left_ms / 1000)
        try:
            yield
        finally:
            # shielded: a client that left (cancellation) must not leave the host leased
            with trio.CancelScope(shield=True), trio.move_on_after(LEASE_CALL_SECONDS):
                try:
                    keep = _flag(self._turn(url).successor_waiting)
                    args: list[str | bytes | int] = [token, self._gateway, RELEASE_CHANNEL, url]
                    args += [keep, _ms(HANDOVER_GRACE_SECONDS)]
                    await self._release(keys=keys, args=args)
                except REDIS_ERRORS as error:
                    self._failures.report(error)

    async def _acquire(self, keys: list[str], args: list[str | bytes | int]) -> int | None:
        """-1: ours; else the ms another gateway's lease (or mark) has left; None: Redis did not say (down, slow)."""
        with trio.move_on_after(LEASE_CALL_SECONDS):
            try:
                left: int = await self._acquire_script(keys=keys, args=args)
                return left
            except REDIS_ERRORS as error:
                self._failures.report(error)
                return None
        self._failures.report("timeout")
        return None

    def _turn(self, url: str) -> Turn:
        return ALONE if self._listener is None else self._listener.turn(url)

    async def watch(self, listener: Listener, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Tell `listener` every host whose lease is given back, by any gateway; `None` after
        each (re)subscription. Started at once: Redis down only delays the first subscription."""
        self._listener = listener
        on_release = listener.lease_released
        task_status.started()
        while True:
            try:
                async with self._redis.pubsub(
                    channels=[RELEASE_CHANNEL], ignore_subscribe_messages=True, retry_policy=None
                ) as subscription:
                    on_release(None)
                    async for message in subscription:
                        if message["type"] == "message":
                            data = message["data"]
                            on_release(data.decode() if isinstance(data, bytes) else str(data))
            except* REDIS_ERRORS as errors:  # coredis' task group wraps them
                self._failures.report(errors.exceptions[0])
            await trio.sleep(RESUBSCRIBE_SECONDS)


def _flag(value: bool) -> str:
    return "1" if value else "0"


def _ms(seconds: float) -> int:
    return math.ceil(seconds * 1000)


def build_host_leases(redis: coredis.Redis[bytes] | None) -> HostLeasing:
    return NO_HOST_LEASES if redis is None else RedisHostLeases(redis)
