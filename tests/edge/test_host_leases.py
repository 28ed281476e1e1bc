"""Host leases in a real Redis: two gateways never forward to one host at once; every exit
path gives the lease back; a Redis that is down lets the forward go ahead (the host's busy
answer is the guard)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import pytest
import trio
import trio.testing
from coredis import Redis
from coredis.tokens import PureToken

from cluster.launcher import free_port
from edge.admission.shared_state import redis_client
from edge.pool.host_leases import HANDOVER_GRACE_SECONDS, LEASE_CALL_SECONDS, HostLeased, RedisHostLeases, Turn
from tests.fakes.redis_server import RedisServer

HOST = "http://gpu-1:8000"
OTHER_HOST = "http://gpu-2:8000"


class Listener:
    """The dispatcher as the leases see it: the turn of the forward at hand, releases heard."""

    def __init__(self) -> None:
        self.now = Turn()
        self.heard: list[str | None] = []
        self.subscribed = trio.Event()
        self._heard_more = trio.Event()

    def turn(self, url: str) -> Turn:
        return self.now

    def lease_released(self, url: str | None) -> None:
        self.heard.append(url)
        self._heard_more.set()
        self._heard_more = trio.Event()
        if url is None:
            self.subscribed.set()

    async def hears(self, done: Callable[[list[str | None]], bool]) -> None:
        """Wait (5 s at most) until what was heard is `done`."""
        with trio.fail_after(5):
            while not done(self.heard):
                await self._heard_more.wait()


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
        yield RedisHostLeases(redis_a), RedisHostLeases(redis_b), redis_a


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
            assert 10_000 < ttl_ms <= 11_000, "the attempt's timeout plus the margin (max 1 s, 5 %)"
        async with gateway_b.hold(HOST, 10):
            pass  # given back at the end of the forward
        assert await redis_a.exists([RedisHostLeases.PREFIX + HOST]) == 0


async def test_a_lease_is_given_back_when_the_forward_fails_or_is_cancelled(redis_server: RedisServer) -> None:
    async with redis_client(redis_server.url) as redis:
        assert redis is not None
        leases = RedisHostLeases(redis)
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
        leases = RedisHostLeases(redis)
        async with leases.hold(HOST, 10):
            await redis.set(RedisHostLeases.PREFIX + HOST, b"another gateway's token")
        assert await redis.get(RedisHostLeases.PREFIX + HOST) == b"another gateway's token"


async def test_redis_down_lets_the_forward_go_ahead(caplog: pytest.LogCaptureFixture) -> None:
    async with redis_client(f"redis://127.0.0.1:{free_port()}/0") as redis:
        assert redis is not None
        leases = RedisHostLeases(redis)
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
        leases = RedisHostLeases(redis)
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
                assert 9 < leased.value.seconds <= 11, "the other lease's time left bounds the hold"
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
        async with gateway_a.hold(HOST, 60):
            # its next waiter takes it over: extended for that attempt (in the background)
            with trio.fail_after(5):
                while await redis_a.pttl(RedisHostLeases.PREFIX + HOST) <= 11_000:
                    await trio.sleep(0.01)
        assert await redis_a.exists([RedisHostLeases.PREFIX + HOST]) == 0, "then given back"
        await listener_b.hears(lambda heard: len(heard) >= 2)
        assert listener_b.heard == [None, HOST], "announced once: when given back, not when kept"


async def test_a_local_hand_over_waits_for_no_redis_round_trip(redis_server: RedisServer) -> None:
    # the keep-check and the next forward's SET NX were two round trips between a job's
    # answer and the next job: Redis paused, each hand-over waited LEASE_CALL_SECONDS twice
    async with redis_client(redis_server.url) as redis, redis_client(redis_server.url) as admin:
        assert redis is not None and admin is not None
        leases = RedisHostLeases(redis)
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
        leases = RedisHostLeases(redis)
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
        holder, starved, third = RedisHostLeases(redis_a), RedisHostLeases(redis_b), RedisHostLeases(redis_c)
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
        holder = RedisHostLeases(redis)
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
