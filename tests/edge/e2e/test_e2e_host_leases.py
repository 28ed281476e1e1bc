"""Two real gateways on one Redis in front of one fake host: a gateway killed -9 during a
`/grow` leaves the host to the other within seconds (issue 39: its lease blocked the idle
host for 189 s, and the other gateway's client got 1007 after its 30 s queue wait).

The host idle after the kill (the fake stops a job whose connection closed): the other
gateway's probe says so, and it takes the stale lease over. The host still busy by its
`/health` (a job left to finish): the dead gateway's lease lapses by itself, within
`edge.shared_state.lease_seconds` of its last renewal.
"""

from __future__ import annotations

import time

import httpx
import pytest
import trio

from shared.contract import Code
from shared.settings import SharedStateSettings
from tests.edge.e2e.harness import MEASURE_BODY, Cluster, metrics_listener, scrape, wait_until
from tests.fakes.redis_server import RedisServer

GROW = "/api/v1/hair/grow"
# Production's queue wait (the client that got 1007 waited this): long enough to see the block whole.
QUEUE_WAIT_SECONDS = 30
# The dispatcher looks at a host another gateway leases again after at most this (dispatch.py).
RECHECK_SECONDS = 1.0


@pytest.mark.parametrize("host_after_the_kill", ["idle", "busy"])
async def test_a_gateway_killed_during_a_grow_leaves_the_host_to_the_other_within_seconds(
    cluster: Cluster, redis_server: RedisServer, host_after_the_kill: str
) -> None:
    (fake,) = cluster.start_fakes(1)
    await fake.configure(hold=True)  # the dead gateway's /grow runs until it dies
    metrics, metrics_url = metrics_listener()
    shared = {
        "shared_state": {"redis_url": redis_server.url},
        "dispatch": {"queue_wait_seconds": QUEUE_WAIT_SECONDS, "max_queue_wait_seconds": QUEUE_WAIT_SECONDS * 2},
    }
    doomed = cluster.start_gateway(edge=shared)
    survivor = cluster.start_peer_gateway(edge={**shared, **metrics})
    answers: list[tuple[httpx.Response, float]] = []
    async with cluster.client(doomed) as on_doomed, cluster.client(survivor, timeout=60) as on_survivor:

        async def grow_on_the_doomed_gateway() -> None:
            with pytest.raises(httpx.TransportError):  # it dies before it answers
                await on_doomed.post(GROW, json=MEASURE_BODY)

        async def grow_on_the_survivor() -> None:
            answers.append((await on_survivor.post(GROW, json=MEASURE_BODY), time.monotonic()))

        async def on_the_host() -> bool:
            return (await fake.stats())["in_flight"] == 1

        async def survivor_waits() -> bool:  # it found the host leased, and waits for it
            return (await scrape(metrics_url))["hairgate_queue_length"][0].value == 1

        async def answered() -> bool:
            return bool(answers)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(grow_on_the_doomed_gateway)
            await wait_until(on_the_host, 10, "the doomed gateway's /grow on the host")
            nursery.start_soon(grow_on_the_survivor)
            await wait_until(survivor_waits, 10, "the survivor's /grow waiting for the host")
            await fake.configure(hold=False, health_busy=host_after_the_kill == "busy")
            doomed.kill()  # SIGKILL mid-forward: no release, no last renewal
            killed_at = time.monotonic()
            await wait_until(answered, QUEUE_WAIT_SECONDS + 5, "the survivor's answer")
    answer, answered_at = answers[0]
    blocked = answered_at - killed_at
    print(f"host after the kill: {host_after_the_kill}; the survivor's /grow answered {blocked:.2f} s after it")
    assert answer.json()["code"] == Code.OK, answer.text
    survivor_log = survivor.log_text()
    if host_after_the_kill == "idle":  # its probe saw the host idle under the dead gateway's lease
        assert "接管主机租约" in survivor_log
        assert blocked < SharedStateSettings().lease_seconds, f"taken over before the lease lapsed: {blocked:.2f} s"
    else:
        assert "接管主机租约" not in survivor_log, "a host busy by its /health is never taken over"
        assert blocked < SharedStateSettings().lease_seconds + RECHECK_SECONDS + 1, f"lapsed: {blocked:.2f} s"
    assert (await fake.stats())["overlaps"] == 0
