"""Whether another gateway waits for this host (gateway.md § Several gateways, `/health`'s
`"wanted"`): heard from the probes that say so while a job runs, for `HOST_WANTED_SECONDS`
after the last one. The gateway whose job runs reads it on its own probes and gives the host
a turn when its job ends; without this a gateway that keeps the host across its own
hand-overs (a few ms between two jobs) left a probing one nothing but luck."""

from __future__ import annotations

import math

from shared.contract import HOST_WANTED_SECONDS


class HostWanted:
    """The last "wanted" heard while busy; pure, `now` on any monotonic clock."""

    def __init__(self) -> None:
        self._until = -math.inf

    def heard(self, now: float, *, busy: bool) -> None:
        """A probe said its gateway waits for this host; it counts only while a job runs here
        (a free host is simply taken)."""
        if busy:
            self._until = now + HOST_WANTED_SECONDS

    def wanted(self, now: float, *, busy: bool) -> bool:
        """What `/health` says: a host that is free is not wanted, it is free."""
        return busy and now < self._until
