"""A gateway's forward holding a host's lease, in a process of its own: a test kills it -9
mid-forward, as a gateway dies, and watches what its lease does to the other gateways.

    python -m tests.fakes.lease_holder --redis URL --host URL --lease-seconds S

Takes the lease through the gateway's own `RedisHostLeases.hold` (its heartbeat runs as in
the gateway), prints `{"event": "ready", "url": HOST}` once it holds it, then forwards
forever.
"""

from __future__ import annotations

import argparse
import json

import trio

from edge.pool.host_leases import RedisHostLeases
from edge.shared_state import redis_client

ATTEMPT_SECONDS = 180.0  # a generation's attempt: the lease the heartbeat replaced was this plus a margin


async def hold_forever(redis_url: str, host: str, lease_seconds: float) -> None:
    async with redis_client(redis_url) as redis:
        assert redis is not None
        async with RedisHostLeases(redis, lease_seconds).hold(host, ATTEMPT_SECONDS):
            print(json.dumps({"event": "ready", "url": host}), flush=True)
            await trio.sleep_forever()  # the forward runs until the process dies


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--redis", required=True)
    parser.add_argument("--host", required=True)
    parser.add_argument("--lease-seconds", type=float, required=True)
    args = parser.parse_args(argv)
    trio.run(hold_forever, args.redis, args.host, args.lease_seconds)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
