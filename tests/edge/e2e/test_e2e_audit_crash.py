"""`kill -9` of a real gateway, and its restart, on an audit file another gateway shares (issue 39 items 4, 5).

Two gateways with the same (default) audit settings write one SQLite file. The first is
killed with SIGKILL right after a burst of answered requests, with a request held by a
fake host; the second holds one too. The restarted first gateway writes every answered
request's row (none lost in the writer's last half second), closes its own held one as
failed ("gateway restarted"), and leaves the second gateway's alone: that one completes
when its host answers.
"""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from edge.audit.rows import RESTARTED
from shared.contract import HEADER_EXECUTION_ID, Code
from tests.edge.e2e.harness import Cluster, measure, wait_until
from tests.fakes.launch import FakeWorkerProcess

pytestmark = [pytest.mark.slow]


def _rows(path: Path) -> dict[str, dict[str, Any]]:
    with sqlite3.connect(path) as connection:
        found = connection.execute("SELECT execution_id, status, code, node, reason FROM audit_log").fetchall()
    return {row[0]: dict(zip(("status", "code", "node", "reason"), row[1:], strict=True)) for row in found}


def _node(answer: httpx.Response) -> str:
    return answer.headers[HEADER_EXECUTION_ID].split("_")[3]


async def _held(fake: FakeWorkerProcess, count: int) -> None:
    async def holding() -> bool:
        return int((await fake.stats())["in_flight"]) >= count

    await wait_until(holding, 10, f"{count} requests held by the fake host")


async def _send_held(client: httpx.AsyncClient) -> None:
    with contextlib.suppress(httpx.TransportError):  # its gateway was killed under it
        await measure(client)


async def test_a_killed_gateway_loses_no_row_and_its_restart_closes_only_its_own(cluster: Cluster) -> None:
    # each gateway has a host of its own that holds its jobs, and one they share that answers
    first_holds, peer_holds, answering = cluster.start_fakes(3)
    cluster.start_gateway(workers=[first_holds, answering])
    audit = cluster.directory / "audit.sqlite3"
    pool = {"workers": [peer_holds.url, answering.url], "primary_workers": []}
    peer = cluster.start_peer_gateway(edge={"audit": {"path": str(audit)}, "pool": pool})  # one file, same settings
    async with cluster.client() as client, cluster.client(peer) as peer_client, trio.open_nursery() as nursery:
        first_node, peer_node = _node(await measure(client)), _node(await measure(peer_client))
        assert first_node != peer_node
        for fake in (first_holds, peer_holds):
            await fake.configure(hold=True)
        for each in (client, client, peer_client, peer_client):  # each gateway leases both its hosts
            nursery.start_soon(_send_held, each)
        await _held(first_holds, 1)
        await _held(peer_holds, 1)
        answered = [await measure(client) for _ in range(20)]  # to the shared host, the last ones unwritten
        assert all(answer.json()["code"] == Code.OK for answer in answered)
        cluster.gateway.kill()  # type: ignore[union-attr]
        cluster.start_gateway(workers=[first_holds, answering])
        ids = {answer.headers[HEADER_EXECUTION_ID] for answer in answered}

        async def restarted() -> bool:
            rows = _rows(audit)
            closed = [row for row in rows.values() if row["node"] == first_node and row["reason"] == RESTARTED]
            return ids <= set(rows) and len(closed) == 1

        await wait_until(restarted, 10, "the killed gateway's rows written, its held request closed")
        rows = _rows(audit)
        assert {rows[i]["status"] for i in ids} == {"completed"}
        first_open = [row for row in rows.values() if row["node"] == first_node and row["status"] != "completed"]
        assert [(row["status"], row["code"]) for row in first_open] == [("failed", None)]
        peer_open = [row for row in rows.values() if row["node"] == peer_node and row["status"] != "completed"]
        assert [row["status"] for row in peer_open] == ["executing"], "the live gateway's held request is its own"
        await peer_holds.release()

        async def peer_done() -> bool:
            return all(row["status"] == "completed" for row in _rows(audit).values() if row["node"] == peer_node)

        await wait_until(peer_done, 10, "the peer's held request completed")
    assert answering.alive()
