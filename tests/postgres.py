"""A throw-away PostgreSQL 15 cluster for tests: initdb in a temp dir, a Unix socket only, stopped at the end.

PostgreSQL refuses to run as root, so as root (CI, these machines) the cluster belongs to
the `postgres` user (the temp dir is chown'ed to it) and every server command runs through
`runuser`. Without the binaries a test needing the cluster is skipped — except under
CI=true, where it fails: CI must never pass by skipping it (`.ci/run` installs PostgreSQL).

    tests/edge/conftest.py imports the fixtures `postgres` (the session's cluster) and
    `postgres_dsn` (a fresh database in it) for every test below it.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

BIN = Path(os.environ.get("HAIRGATE_POSTGRES_BIN", "/usr/lib/postgresql/15/bin"))
PORT = 5432  # only names the socket file: the cluster listens on no TCP port
SERVER_USER = "postgres"


class PostgresCluster:
    """One cluster: `start()`, `stop()` (fast shutdown: connections are cut), `dsn(database)`."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.data = directory / "data"
        self.log = directory / "server.log"
        self._as_server = os.geteuid() == 0
        if self._as_server:
            user = pwd.getpwnam(SERVER_USER)
            os.chown(directory, user.pw_uid, user.pw_gid)
        self._server(str(BIN / "initdb"), "-D", str(self.data), "--auth=trust", "-U", SERVER_USER, "-E", "UTF8")

    def _server(self, *command: str) -> None:
        prefix = ["runuser", "-u", SERVER_USER, "--"] if self._as_server else []
        done = subprocess.run([*prefix, *command], capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"{command[0]} failed: {done.stdout}{done.stderr}")

    def start(self) -> None:
        options = f"-k {self.directory} -c listen_addresses='' -p {PORT} -c fsync=off"
        self._server(str(BIN / "pg_ctl"), "start", "-w", "-D", str(self.data), "-l", str(self.log), "-o", options)

    def stop(self) -> None:
        self._server(str(BIN / "pg_ctl"), "stop", "-w", "-m", "fast", "-D", str(self.data))

    def dsn(self, database: str = "postgres") -> str:
        return f"host={self.directory} port={PORT} user={SERVER_USER} dbname={database}"

    def create_database(self, name: str) -> str:
        import psycopg

        with psycopg.connect(self.dsn(), autocommit=True) as connection:
            connection.execute(f'CREATE DATABASE "{name}"')
        return self.dsn(name)


def postgres_available() -> bool:
    return (BIN / "initdb").exists() and (os.geteuid() != 0 or shutil.which("runuser") is not None)


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresCluster]:
    if not postgres_available():
        if os.environ.get("CI") == "true":
            pytest.fail(f"PostgreSQL 15 is missing ({BIN}/initdb): .ci/run installs it")
        pytest.skip(f"PostgreSQL 15 not installed ({BIN}/initdb)")
    directory = Path(tempfile.mkdtemp(prefix="hairgate-pg-"))
    cluster = PostgresCluster(directory)
    cluster.start()
    try:
        yield cluster
    finally:
        with contextlib.suppress(RuntimeError):  # a test left it stopped
            cluster.stop()
        shutil.rmtree(directory, ignore_errors=True)


_databases = iter(range(1, 1_000_000))


@pytest.fixture
def postgres_dsn(postgres: PostgresCluster) -> str:
    """A fresh, empty database in the session's cluster (running: a test that stopped it restarts it)."""
    return postgres.create_database(f"audit_{next(_databases)}")
