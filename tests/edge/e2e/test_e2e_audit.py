"""The audit trail of real gateway processes: SQLite with no set-up, PostgreSQL shared and stopped.

- a gateway with default settings writes its SQLite file; `hairgate audit` answers on it;
  `scripts/prelaunch.py`'s audit check passes against it;
- two gateways (gateway_id 1 and 2) write one PostgreSQL table: ids never collide;
- PostgreSQL stopped under 20 requests/s: no request fails, every row is there once it is
  back (the gateway catches up by itself); a DSN whose database does not exist yet: served.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time
from typing import Any

import httpx
import psycopg
import pytest
import trio

from cluster.launcher import REPO_ROOT
from shared.contract import HEADER_EXECUTION_ID, Code
from tests.edge.e2e.harness import Cluster, measure, wait_until
from tests.edge.e2e.test_e2e_prelaunch import _prelaunch
from tests.postgres import PostgresCluster

pytestmark = [pytest.mark.slow]


def _with_dsn(cluster: Cluster, dsn: str) -> None:
    with cluster.secrets_path.open("a") as secrets:
        secrets.write(f'\n[audit]\npostgres_dsn = "{dsn}"\n')


def _rows(dsn: str) -> dict[str, dict[str, Any]]:
    with psycopg.connect(dsn) as connection:
        cursor = connection.execute("SELECT execution_id, status, code, worker FROM audit_log")
        return {row[0]: {"status": row[1], "code": row[2], "worker": row[3]} for row in cursor.fetchall()}


async def test_a_default_gateway_writes_sqlite_and_the_cli_and_prelaunch_read_it(cluster: Cluster) -> None:
    cluster.start_fakes(1)
    cluster.start_gateway()
    async with cluster.client() as client:
        answers = [await measure(client) for _ in range(3)]
    assert all(answer.json()["code"] == Code.OK for answer in answers)
    config = cluster.directory / "settings.toml"
    assert config.exists()

    def cli(*arguments: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "cluster.cli", "audit", "--config", str(config)]
        command += ["--secrets", str(cluster.secrets_path)]
        return subprocess.run([*command, *arguments], capture_output=True, text=True, timeout=60, cwd=REPO_ROOT)

    async def shown() -> bool:
        done = await trio.to_thread.run_sync(cli, "--json", "show", answers[-1].headers[HEADER_EXECUTION_ID])
        rows = json.loads(done.stdout)["rows"] if done.returncode == 0 else []
        return [row["status"] for row in rows] == ["completed"]

    await wait_until(shown, 10, "the last request's completed row")
    assert (cluster.directory / "audit.sqlite3").exists()
    retries = await trio.to_thread.run_sync(cli, "retries", "--since", "1h")
    assert retries.returncode == 0, retries.stderr
    _, results, output = await trio.to_thread.run_sync(_prelaunch, cluster, "--secrets", str(cluster.secrets_path))
    assert results.get("audit") == "PASS", output


async def test_two_gateways_share_one_postgresql_table(cluster: Cluster, postgres_dsn: str) -> None:
    _with_dsn(cluster, postgres_dsn)
    cluster.start_fakes(2)
    first = cluster.start_gateway(edge={"audit": {"gateway_id": 1}})
    second = cluster.start_peer_gateway(edge={"audit": {"gateway_id": 2}})
    ids = []
    for gateway in (first, second):
        async with cluster.client(gateway) as client:
            ids += [(await measure(client)).headers[HEADER_EXECUTION_ID] for _ in range(20)]
    assert len(set(ids)) == 40

    async def all_written() -> bool:
        rows = await trio.to_thread.run_sync(_rows, postgres_dsn)
        return set(ids) <= set(rows) and all(rows[i]["status"] == "completed" for i in ids)

    await wait_until(all_written, 10, "both gateways' rows")
    assert {execution_id.split("_")[2] for execution_id in ids} == {"001", "002"}


async def test_postgresql_stopped_under_load_fails_no_request_and_loses_no_row(
    cluster: Cluster, postgres: PostgresCluster
) -> None:
    dsn = postgres.create_database("e2e_stopped")
    _with_dsn(cluster, dsn)
    cluster.start_fakes(2)
    cluster.start_gateway()
    answers: list[httpx.Response] = []
    async with cluster.client() as client:

        async def send_for(seconds: float) -> None:  # 20 requests a second, each on its own
            async with trio.open_nursery() as nursery:
                end = time.monotonic() + seconds
                while time.monotonic() < end:
                    nursery.start_soon(lambda: _append(answers, measure(client)))
                    await trio.sleep(0.05)

        await send_for(2)
        await trio.to_thread.run_sync(postgres.stop)
        try:
            await send_for(5)
        finally:
            await trio.to_thread.run_sync(postgres.start)
        await send_for(2)
    assert len(answers) >= 150 and all(answer.json()["code"] == Code.OK for answer in answers)
    ids = {answer.headers[HEADER_EXECUTION_ID] for answer in answers}

    async def caught_up() -> bool:
        rows = await trio.to_thread.run_sync(_rows, dsn)
        return ids <= set(rows) and all(rows[i]["status"] == "completed" for i in ids)

    await wait_until(caught_up, 20, "every row, once PostgreSQL is back")


async def _append(answers: list[httpx.Response], answer: Any) -> None:
    answers.append(await answer)


async def test_a_dsn_that_cannot_connect_at_start_is_served_and_retried(
    cluster: Cluster, postgres: PostgresCluster
) -> None:
    dsn = postgres.dsn("e2e_not_yet")
    _with_dsn(cluster, dsn)
    cluster.start_fakes(1)
    gateway = cluster.start_gateway()
    async with cluster.client() as client:
        answer = await measure(client)
    assert answer.json()["code"] == Code.OK
    await trio.to_thread.run_sync(postgres.create_database, "e2e_not_yet")

    async def written() -> bool:
        try:
            return answer.headers[HEADER_EXECUTION_ID] in await trio.to_thread.run_sync(_rows, dsn)
        except psycopg.errors.UndefinedTable:  # the gateway has not connected since
            return False

    await wait_until(written, 10, "the row written once the database exists")
    assert "审计日志写入失败" in gateway.log_path.read_text(encoding="utf-8")


async def test_sigterm_writes_what_is_pending(cluster: Cluster) -> None:
    cluster.start_fakes(1)
    gateway = cluster.start_gateway()
    async with cluster.client() as client:
        answers = [await measure(client) for _ in range(30)]
    gateway.terminate()  # at once: the last rows are still in memory, their batch not yet due
    assert await trio.to_thread.run_sync(gateway.wait_exit, 15) == 0
    with sqlite3.connect(cluster.directory / "audit.sqlite3") as connection:
        rows = dict(connection.execute("SELECT execution_id, status FROM audit_log").fetchall())
    assert {rows.get(answer.headers[HEADER_EXECUTION_ID]) for answer in answers} == {"completed"}
