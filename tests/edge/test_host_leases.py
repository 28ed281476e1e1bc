"""Host leases in a real Redis: two gateways never forward to one host at once; every exit
path gives the lease back; a short lease lives while its forward renews it, so a gateway that
dies (killed -9, in a process of its own) frees its host within the lease's time, and a lease
whose host says it is idle is taken over, only that one; a Redis that is down lets the
forward go ahead (the host's busy answer is the guard). Waits are on Redis' own keyspace
events (a renewal, an expiry), never sleeps."""

from __future__ import annotations

import logging
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Generic, TypeVar

import pytest
import trio
import trio.testing
from coredis import Redis
from coredis.tokens import PureToken

from cluster.launcher import free_port, start_announcing
from edge.pool.host_leases import (
    HANDOVER_GRACE_SECONDS,
    LEASE_CALL_SECONDS,
    RENEWALS_PER_LEASE,
    TAKEOVER_AFTER_SECONDS,
    HostLeased,
    RedisHostLeases,
    Turn,
)
from edge.shared_state import redis_client
from tests.fakes.redis_server import RedisServer

HOST = "http://gpu-1:8000"
OTHER_HOST = "http://gpu-2:8000"
HOST_KEY = RedisHostLeases.PREFIX + HOST
# Shorter than the settings allow (3 s), so that a lease lapses within a test's second or two;
# long beside a renewal's round trip on a loaded machine (one every 0.5 s).
LEASE_SECONDS = 1.5
LEASE_MS = int(LEASE_SECONDS * 1000)


T = TypeVar("T")


class Heard(Generic[T]):
    """What was heard so far, in order, and a wait for more."""

    def __init__(self) -> None:
        self.items: list[tuple[float, T]] = []  # (trio's clock when heard, what)
        self._more = trio.Event()

    def add(self, item: T) -> None:
        self.items.append((trio.current_time(), item))
        self._more.set()
        self._more = trio.Event()

    async def wait(self, done: Callable[[list[T]], bool], seconds: float = 5) -> float:
        """Wait (`seconds` at most) until what was heard is `done`; when the last of it came."""
        with trio.fail_after(seconds):
            while not done([item for _, item in self.items]):
                await self._more.wait()
        return self.items[-1][0] if self.items else trio.current_time()


class Listener:
    """The dispatcher as the leases see it: the turn of the forward at hand, releases heard."""

    def __init__(self) -> None:
        self.now = Turn()
        self.released: Heard[str | None] = Heard()
        self.subscribed = trio.Event()

    @property
    def heard(self) -> list[str | None]:
        return [url for _, url in self.released.items]

    def turn(self, url: str) -> Turn:
        return self.now

    def lease_released(self, url: str | None) -> None:
        self.released.add(url)
        if url is None:
            self.subscribed.set()

    async def hears(self, done: Callable[[list[str | None]], bool]) -> None:
        await self.released.wait(done)


class KeyEvents(Heard[str]):
    """What Redis does to a key ('set', 'expire': also a renewal, 'expired', 'del'), as it does it."""

    async def wait_for(self, kind: str, count: int = 1, seconds: float = 5) -> float:
        """Wait until `kind` came `count` times since the subscription; when the last came."""
        await self.wait(lambda kinds: kinds.count(kind) >= count, seconds)
        return [at for at, what in self.items if what == kind][count - 1]


@asynccontextmanager
async def key_events(redis_server: RedisServer, key: str = HOST_KEY) -> AsyncIterator[KeyEvents]:
    """Redis' keyspace notifications on `key` from now on (subscribed before this returns)."""
    events = KeyEvents()
    subscribed = trio.Event()
    async with redis_client(redis_server.url) as redis, trio.open_nursery() as nursery:
        assert redis is not None
        await redis.config_set({"notify-keyspace-events": "Kg$x"})  # keyspace: generic, string, expired
        async with redis.pubsub(channels=[f"__keyspace@0__:{key}"]) as subscription:

            async def record() -> None:
                async for message in subscription:
                    if message["type"] == "subscribe":
                        subscribed.set()
                    elif message["type"] == "message":
                        events.add(_text(message["data"]))

            nursery.start_soon(record)
            await subscribed.wait()
            yield events
            nursery.cancel_scope.cancel()


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@asynccontextmanager
async def watched(*leases: RedisHostLeases) -> AsyncIterator[list[Listener]]:
    """Each gateway's leases watching, with its listener."""
    listeners = [Listener() for _ in leases]
    async with trio.open_nursery() as nursery:
        for lease, listener in zip(leases, listeners, strict=True):
            await nursery.start(lease.watch, listener)
            await listener.subscribed.wait()
        yield listeners
        nursery.cancel_scope.cancel()


