"""Leases on GPU hosts in the shared Redis, so that several gateways do not forward to a busy host.

gateway.md § Several gateways, one pool: with `edge.shared_state.redis_url` set, a gateway
takes `hairgate:host:<url>` (`SET NX PX`, `edge.shared_state.lease_seconds`, a few seconds)
before it forwards there, renews it while the forward runs (a heartbeat in the forward's
own nursery: compare-and-extend every third of the lease, only while it is still its own,
and never past the attempt's timeout plus the settings' margin), and gives it back
(compare-and-delete: only its own) when the forward ends, on every exit path, cancellation
included. A host another gateway leases counts as busy elsewhere without a forward
(`HostLeased`, a `WorkerBusy`): the upload is not sent to a host that would refuse it. A
gateway that dies stops renewing: its leases end within `lease_seconds` (it was the
attempt's timeout plus a margin, 189 s for a generation, before the heartbeat). Sooner
still when the host says so: a lease found on a host whose probe, sent at least
`TAKEOVER_AFTER_SECONDS` after this gateway first found that lease there, says it is free
and idle is stale (its holder's job is not on the host, and a live holder's upload would
have arrived by then), and this gateway takes it over (`host_probed`; atomically, only
that very lease: compare-and-set on its token). A lease's value names its gateway: a
lease this gateway still holds (its release did not get through) is taken over by its
next forward there, never mistaken for another gateway's (this gateway's dispatcher never
runs two requests on one host). Redis down or slow: the forward goes ahead (the host's
own busy answer is the guard), logged once a minute; for `REDIS_BACKOFF_SECONDS` after a
failed call the forwards do not ask it (a lease left behind then expires by itself).

Giving a lease back publishes the host's URL on `hairgate:host-released`; every other
gateway hears it (`watch`, which also makes the dispatcher its `Listener`), so a gateway
that found a host leased elsewhere takes it the moment it is free instead of at its next look
(`HostLeased.seconds` bounds that hold: the lease's own expiry, for a holder that died).
A (re)subscription reports `None`: a release published while nobody listened may have
been missed, so every such hold ends. A stale lease that may be taken over ends the hold
on its host the same way.

A gateway whose next waiter will take the host at once (`Listener.turn`) keeps the lease
across that local hand-over without a round trip: the lease stays in Redis as it is (its
last renewal left it most of `lease_seconds`), the next forward there starts at once and
its heartbeat renews it at once, in the background; a lease kept that no forward here
takes over within `HANDOVER_GRACE_SECONDS` is given back (and announced).
So no other gateway's process has to wake up between two jobs, and no Redis round trip
lies between a job's answer and the next job here. Unless another gateway *wants* the
host: one whose waiter has waited too long (the dispatcher's rule) and found the host
leased marks it wanted (`hairgate:wants:<url>`, for `WANT_SECONDS`) and announces that
on `hairgate:host-wanted`; the holder, which hears it (or learns it from its next
renewal's answer, for an announcement missed), gives the host back at the end of its
forward instead of keeping it, and until that mark ends only the gateway that set it may
take the host. So hosts stay where they are while every gateway is served, and move to
one that is not.

Without shared state `NO_HOST_LEASES` holds nothing and costs no round trip.
"""

from __future__ import annotations

import logging
import math
import secrets
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import NoReturn, Protocol

import coredis
import trio
from coredis.commands import Script

from edge.pool.errors import WorkerBusy
from edge.shared_state import REDIS_ERRORS
from shared.logs import FailureLog
from shared.settings import timeout_margin_seconds

log = logging.getLogger("edge.pool")

# A lease Redis does not answer within this is given up (the forward goes ahead, guarded by
# the host's busy answer); short beside any GPU job, long beside a round trip on a busy machine.
LEASE_CALL_SECONDS = 1.0
# After Redis failed a call (down, or hung) the forwards skip it for this long: a Redis that
# hangs would otherwise cost every forward LEASE_CALL_SECONDS twice.
REDIS_BACKOFF_SECONDS = 1.0
# A forward renews its lease this many times per lease: one renewal lost or late (each waits
# LEASE_CALL_SECONDS at most) leaves the lease alive until the next.
RENEWALS_PER_LEASE = 3
# Another gateway's lease is stale when a probe sent this long after this gateway first found
# it on the host says the host is free and idle: the holder's upload, sent once it took the
# lease, would have arrived and made the host busy by then (the host's busy answer guards an
# upload slower than that).
TAKEOVER_AFTER_SECONDS = 1.0

