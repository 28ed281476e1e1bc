"""Token buckets in memory (trio's mock clock) and in a real Redis (gateway.md § Rate limiting)."""

from __future__ import annotations

import logging
import random

import pytest
import trio

from cluster.launcher import free_port
from edge.admission.rate_limit import (
    ClientKeys,
    Decision,
    MemoryRateLimiter,
    RedisRateLimiter,
    build_rate_limiter,
)
from edge.shared_state import redis_client
from shared.settings import RateLimitSettings
from tests.fakes.redis_server import RedisServer


def refused(seconds: int) -> Decision:
    return Decision(False, seconds)


async def test_burst_then_one_request_per_refill(autojump_clock) -> None:
    limiter = MemoryRateLimiter(requests_per_minute=30, burst=3, clock=trio.current_time)
    assert [(await limiter.check("ip:a")).allowed for _ in range(3)] == [True] * 3
    assert await limiter.check("ip:a") == refused(2)  # one token every 2 s
    assert (await limiter.check("ip:b")).allowed, "another client has its own bucket"
    await trio.sleep(1)
    assert await limiter.check("ip:a") == refused(1)
    await trio.sleep(1)
    assert (await limiter.check("ip:a")).allowed
    assert await limiter.check("ip:a") == refused(2)


async def test_retry_after_is_honest_and_tight(autojump_clock) -> None:
    """Waiting Retry-After lets the next request through; a second less does not."""
    chance = random.Random(8)
    for requests_per_minute, burst in [(30, 10), (7, 1), (600, 5), (1, 2), (90, 3)]:
        limiter = MemoryRateLimiter(requests_per_minute, burst, clock=trio.current_time)
        for _ in range(40):
            await trio.sleep(chance.uniform(0, 3))
            decision = await limiter.check("ip:c")
            if decision.allowed:
                continue
            assert decision.retry_after_seconds >= 1
            if decision.retry_after_seconds > 1:
                await trio.sleep(decision.retry_after_seconds - 1)
                assert not (await limiter.check("ip:c")).allowed
                await trio.sleep(1)
            else:
                await trio.sleep(decision.retry_after_seconds)
            assert (await limiter.check("ip:c")).allowed, (requests_per_minute, burst)


async def test_refund_gives_the_token_back_but_never_beyond_the_burst(autojump_clock) -> None:
    limiter = MemoryRateLimiter(requests_per_minute=1, burst=2, clock=trio.current_time)
    await limiter.refund("ip:a")  # a full bucket stays at the burst
    assert [(await limiter.check("ip:a")).allowed for _ in range(3)] == [True, True, False]
    await limiter.refund("ip:a")  # that request was a replay: free
    assert (await limiter.check("ip:a")).allowed
    assert not (await limiter.check("ip:a")).allowed


async def test_memory_stays_bounded(autojump_clock) -> None:
    limiter = MemoryRateLimiter(requests_per_minute=60, burst=5, clock=trio.current_time, max_clients=100)
    for number in range(1000):
        limiter.check_now(f"ip:10.0.{number // 256}.{number % 256}")
    assert len(limiter) == 100
    await trio.sleep(5)  # every bucket refilled: forgetting them changes nothing
    for _ in range(100):
        limiter.check_now("ip:steady")
    assert len(limiter) == 1


def test_client_is_the_peer_unless_a_trusted_proxy_forwards() -> None:
    keys = ClientKeys(RateLimitSettings(trusted_proxies=("127.0.0.1", "10.1.0.0/16")))
    assert keys.client_ip("203.0.113.9", "198.51.100.1") == "203.0.113.9", "untrusted peers cannot forward"
    assert keys.client_ip("127.0.0.1", "198.51.100.1") == "198.51.100.1"
    assert keys.client_ip("127.0.0.1", "forged-by-client, 198.51.100.1") == "198.51.100.1"
    assert keys.client_ip("127.0.0.1", "198.51.100.1, 10.1.2.3") == "198.51.100.1", "a chain of our proxies"
    assert keys.client_ip("10.1.9.9", "198.51.100.7") == "198.51.100.7", "a trusted network"
    assert keys.client_ip("127.0.0.1", None) == "127.0.0.1"
    assert keys.keys("203.0.113.9", None, "sk-secret") == ("ip:203.0.113.9",), "no key_header configured"