@asynccontextmanager
async def two_gateways(
    redis_server: RedisServer,
) -> AsyncIterator[tuple[RedisHostLeases, RedisHostLeases, Redis[bytes]]]:
    """Two gateways' leases on one Redis, each on its own client; the first one's client too."""
    async with redis_client(redis_server.url) as redis_a, redis_client(redis_server.url) as redis_b:
        assert redis_a is not None and redis_b is not None
        yield RedisHostLeases(redis_a, LEASE_SECONDS), RedisHostLeases(redis_b, LEASE_SECONDS), redis_a


IMPATIENT = Turn(impatient=True)
NEXT_WAITS = Turn(successor_waiting=True)


async def test_a_host_leased_by_one_gateway_is_busy_to_another_until_given_back(redis_server: RedisServer) -> None:
    async with two_gateways(redis_server) as (gateway_a, gateway_b, redis_a):
        async with gateway_a.hold(HOST, 10):
            with pytest.raises(HostLeased):
                async with gateway_b.hold(HOST, 10):
                    raise AssertionError("forwarded to a host another gateway holds")
            async with gateway_b.hold("http://gpu-2:8000", 10):
                pass  # another host is free
            ttl_ms = await redis_a.pttl(RedisHostLeases.PREFIX + HOST)
            # it was the attempt's timeout plus a margin (11 s here, 189 s for a generation)
            assert LEASE_MS - 500 < ttl_ms <= LEASE_MS, "the short lease its forward renews"
        async with gateway_b.hold(HOST, 10):
            pass  # given back at the end of the forward
        assert await redis_a.exists([RedisHostLeases.PREFIX + HOST]) == 0


async def test_a_lease_is_given_back_when_the_forward_fails_or_is_cancelled(redis_server: RedisServer) -> None:
    async with redis_client(redis_server.url) as redis:
        assert redis is not None
        leases = RedisHostLeases(redis, LEASE_SECONDS)
        with pytest.raises(RuntimeError):
            async with leases.hold(HOST, 10):
                raise RuntimeError("the forward failed")
        with trio.move_on_after(0.05):  # the client left mid-forward
            async with leases.hold(HOST, 10):
                await trio.sleep_forever()
        assert await redis.exists([RedisHostLeases.PREFIX + HOST]) == 0


async def test_only_the_holder_gives_a_lease_back(redis_server: RedisServer) -> None:
    # a lease that expired and was taken by another gateway is not deleted by the first one
    async with redis_client(redis_server.url) as redis:
        assert redis is not None
        leases = RedisHostLeases(redis, LEASE_SECONDS)
        async with leases.hold(HOST, 10):
            await redis.set(RedisHostLeases.PREFIX + HOST, b"another gateway's token")
        assert await redis.get(RedisHostLeases.PREFIX + HOST) == b"another gateway's token"


async def test_redis_down_lets_the_forward_go_ahead(caplog: pytest.LogCaptureFixture) -> None:
    async with redis_client(f"redis://127.0.0.1:{free_port()}/0") as redis:
        assert redis is not None
        leases = RedisHostLeases(redis, LEASE_SECONDS)
        forwarded = 0
        with caplog.at_level(logging.ERROR, "edge.pool"):
            for _ in range(3):
                async with leases.hold(HOST, 10):
                    forwarded += 1
    assert forwarded == 3
    assert sum("主机租约" in r.message for r in caplog.records) == 1, "logged once a minute, not per request"


