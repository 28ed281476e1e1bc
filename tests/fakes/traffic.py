"""Seeded client traffic for the dispatcher, replayed through it in virtual time (no sockets).

The early-refusal claim ("every request refused at once would have timed out in the queue")
is checked on one seed by tests/edge/test_dispatch.py and measured over many by
scripts/bench_scheduling.py (f): both replay these arrivals through this loop, so that the
test and the bench speak of the same traffic. Run `replay` under
`trio.testing.MockClock(autojump_threshold=0)`.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import trio

from edge.pool.dispatch import Busy, Dispatcher, EarlyRefusal

GROW, MEASURE = "/api/v1/hair/grow", "/api/v1/hair/measure"
Arrival = tuple[float, bool, float]  # (arrival time, slow, service seconds)


def bursty_arrivals(seed: int, seconds: float) -> list[Arrival]:
    """Bursts of generations (8-10 s) over a steady trickle of measurements (0.1-0.3 s),
    so that queues grow past a 10 s queue wait on 3 hosts and drain again."""
    rng = random.Random(seed)
    arrivals: list[Arrival] = []
    at = 0.0
    while at < seconds:
        at += rng.expovariate(2.0)
        arrivals.append((at, False, rng.uniform(0.1, 0.3)))
        if rng.random() < 0.08:  # a burst of generations
            arrivals += [(at + rng.uniform(0, 2), True, rng.uniform(8, 10)) for _ in range(rng.randint(3, 10))]
    return sorted(arrivals)


async def replay(dispatcher: Dispatcher, arrivals: Sequence[Arrival]) -> list[str]:
    """Each arrival's outcome, in order: "served", "refused" (early refusal) or "timed out"
    (no worker within the queue wait)."""
    outcomes = [""] * len(arrivals)

    async def request(number: int, slow: bool, service: float) -> None:
        path = GROW if slow else MEASURE
        try:
            async with dispatcher.slot(slow=slow), dispatcher.worker(path=path, slow=slow) as lease:
                with lease.forwarding(60):
                    await trio.sleep(service)
            outcomes[number] = "served"
        except EarlyRefusal:
            outcomes[number] = "refused"
        except Busy:
            outcomes[number] = "timed out"

    async with trio.open_nursery() as nursery:
        for number, (at, slow, service) in enumerate(arrivals):
            await trio.sleep_until(at)
            nursery.start_soon(request, number, slow, service)
    return outcomes
