"""The SQLite idempotency store failing under a real `hairgate edge` (gateway.md § Idempotency).

No storage fault may take the gateway down: with the file's `-shm` made immutable, with
the disk under the file full, and with the file itself made read-only, the process keeps
running, a keyed request gets 1007 `后端服务暂不可用，请稍后重试` (or is served, where the
fault does not touch what it needs), and unkeyed traffic is answered as before.

The faults are real, not simulated: `chattr +i` (immutable: read-only even for root, the
user these tests run as) and a small tmpfs mounted for the store. Both need root; without
it the tests skip saying so.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from shared.contract import HEADER_IDEMPOTENCY_KEY, HEADER_RETRY_AFTER, MSG_BACKEND_UNAVAILABLE, Code
from tests.edge.e2e.harness import Cluster, measure

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="chattr +i and mount need root")

STORE = "idempotency.sqlite3"


def _chattr(flag: str, *paths: Path) -> None:
    done = subprocess.run(["chattr", flag, *map(str, paths)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"chattr {flag} is not permitted here: {done.stderr.strip()}")


@pytest.fixture
def immutable(tmp_path: Path) -> Iterator[list[Path]]:
    """Paths a test makes immutable (`chattr +i`); made mutable again at teardown, so they can be deleted."""
    paths: list[Path] = []
    yield paths
    for path in paths:
        if path.exists():
            _chattr("-i", path)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs of its own: a disk the test can fill."""
    mount_point = tmp_path / "small-disk"
    mount_point.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount_point)], capture_output=True, text=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=True)


def _fill(path: Path) -> None:
    """Write zeros to `path` until its file system has no byte left."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT)
    try:
        while True:
            os.write(descriptor, b"\0" * 65536)
    except OSError:
        pass  # ENOSPC: full
    finally:
        os.close(descriptor)


def _assert_store_unavailable(response: httpx.Response) -> None:
    body = response.json()
    assert (body["code"], body["message"]) == (Code.SYSTEM_ERROR, MSG_BACKEND_UNAVAILABLE), response.text
    assert int(response.headers[HEADER_RETRY_AFTER]) >= 1


async def _keyed(client: httpx.AsyncClient) -> httpx.Response:
    return await measure(client, headers={HEADER_IDEMPOTENCY_KEY: uuid.uuid4().hex})


async def _unkeyed_still_served(cluster: Cluster, client: httpx.AsyncClient) -> None:
    answers = [await measure(client) for _ in range(3)]
    assert [a.json()["code"] for a in answers] == [Code.OK] * 3, "requests without a key are unaffected"
    assert cluster.gateway is not None and cluster.gateway.alive(), "the gateway is still running"


async def test_an_immutable_shm_file_does_not_take_the_gateway_down(cluster: Cluster, immutable: list[Path]) -> None:
    cluster.start_fakes(1)
    cluster.start_gateway()
    store = cluster.directory / STORE
    shm = store.with_name(STORE + "-shm")
    async with cluster.client() as client:
        assert (await _keyed(client)).json()["code"] == Code.OK  # the file exists and is in use
        shm.touch()  # as an older version left it, or anyone planting one
        immutable.append(shm)
        _chattr("+i", shm)
        keyed = [await _keyed(client) for _ in range(3)]
        await _unkeyed_still_served(cluster, client)
    # WAL with exclusive locking never maps (or even opens) the -shm: nothing to fail.
    assert [k.json()["code"] for k in keyed] == [Code.OK] * 3, [k.text for k in keyed]


@pytest.mark.slow  # the same path as a full disk (a write fails): that one runs by default
async def test_a_read_only_store_refuses_keyed_requests_only(cluster: Cluster, immutable: list[Path]) -> None:
    cluster.start_fakes(1)
    cluster.start_gateway()
    store = cluster.directory / STORE
    async with cluster.client() as client:
        assert (await _keyed(client)).json()["code"] == Code.OK
        files = [path for path in (store, store.with_name(STORE + "-wal")) if path.exists()]
        immutable.extend(files)
        _chattr("+i", *files)
        for _ in range(3):
            _assert_store_unavailable(await _keyed(client))
        await _unkeyed_still_served(cluster, client)
        _chattr("-i", *files)
        assert (await _keyed(client)).json()["code"] == Code.OK, "writable again: keys work again"
    assert "幂等存储不可用" in cluster.gateway.log_text()  # type: ignore[union-attr]


async def test_a_full_disk_refuses_keyed_requests_only_and_recovers(cluster: Cluster, small_disk: Path) -> None:
    cluster.start_fakes(1)
    cluster.start_gateway(edge={"idempotency": {"path": str(small_disk / STORE)}})
    filler = small_disk / "filler"
    async with cluster.client() as client:
        assert (await _keyed(client)).json()["code"] == Code.OK
        _fill(filler)
        answers = [await _keyed(client) for _ in range(5)]
        await _unkeyed_still_served(cluster, client)
        filler.unlink()
        assert (await _keyed(client)).json()["code"] == Code.OK, "space again: keys work again"
    # The WAL may still hold a few free bytes: the first keyed requests can fit; not all of them.
    refused = [a for a in answers if a.json()["code"] != Code.OK]
    assert refused, [a.text for a in answers]
    for response in refused:
        _assert_store_unavailable(response)