async def test_a_redis_that_hangs_delays_one_forward_not_each(redis_server: RedisServer) -> None:
    # each forward waited for its lease and its release, LEASE_CALL_SECONDS each, while Redis hung
    async with redis_client(redis_server.url) as redis, redis_client(redis_server.url) as admin:
        assert redis is not None and admin is not None
        leases = RedisHostLeases(redis, LEASE_SECONDS)
        await admin.client_pause(3_000, PureToken.ALL)
        began = trio.current_time()
        for _ in range(3):
            async with leases.hold(HOST, 10):
                pass
        assert trio.current_time() - began < LEASE_CALL_SECONDS + 0.5, "one call waited for, then Redis is skipped"
        await admin.client_unpause()
        held = 0
        with trio.fail_after(5):  # asked again once the backoff is over
            while not held:
                await trio.sleep(0.05)
                async with leases.hold(HOST, 10):
                    held = await redis.exists([RedisHostLeases.PREFIX + HOST])


async def test_a_lease_this_gateway_failed_to_give_back_is_taken_over_not_mistaken(redis_server: RedisServer) -> None:
    # a release that did not get through (Redis slow) left the host leased to this gateway
    # for the whole attempt timeout: its own next forward there was refused as busy elsewhere
    async with two_gateways(redis_server) as (gateway_a, gateway_b, redis_a):
        async with gateway_a.hold(HOST, 10):
            stale = await redis_a.get(RedisHostLeases.PREFIX + HOST)
        await redis_a.set(RedisHostLeases.PREFIX + HOST, stale or b"", px=10_000)  # as if never released
        async with gateway_a.hold(HOST, 10):
            with pytest.raises(HostLeased):
                async with gateway_b.hold(HOST, 10):
                    pass
        assert await redis_a.exists([RedisHostLeases.PREFIX + HOST]) == 0


async def test_a_lease_given_back_is_announced_to_every_gateway(redis_server: RedisServer) -> None:
    # a gateway that found the host leased learned it was free only at its next probe (100 ms)
    async with two_gateways(redis_server) as (gateway_a, gateway_b, _):
        async with watched(gateway_a, gateway_b) as (listener_a, listener):
            async with gateway_a.hold(HOST, 10):
                with pytest.raises(HostLeased) as leased:
                    async with gateway_b.hold(HOST, 10):
                        pass
                assert 0 < leased.value.seconds <= LEASE_SECONDS, "the other lease's time left bounds the hold"
            await listener.hears(lambda heard: len(heard) >= 2)
            async with gateway_b.hold(OTHER_HOST, 10):
                pass  # published after a's: a would have heard its own first
            await listener_a.hears(lambda heard: OTHER_HOST in heard)
        assert listener.heard == [None, HOST], "None first: releases before the subscription may have been missed"
        # its own release heard back would end a hold a busy answer put on the host
        assert listener_a.heard == [None, OTHER_HOST], "a gateway does not hear its own releases"


async def test_a_lease_is_kept_across_a_hand_over_to_this_gateways_next_waiter(redis_server: RedisServer) -> None:
    async with (
        two_gateways(redis_server) as (gateway_a, gateway_b, redis_a),
        watched(gateway_a, gateway_b) as (listener_a, listener_b),
    ):
        listener_a.now = NEXT_WAITS
        async with gateway_a.hold(HOST, 10):
            pass
        with pytest.raises(HostLeased):
            async with gateway_b.hold(HOST, 10):
                pass
        listener_a.now = Turn()
        await redis_a.pexpire(HOST_KEY, 300)  # it aged through the hand-over
        async with key_events(redis_server) as events, gateway_a.hold(HOST, 60):
            # its next waiter takes it over: renewed at once (in the background), its whole lease again
            await events.wait_for("expire")
            assert LEASE_MS - 500 < await redis_a.pttl(HOST_KEY) <= LEASE_MS
        assert await redis_a.exists([RedisHostLeases.PREFIX + HOST]) == 0, "then given back"
        await listener_b.hears(lambda heard: len(heard) >= 2)
        assert listener_b.heard == [None, HOST], "announced once: when given back, not when kept"


