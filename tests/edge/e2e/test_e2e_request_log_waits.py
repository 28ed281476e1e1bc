"""What the request log and `/admin/stats` say about waits and failed forwards, on the real gateway.

gateway.md § Request log and stats: `queue_ms` is how long a request waited for a slot and
a worker, also when the wait timed out (issue 15: it said 0.02 for a request that waited
1 s); `by_worker.failed` counts every failed forward, also one retried on another worker.
"""

from __future__ import annotations

import pytest
import trio

from shared.contract import HEADER_TOKEN, MSG_BACKEND_BUSY, Code
from tests.edge.e2e.harness import Cluster, measure, wait_until

QUEUE_WAIT_S = 1.0


@pytest.mark.parametrize(
    "dispatch",
    [
        {"queue_wait_seconds": QUEUE_WAIT_S},  # waiting for the only worker
        pytest.param({"max_inflight": 1, "max_queue_wait_seconds": QUEUE_WAIT_S}, marks=pytest.mark.slow),  # the slot
    ],
    ids=["worker-wait", "slot-wait"],
)
async def test_a_request_that_timed_out_in_the_queue_logs_how_long_it_waited(
    cluster: Cluster, dispatch: dict[str, float]
) -> None:
    (fake,) = cluster.start_fakes(1)
    cluster.start_gateway(edge={"dispatch": dispatch})
    await fake.configure(hold=True)
    async with cluster.client() as client, trio.open_nursery() as nursery:
        nursery.start_soon(measure, client)  # holds the worker (and the slot)

        async def on_the_worker() -> bool:
            return (await fake.stats())["in_flight"] == 1

        await wait_until(on_the_worker, 5, "the first request to reach the worker")
        timed_out = await measure(client)
        await fake.configure(hold=False)
        await fake.release()
    assert (timed_out.json()["code"], timed_out.json()["message"]) == (Code.SYSTEM_ERROR, MSG_BACKEND_BUSY)
    entries = await cluster.wait_for_log_entries(2)
    (entry,) = [e for e in entries if e["request_id"] == timed_out.json()["request_id"]]
    assert QUEUE_WAIT_S * 1000 * 0.9 <= entry["queue_ms"] <= entry["duration_ms"], entry


async def test_a_forward_that_failed_then_succeeded_elsewhere_counts_as_failed(cluster: Cluster) -> None:
    broken, _healthy = cluster.start_fakes(2)
    # only the broken one is primary: every first attempt goes to it, the retry to the other
    cluster.start_gateway(primary=[broken])
    await broken.configure(fail_next=1, fail_status=500)
    async with cluster.client() as client:
        answer = await measure(client)
        assert answer.json()["code"] == Code.OK, answer.text
        (entry,) = await cluster.wait_for_log_entries(1)
        stats = await client.get("/admin/stats", headers={HEADER_TOKEN: cluster.token})
    assert (entry["worker"], entry["attempts"], entry["failed_workers"]) == (1, 2, [0])
    by_worker = stats.json()["since_start"]["by_worker"]
    assert by_worker == {"0": {"served": 0, "failed": 1}, "1": {"served": 1, "failed": 0}}