# Where a lease given back is announced, and a host marked wanted (each message: the
# announcing gateway's prefix, then the host's URL).
RELEASE_CHANNEL = "hairgate:host-released"
WANTED_CHANNEL = "hairgate:host-wanted"
# A lease kept for this gateway's next waiter is given back if no forward here takes it over so soon.
HANDOVER_GRACE_SECONDS = 0.5
# A host marked wanted by an impatient gateway stays reserved for it this long (it renews
# the mark each time it finds the host leased, at least every LEASE_RECHECK of dispatch.py).
WANT_SECONDS = 1.5

# Resubscribing after the subscription failed waits this long (Redis down: no busy loop).
RESUBSCRIBE_SECONDS = 1.0

# KEYS: the host's lease, its wanted mark. ARGV: this holder's token, its gateway's prefix,
# the lease in ms, "1" when impatient, the mark's ms, the wanted channel, the host's URL, the
# token of another gateway's lease its host said is stale ('': none). Free (and not wanted
# by another), still this gateway's own, or exactly that stale lease: take it. Returns
# {-1} when taken, {-3} when that stale lease was taken over, else {the milliseconds (>= 0)
# before another gateway's lease (or mark) ends, that lease's token ('': a mark refused it)};
# an impatient gateway refused marks the host wanted and announces it.
_ACQUIRE = """
local held = redis.call('GET', KEYS[1])
local wanted = redis.call('GET', KEYS[2])
local mine = ARGV[2]
local stale = held and ARGV[8] ~= '' and held == ARGV[8]
if held and not stale and string.sub(held, 1, string.len(mine)) ~= mine then
  if ARGV[4] == '1' and (not wanted or wanted == mine) then
    redis.call('SET', KEYS[2], mine, 'PX', ARGV[5])
    redis.call('PUBLISH', ARGV[6], mine .. ARGV[7])
  end
  return {math.max(redis.call('PTTL', KEYS[1]), 0), held}
end
if wanted and wanted ~= mine and ARGV[4] ~= '1' then return {math.max(redis.call('PTTL', KEYS[2]), 0), ''} end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[3])
if wanted == mine then redis.call('DEL', KEYS[2]) end
if stale then return {-3, ''} end
return {-1, ''}
"""
# KEYS: the host's lease, its wanted mark. ARGV: this holder's token, its gateway's prefix,
# the lease in ms. The heartbeat: extended if still its own (never re-created: it lapsed, was
# taken over, or a release of its own came first). Returns -2 when not its own any more,
# -1 when extended, else the ms another gateway's mark on the host has left.
_RENEW = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return -2 end
redis.call('PEXPIRE', KEYS[1], ARGV[3])
local wanted = redis.call('GET', KEYS[2])
if wanted and wanted ~= ARGV[2] then return math.max(redis.call('PTTL', KEYS[2]), 0) end
return -1
"""
# KEYS: the host's lease. ARGV: this holder's token, the channel, the message. Only its
# own lease: deleted and announced (1); 0: not its own any more.
_RELEASE = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', ARGV[2], ARGV[3])
return 1
"""
_NOT_OURS, _TAKEN_OVER = -2, -3  # the scripts' answers (see each)


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
        """Another gateway gave back its lease on `url`, or that lease may be taken over (its
        host said it is idle under it); None: any release may have been missed."""
        ...


class HostLeasing(Protocol):
    def hold(self, url: str, timeout_seconds: float) -> AbstractAsyncContextManager[None]: ...

    async def watch(self, listener: Listener, *, task_status: trio.TaskStatus[None] = ...) -> None: ...

    def host_probed(self, url: str, sent_at: float, *, free: bool) -> None:
        """The prober's word on `url`: a probe sent at `sent_at` found it free and idle or not."""
        ...