async def test_a_local_hand_over_waits_for_no_redis_round_trip(redis_server: RedisServer) -> None:
    # the keep-check and the next forward's SET NX were two round trips between a job's
    # answer and the next job: Redis paused, each hand-over waited LEASE_CALL_SECONDS twice
    async with redis_client(redis_server.url) as redis, redis_client(redis_server.url) as admin:
        assert redis is not None and admin is not None
        leases = RedisHostLeases(redis, LEASE_SECONDS)
        async with watched(leases) as (listener,):
            listener.now = NEXT_WAITS
            async with leases.hold(HOST, 10):
                pass  # taken (one round trip), then kept
            await admin.client_pause(2_000, PureToken.WRITE)  # every script now waits 2 s
            began = trio.current_time()
            for _ in range(3):
                async with leases.hold(HOST, 10):
                    pass
            assert trio.current_time() - began < 0.5, "three hand-overs, not one Redis answer waited for"
            await admin.client_unpause()
            listener.now = Turn()
            async with leases.hold(HOST, 10):
                pass
        assert await redis.exists([RedisHostLeases.PREFIX + HOST]) == 0


async def test_a_kept_lease_no_forward_takes_over_is_given_back_after_the_grace(redis_server: RedisServer) -> None:
    # the waiter it was kept for left, or took another host: the other gateways must not wait
    async with (
        two_gateways(redis_server) as (gateway_a, gateway_b, _),
        watched(gateway_a, gateway_b) as (listener_a, listener_b),
    ):
        listener_a.now = NEXT_WAITS
        async with gateway_a.hold(HOST, 10):
            pass
        kept_at = trio.current_time()
        await listener_b.hears(lambda heard: len(heard) >= 2)
        assert trio.current_time() - kept_at >= HANDOVER_GRACE_SECONDS
        assert listener_b.heard == [None, HOST]
        async with gateway_b.hold(HOST, 10):
            pass  # free for the other gateway


async def test_kept_leases_are_given_back_when_the_gateway_stops_watching(redis_server: RedisServer) -> None:
    async with redis_client(redis_server.url) as redis:
        assert redis is not None
        leases = RedisHostLeases(redis, LEASE_SECONDS)
        async with watched(leases) as (listener,):
            listener.now = NEXT_WAITS
            async with leases.hold(HOST, 10):
                pass
            assert await redis.exists([RedisHostLeases.PREFIX + HOST]) == 1, "kept"
        assert await redis.exists([RedisHostLeases.PREFIX + HOST]) == 0, "given back at shutdown, not left to expire"


async def test_an_impatient_gateway_gets_the_host_its_holder_would_have_kept(redis_server: RedisServer) -> None:
    # kept leases alone would leave a gateway without hosts for good while the others stay busy
    async with (
        redis_client(redis_server.url) as redis_a,
        redis_client(redis_server.url) as redis_b,
        redis_client(redis_server.url) as redis_c,
    ):
        assert redis_a is not None and redis_b is not None and redis_c is not None
        holder, starved, third = (
            RedisHostLeases(redis_a, LEASE_SECONDS),
            RedisHostLeases(redis_b, LEASE_SECONDS),
            RedisHostLeases(redis_c, LEASE_SECONDS),
        )
        async with watched(holder, starved, third) as (holding, starving, _):
            holding.now = NEXT_WAITS
            async with holder.hold(HOST, 10):
                starving.now = IMPATIENT
                with pytest.raises(HostLeased):
                    async with starved.hold(HOST, 10):
                        pass
                with trio.fail_after(5):  # the mark is announced
                    while not holder.wanted_elsewhere(HOST):
                        await trio.sleep(0.01)
            assert await redis_a.exists([RedisHostLeases.PREFIX + HOST]) == 0, "given back, not kept"
            holding.now = Turn()
            for patient in (holder, third):
                with pytest.raises(HostLeased):
                    async with patient.hold(HOST, 10):
                        pass
            starving.now = Turn()
            async with starved.hold(HOST, 10):
                pass  # reserved for the gateway that wanted it
            async with third.hold(HOST, 10):
                pass  # served: the mark is gone