def test_a_key_header_adds_a_bucket_named_by_a_hash_of_its_value_to_the_ips() -> None:
    keys = ClientKeys(RateLimitSettings(key_header="X-Api-Key"))
    by_ip, first = keys.keys("203.0.113.9", None, "sk-live-1234")
    assert by_ip == "ip:203.0.113.9", "the IP's bucket applies too: made-up keys gain nothing"
    assert first == keys.keys("198.51.100.1", None, "sk-live-1234")[1], "the same key from anywhere"
    assert first != keys.keys("203.0.113.9", None, "sk-live-5678")[1]
    assert "sk-live" not in first
    assert keys.keys("203.0.113.9", None, None) == ("ip:203.0.113.9",)


def test_build_follows_the_settings() -> None:
    assert build_rate_limiter(RateLimitSettings(enabled=False), None) is None
    assert isinstance(build_rate_limiter(RateLimitSettings(), None), MemoryRateLimiter)


async def admitted(limiter, keys: tuple[str, ...]) -> bool:
    """What the router does: every bucket in turn, a refused one refunds the others."""
    paid = []
    for key in keys:
        if not (await limiter.check(key)).allowed:
            for taken in paid:
                await limiter.refund(taken)
            return False
        paid.append(key)
    return True


@pytest.mark.parametrize(("ip_limits", "office", "rotating"), [({}, 20, 20), ({"ip_burst": 5}, 5, 5)])
async def test_with_a_key_header_the_ip_bucket_is_the_wider_one(ip_limits: dict, office: int, rotating: int) -> None:
    # the IP bucket used the key's numbers: one office behind one address got one key's rate
    settings = RateLimitSettings(key_header="X-Api-Key", requests_per_minute=1, burst=2, **ip_limits)
    assert settings.ip_limits == (10, ip_limits.get("ip_burst", 20))
    limiter, keys = build_rate_limiter(settings, None), ClientKeys(settings)
    assert limiter is not None
    staff = [f"sk-staff-{n}" for n in range(10)]
    served = [await admitted(limiter, keys.keys("203.0.113.9", None, key)) for key in staff for _ in range(2)]
    assert sum(served) == office, "ten keys, two requests each, from one office address"
    made_up = [await admitted(limiter, keys.keys("198.51.100.1", None, f"fake-{n}")) for n in range(50)]
    assert sum(made_up) == rotating, "a new key per request still meets the IP's limit"
    own_key = [await admitted(limiter, keys.keys("192.0.2.1", None, "sk-one")) for _ in range(5)]
    assert sum(own_key) == 2, "and each key its own"


# --- Redis ----------------------------------------------------------------------------------


class WallClock:
    """A wall clock the test moves (coredis' own timeouts need trio's real clock)."""

    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


async def test_two_gateways_on_one_redis_enforce_one_limit(redis_server: RedisServer) -> None:
    clock = WallClock()
    async with redis_client(redis_server.url) as redis_a, redis_client(redis_server.url) as redis_b:
        assert redis_a is not None and redis_b is not None
        gateway_a = RedisRateLimiter(redis_a, requests_per_minute=30, burst=3, clock=clock)
        gateway_b = RedisRateLimiter(redis_b, requests_per_minute=30, burst=3, clock=clock)
        decisions = [await gateway.check("ip:a") for gateway in (gateway_a, gateway_b, gateway_a, gateway_b)]
        clock.now += 1
        still = await gateway_a.check("ip:a")
        clock.now += 1
        after_retry_after = await gateway_b.check("ip:a")
        await gateway_b.refund("ip:a")
        refunded = await gateway_a.check("ip:a")
        ttl_ms = await redis_a.pttl(RedisRateLimiter.PREFIX + "ip:a")
    assert decisions == [Decision(True, 0)] * 3 + [refused(2)]
    assert still == refused(1)
    assert after_retry_after.allowed and refunded.allowed
    assert 0 < ttl_ms <= 7000, "an idle bucket leaves Redis once it would be full again"


async def test_a_dead_redis_falls_back_to_this_gateways_buckets(caplog: pytest.LogCaptureFixture) -> None:
    async with redis_client(f"redis://127.0.0.1:{free_port()}/0") as redis:
        assert redis is not None
        limiter = RedisRateLimiter(redis, requests_per_minute=30, burst=2)
        with caplog.at_level(logging.ERROR, logger="edge.rate_limit"):
            decisions = [(await limiter.check("ip:a")).allowed for _ in range(3)]
    assert decisions == [True, True, False], "still limited, by this gateway alone"
    assert len(caplog.records) == 1, "logged once a minute, not per request"