class NoHostLeases:
    """No shared state: nothing to coordinate."""

    @asynccontextmanager
    async def hold(self, url: str, timeout_seconds: float) -> AsyncIterator[None]:
        yield

    async def watch(self, listener: Listener, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()  # nothing is ever released elsewhere

    def host_probed(self, url: str, sent_at: float, *, free: bool) -> None:
        pass  # no lease of another gateway to judge


NO_HOST_LEASES = NoHostLeases()


@dataclass(eq=False)
class _Held:
    """A lease this gateway holds (or believes it holds) on one host."""

    token: bytes
    ours: bool = True  # False: Redis did not take it, or says it is no longer ours


@dataclass(eq=False)
class _Sighting:
    """Another gateway's lease as this gateway found it on a host, and the host's word since."""

    token: bytes
    since: float  # when this gateway first found it there (trio's clock, as a probe's sent_at)
    last_probe_at: float = -math.inf
    stale: bool = False  # the latest probe, sent TAKEOVER_AFTER_SECONDS or more after `since`, said free

    def probed(self, sent_at: float, *, free: bool) -> bool:
        """A probe's word; True when it makes the lease stale (it was not)."""
        if sent_at < max(self.since, self.last_probe_at):
            return False  # older news (probes run concurrently): the later word stands
        self.last_probe_at = sent_at
        was_stale = self.stale
        self.stale = free and sent_at >= self.since + TAKEOVER_AFTER_SECONDS
        return self.stale and not was_stale


class RedisHostLeases:
    """Host leases under `hairgate:host:<url>` in the shared Redis, `lease_seconds` long unless renewed."""

    PREFIX = "hairgate:host:"
    WANTS = "hairgate:wants:"

    def __init__(self, redis: coredis.Redis[bytes], lease_seconds: float) -> None:
        self._redis = redis
        self._gateway = secrets.token_hex(8) + ":"  # this process: every lease it takes starts so
        self._lease_ms = _ms(lease_seconds)
        self._renew_every = lease_seconds / RENEWALS_PER_LEASE
        self._acquire_script = redis.register_script(_ACQUIRE)
        self._renew_script = redis.register_script(_RENEW)
        self._release_script = redis.register_script(_RELEASE)
        self._listener: Listener | None = None
        self._background: trio.Nursery | None = None  # while watching: kept leases' graces
        self._kept: dict[str, _Held] = {}  # url -> a lease kept for the next forward here
        self._wanted_until: dict[str, float] = {}  # url -> when another gateway's mark on it ends (trio clock)
        self._sightings: dict[str, _Sighting] = {}  # url -> another gateway's lease last found there
        self._skip_redis_until = -math.inf  # Redis failed lately: forwards go ahead without asking it
        self._failures = FailureLog(log, "主机租约 Redis 不可用，由 GPU 主机的忙碌回答把关")

    @asynccontextmanager
    async def hold(self, url: str, timeout_seconds: float) -> AsyncIterator[None]:
        """The host's lease for an attempt of `timeout_seconds`, renewed while it runs;
        `HostLeased` when another holds it (or it is wanted by another). Given back at the
        end unless this gateway's next waiter takes it over (see the module docstring)."""
        keys = [self.PREFIX + url, self.WANTS + url]
        kept = self._kept.pop(url, None)
        if kept is not None and self._background is not None:  # kept for this forward: no round trip first
            held = kept
        else:
            held = await self._take(url, keys)
        # a forward cannot run longer than its attempt (it is cancelled then): a lease renewed
        # past that would be a forward that outlived its own timeout holding the host for good
        renew_until = trio.current_time() + timeout_seconds + timeout_margin_seconds(timeout_seconds)
        keep = False
        try:
            async with self._renewed(url, keys, held, at_once=held is kept, until=renew_until):
                yield
            keep = held.ours and self._keeps(url)  # an answer came: the next job may go there at once
        finally:
            if keep and self._background is not None:
                self._kept[url] = held
                self._background.start_soon(self._give_back_unclaimed, url, held)
            else:
                # shielded: a client that left (cancellation) must not leave the host leased
                with trio.CancelScope(shield=True):
                    await self._give_back(url, held)

    @asynccontextmanager
    async def _renewed(
        self, url: str, keys: list[str], held: _Held, *, at_once: bool, until: float
    ) -> AsyncIterator[None]:
        """The heartbeat beside the forward, in a nursery of the forward's own: it ends with
        the forward on every exit path and can outlive it on none (a gateway that dies stops
        it with everything else, and its lease lapses within the lease's time)."""
        try:
            async with trio.open_nursery() as heartbeat:
                heartbeat.start_soon(self._renew_while_held, url, keys, held, at_once, until)
                try:
                    yield
                finally:
                    heartbeat.cancel_scope.cancel()
        except BaseExceptionGroup as group:
            if len(group.exceptions) != 1:
                raise
            _raise_alone(group.exceptions[0])

    async def _renew_while_held(self, url: str, keys: list[str], held: _Held, at_once: bool, until: float) -> None:
        """Renew `held` every `RENEWALS_PER_LEASE`-th of the lease while it is ours, until
        `until`; a lease kept from this gateway's last forward there at once (it aged
        through the hand-over, and a mark set on the host meanwhile is learned so)."""
        next_renewal = trio.current_time() + (0 if at_once else self._renew_every)
        while held.ours and next_renewal < until:
            await trio.sleep_until(next_renewal)
            await self._renew(url, keys, held)
            next_renewal += self._renew_every  # by the clock, not after the answer: a slow one does not push them all

    async def _renew(self, url: str, keys: list[str], held: _Held) -> None:
        answer = await self._call(self._renew_script, keys, [held.token, self._gateway, self._lease_ms])
        if answer == _NOT_OURS:  # lapsed (renewals failed), or taken over: the host's busy answer guards this forward
            held.ours = False
            log.warning("主机租约已不属于本网关（已过期或被接管），本次转发由主机的忙碌回答把关 | url=%s", url)
        elif isinstance(answer, int) and answer >= 0:  # wanted elsewhere, and its announcement missed
            self._wanted_until[url] = trio.current_time() + answer / 1000

    async def _take(self, url: str, keys: list[str]) -> _Held:
        """A new lease, or `HostLeased`; not ours when Redis did not answer (the forward goes ahead)."""
        held = _Held((self._gateway + secrets.token_hex(8)).encode())
        impatient = self._turn(url).impatient
        sighting = self._sightings.get(url)
        stale = sighting.token if sighting is not None and sighting.stale else b""
        args: list[str | bytes | int] = [held.token, self._gateway, self._lease_ms, _flag(impatient), _ms(WANT_SECONDS)]
        answer = await self._call(self._acquire_script, keys, [*args, WANTED_CHANNEL, url, stale])
        if answer is None:
            held.ours = False
            return held
        left_ms, holder = _acquired(answer)
        if left_ms >= 0:
            self._found(url, holder)
            raise HostLeased(left_ms / 1000)
        self._sightings.pop(url, None)
        if left_ms == _TAKEN_OVER:
            log.warning("接管主机租约：主机报告空闲，另一网关的租约却仍在（其网关已停止） | url=%s", url)
        if not impatient:  # no other gateway's mark was there, or it would have been refused
            self._wanted_until.pop(url, None)
        return held

    def _found(self, url: str, holder: bytes) -> None:
        """Another gateway's lease found on `url`: the probes sent long enough after this
        first sighting judge it (a lease that changed hands is a new one)."""
        sighting = self._sightings.get(url)
        if holder and (sighting is None or sighting.token != holder):
            self._sightings[url] = _Sighting(holder, trio.current_time())

    def host_probed(self, url: str, sent_at: float, *, free: bool) -> None:
        """A probe of `url` sent at `sent_at` found the host free and idle (`free`) or not.
        Another gateway's lease on a host that says it is idle is stale: the hold on the host
        ends now, and this gateway's next forward there takes that lease over."""
        sighting = self._sightings.get(url)
        if sighting is not None and sighting.probed(sent_at, free=free) and self._listener is not None:
            self._listener.lease_released(url)

    async def _give_back_unclaimed(self, url: str, held: _Held) -> None:
        """A kept lease no forward here took over within the grace (or at shutdown) is given back."""
        try:
            await trio.sleep(HANDOVER_GRACE_SECONDS)
        finally:
            if self._kept.get(url) is held:
                del self._kept[url]
                with trio.CancelScope(shield=True):
                    await self._give_back(url, held)

    async def _give_back(self, url: str, held: _Held) -> None:
        await self._call(self._release_script, [self.PREFIX + url], [held.token, RELEASE_CHANNEL, self._gateway + url])

    async def _call(self, script: Script[bytes], keys: list[str], args: list[str | bytes | int]) -> object | None:
        """The script's answer; None: Redis did not give one (down, slow: logged once a
        minute), or failed a call less than `REDIS_BACKOFF_SECONDS` ago (not asked)."""
        if trio.current_time() < self._skip_redis_until:
            return None
        failure: BaseException | str = "timeout"
        with trio.move_on_after(LEASE_CALL_SECONDS):
            try:
                answer: object = await script(keys=keys, args=args)
                return answer
            except REDIS_ERRORS as error:
                failure = error
        self._failures.report(failure)
        self._skip_redis_until = trio.current_time() + REDIS_BACKOFF_SECONDS
        return None

    def _keeps(self, url: str) -> bool:
        """Keep the lease for the next waiter here: one waits, and no other gateway wants the host."""
        return self._background is not None and self._turn(url).successor_waiting and not self.wanted_elsewhere(url)

    def wanted_elsewhere(self, url: str) -> bool:
        """Has another gateway marked `url` wanted, as far as this gateway has heard?"""
        until = self._wanted_until.get(url)
        if until is not None and until <= trio.current_time():
            del self._wanted_until[url]
            until = None
        return until is not None

    def _turn(self, url: str) -> Turn:
        return ALONE if self._listener is None else self._listener.turn(url)

    async def watch(self, listener: Listener, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Tell `listener` every host whose lease is given back, by any gateway; `None` after
        each (re)subscription. Hear the hosts other gateways mark wanted. Runs the calls
        that leave no forward waiting (see the module docstring). Started at once: Redis
        down only delays the first subscription."""
        self._listener = listener
        async with trio.open_nursery() as background:
            self._background = background
            try:
                task_status.started()
                await self._subscribe(listener)
            finally:
                self._background = None  # the kept leases' graces end now: each gives its lease back

    async def _subscribe(self, listener: Listener) -> None:
        while True:
            try:
                async with self._redis.pubsub(
                    channels=[RELEASE_CHANNEL, WANTED_CHANNEL], ignore_subscribe_messages=True, retry_policy=None
                ) as subscription:
                    listener.lease_released(None)
                    async for message in subscription:
                        if message["type"] == "message":
                            self._heard(_text(message["channel"]), _text(message["data"]))
            except* REDIS_ERRORS as errors:  # coredis' task group wraps them
                self._failures.report(errors.exceptions[0])
            await trio.sleep(RESUBSCRIBE_SECONDS)

    def _heard(self, channel: str, data: str) -> None:
        """An announcement: the announcing gateway's prefix (hex, then ':'), then the host's URL."""
        if data.startswith(self._gateway):
            return  # its own: its dispatcher already knows (a release heard back would end a busy hold)
        _, _, url = data.partition(":")
        if channel == RELEASE_CHANNEL:
            self._sightings.pop(url, None)  # that lease is gone: a later one is judged afresh
            if self._listener is not None:
                self._listener.lease_released(url)
        elif channel == WANTED_CHANNEL:
            self._wanted_until[url] = trio.current_time() + WANT_SECONDS


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _flag(value: bool) -> str:
    return "1" if value else "0"


def _ms(seconds: float) -> int:
    return math.ceil(seconds * 1000)


def _acquired(answer: object) -> tuple[int, bytes]:
    """The acquire script's answer: its code or the milliseconds left, and the holder's token."""
    match answer:
        case [int(code_or_left_ms), bytes(holder)]:
            return code_or_left_ms, holder
    raise ValueError(f"unexpected answer from the acquire script: {answer!r}")


def _raise_alone(error: BaseException) -> NoReturn:
    """Raise the one exception a nursery wrapped in a group as itself, its context as it was:
    the forward's callers catch what it raised by type (HostFailed, WorkerBusy, Cancelled)."""
    context = error.__context__
    try:
        raise error
    finally:
        error.__context__ = context  # not the group it came in


def build_host_leases(redis: coredis.Redis[bytes] | None, lease_seconds: float) -> HostLeasing:
    return NO_HOST_LEASES if redis is None else RedisHostLeases(redis, lease_seconds)