async def test_a_mark_whose_announcement_was_missed_is_learned_from_the_next_extension(
    redis_server: RedisServer,
) -> None:
    async with redis_client(redis_server.url) as redis:
        assert redis is not None
        holder = RedisHostLeases(redis, LEASE_SECONDS)
        async with watched(holder) as (holding,):
            holding.now = NEXT_WAITS
            async with holder.hold(HOST, 10):
                pass  # kept
            await redis.set(RedisHostLeases.WANTS + HOST, b"0123456789abcdef:", px=1_500)  # set while unheard
            assert not holder.wanted_elsewhere(HOST)
            async with holder.hold(HOST, 10):  # takes the kept lease over: the extension says "wanted"
                with trio.fail_after(5):
                    while not holder.wanted_elsewhere(HOST):
                        await trio.sleep(0.01)
            assert await redis.exists([RedisHostLeases.PREFIX + HOST]) == 0, "given back, not kept"


# --- the heartbeat: a short lease lives while its forward renews it ---------------------------

# A lease left by a gateway that died mid-forward, from before the heartbeat: the attempt's
# timeout plus the margin of a generation (180 s + 9 s), its token as any gateway makes them.
DEAD_GATEWAYS_TOKEN = b"0123456789abcdef:0123456789abcdef"
DEAD_GATEWAYS_LEASE_MS = 189_000
LIVE_GATEWAYS_TOKEN = b"fedcba9876543210:fedcba9876543210"


async def test_a_forward_renews_its_short_lease_for_as_long_as_it_runs(redis_server: RedisServer) -> None:
    # the lease was the attempt's timeout plus a margin, all of it taken at once: a holder that
    # died left a generation's host blocked for 189 s. Now it is short and lives by renewals.
    async with two_gateways(redis_server) as (gateway_a, gateway_b, _), key_events(redis_server) as events:
        async with gateway_a.hold(HOST, 10):
            taken_at = await events.wait_for("set")
            # SET PX reports its own 'expire'; then renewals, one past a whole lease
            renewed_at = await events.wait_for("expire", count=1 + RENEWALS_PER_LEASE + 1)
            assert renewed_at - taken_at > LEASE_SECONDS, "renewed past the lease it was taken with"
            with pytest.raises(HostLeased):
                async with gateway_b.hold(HOST, 10):
                    pass
        await events.wait_for("del")  # given back at the end, not left to expire


async def test_a_forward_renews_only_its_own_lease(redis_server: RedisServer) -> None:
    # a renewal after the lease lapsed, or was taken over, must not extend the next holder's
    async with redis_client(redis_server.url) as redis, key_events(redis_server) as events:
        assert redis is not None
        leases = RedisHostLeases(redis, LEASE_SECONDS)
        async with leases.hold(HOST, 10):
            await events.wait_for("expire", count=2)  # SET PX's own, then a renewal
            others_ms = 2 * LEASE_MS // RENEWALS_PER_LEASE  # a renewal of the holder's lands in it
            await redis.set(HOST_KEY, b"another gateway's token", px=others_ms)
            set_at = await events.wait_for("set", count=2)
            expired_at = await events.wait_for("expired")
            assert expired_at - set_at < others_ms / 1000 + 0.5, "not extended by the holder it replaced"
            assert await redis.exists([HOST_KEY]) == 0, "nor made again"


async def test_a_gateway_killed_mid_forward_frees_its_host_within_the_lease(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    # issue 39: a gateway killed -9 during a /grow left its lease to block the idle host for
    # 153 s more (189 s in all); another gateway's client waited 30 s and got 1007
    argv = [sys.executable, "-m", "tests.fakes.lease_holder", "--redis", redis_server.url, "--host", HOST]
    holder = start_announcing("lease-holder", [*argv, "--lease-seconds", str(LEASE_SECONDS)], tmp_path / "holder.log")
    try:
        async with two_gateways(redis_server) as (_, gateway_b, _), key_events(redis_server) as events:
            with pytest.raises(HostLeased):
                async with gateway_b.hold(HOST, 10):
                    pass
            await events.wait_for("expire")  # renewed: the heartbeat runs in the holder's process
            holder.kill()  # SIGKILL: no release, no last renewal
            killed_at = trio.current_time()
            freed_at = await events.wait_for("expired", seconds=LEASE_SECONDS + 2)
            assert freed_at - killed_at <= LEASE_SECONDS + 0.3, "the lease lapses within its time"
            async with gateway_b.hold(HOST, 10):
                pass  # the other gateway takes the host
    finally:
        holder.kill()


# --- the takeover: a lease whose host says it is idle ------------------------------------------


async def _refused(leases: RedisHostLeases) -> float:
    """`leases` finds another gateway's lease on HOST; when."""
    with pytest.raises(HostLeased):
        async with leases.hold(HOST, 10):
            raise AssertionError("forwarded to a host another gateway holds")
    return trio.current_time()


async def test_a_lease_whose_host_says_it_is_idle_is_taken_over(redis_server: RedisServer) -> None:
    # a gateway without the heartbeat died mid-forward: its host was idle, its lease had minutes
    async with two_gateways(redis_server) as (_, gateway_b, redis), watched(gateway_b) as (listener,):
        await redis.set(HOST_KEY, DEAD_GATEWAYS_TOKEN, px=DEAD_GATEWAYS_LEASE_MS)
        found_at = await _refused(gateway_b)
        gateway_b.host_probed(HOST, found_at + TAKEOVER_AFTER_SECONDS, free=True)
        assert listener.heard == [None, HOST], "the hold on the host ends at once, as for a release"
        async with gateway_b.hold(HOST, 10):
            assert await redis.get(HOST_KEY) != DEAD_GATEWAYS_TOKEN, "taken over"
            assert await redis.pttl(HOST_KEY) <= LEASE_MS, "a lease of this gateway's, renewed as its own"
        assert await redis.exists([HOST_KEY]) == 0, "given back as its own"


async def test_a_lease_is_taken_over_only_on_a_sound_word_of_its_host(redis_server: RedisServer) -> None:
    async with two_gateways(redis_server) as (_, gateway_b, redis):
        await redis.set(HOST_KEY, DEAD_GATEWAYS_TOKEN, px=DEAD_GATEWAYS_LEASE_MS)
        found_at = await _refused(gateway_b)
        judged = found_at + TAKEOVER_AFTER_SECONDS
        gateway_b.host_probed(HOST, judged - 0.1, free=True)  # too soon: the holder's upload may be on its way
        await _refused(gateway_b)
        gateway_b.host_probed(HOST, judged + 1, free=False)  # its job runs
        await _refused(gateway_b)
        gateway_b.host_probed(HOST, judged + 0.5, free=True)  # sent before the busy one, answered after
        await _refused(gateway_b)
        gateway_b.host_probed(HOST, judged + 2, free=True)  # idle under that lease: stale...
        await redis.set(HOST_KEY, LIVE_GATEWAYS_TOKEN, px=DEAD_GATEWAYS_LEASE_MS)
        found_again_at = await _refused(gateway_b)  # ...but another took the host since: judged anew
        gateway_b.host_probed(HOST, found_again_at + TAKEOVER_AFTER_SECONDS, free=True)
        async with gateway_b.hold(HOST, 10):
            assert await redis.get(HOST_KEY) not in (None, DEAD_GATEWAYS_TOKEN, LIVE_GATEWAYS_TOKEN), "taken over"


async def test_a_live_holder_whose_lease_was_taken_over_leaves_the_new_one_alone(redis_server: RedisServer) -> None:
    # its host said idle under it: its job was not there (were it on its way, the host's busy
    # answer guards it); its renewals and its release must not touch the new holder's lease
    async with two_gateways(redis_server) as (gateway_a, gateway_b, redis), trio.open_nursery() as nursery:
        a_ends, a_ended = trio.Event(), trio.Event()

        async def a_forward(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
            async with gateway_a.hold(HOST, 10):
                task_status.started()
                await a_ends.wait()
            a_ended.set()

        await nursery.start(a_forward)
        found_at = await _refused(gateway_b)
        gateway_b.host_probed(HOST, found_at + TAKEOVER_AFTER_SECONDS, free=True)
        async with gateway_b.hold(HOST, 10):
            taken = await redis.get(HOST_KEY)
            a_ends.set()
            await a_ended.wait()  # a's forward ended while b's runs: a gave back what it held
            assert await redis.get(HOST_KEY) == taken, "b's lease, untouched"
        assert await redis.exists([HOST_KEY]) == 0, "b gave back its own"
