"""Static downloads through the real gateway process: clients that do not read (issue 39 item 2).

A client that opens `GET /static/annotations/<id>.png` and stops reading must cost the gateway
one piece of the file, not the whole file, and only for a while: the answer streams in
bounded pieces, at most `edge.static_downloads.max_concurrent` run at once (the next one is
told 503 with Retry-After), and one whose client takes no piece for
`edge.static_downloads.stall_seconds` is cut and its slot freed. The stalled clients are raw
sockets with a small receive buffer that read nothing after the answer's head. Both tests
run by default: with the file streamed they take seconds (the file is sparse, and the
gateway reads only what the sockets take).
"""

from __future__ import annotations

import socket
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

import httpx
import psutil

from cluster.launcher import Process
from edge.annotations.downloads import MSG_STALLED, MSG_TOO_MANY_DOWNLOADS
from tests.edge.e2e.harness import Cluster

NOWHERE = "http://127.0.0.1:9"  # no worker is needed to serve a file: the pool stays empty
MB = 1024 * 1024
RECEIVE_BUFFER_BYTES = 4096  # the kernel doubles it; the client's window stays tiny
HEAD_TIMEOUT_SECONDS = 30
# The file is far larger than what the kernel's buffers of one connection can hold
# (net.ipv4.tcp_wmem's 4 MiB at most, plus the client's small window), so the gateway's
# writes block on a client that does not read.
ISSUE_FILE_MB = 72  # the issue's annotation
STALL_FILE_MB = 24
ALLOWED_GROWTH_MB = 100  # 16 downloads: a piece each, and the buffers and tasks that serve them


def _annotation(cluster: Cluster, size_bytes: int) -> str:
    """A file of `size_bytes` under the gateway's annotation folder; its URL path."""
    folder = cluster.static_dir / "annotations"
    folder.mkdir(parents=True, exist_ok=True)
    name = f"{uuid.uuid4()}.png"
    with open(folder / name, "wb") as file:
        file.write(b"\x89PNG\r\n\x1a\n")
        file.truncate(size_bytes)  # a sparse file: the test spends no time or disk writing it
    return f"/static/annotations/{name}"


@contextmanager
def _stalled_download(gateway: Process, path: str) -> Iterator[socket.socket]:
    """A client that sends the request, reads the answer's status line (peeking, nothing
    consumed) and then reads nothing; closed on exit."""
    host, port = gateway.url.removeprefix("http://").split(":")
    with socket.socket() as client:
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER_BYTES)  # before connect: the window
        client.settimeout(HEAD_TIMEOUT_SECONDS)
        client.connect((host, int(port)))
        client.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
        status_line = client.recv(15, socket.MSG_PEEK)
        assert status_line.startswith(b"HTTP/1.1 200"), status_line
        yield client


def _rss_mb(gateway: Process) -> float:
    return psutil.Process(gateway.pid).memory_info().rss / MB


def _read_to_the_end(client: socket.socket) -> int:
    """Every byte the connection still delivers, until the gateway's close; how many."""
    received = 0
    try:
        while chunk := client.recv(1024 * 1024):
            received += len(chunk)
    except ConnectionResetError:
        pass  # the kernel dropped what the gateway's close left unsent: also its close
    return received


def _assert_refused(response: httpx.Response) -> None:
    assert response.status_code == 503, response.text
    assert int(response.headers["retry-after"]) >= 1
    assert response.headers["content-type"] == "application/json"
    assert response.json() == {"status": "error", "message": MSG_TOO_MANY_DOWNLOADS}


def test_sixteen_stalled_downloads_of_a_72_mb_file_keep_the_gateway_small(cluster: Cluster) -> None:
    """Issue 39: 16 stalled downloads of a 72 MB annotation took the gateway from 168 MB to
    1.27 GB RSS (the file read whole for each, held up to 300 s), and a 17th ran too."""
    gateway = cluster.start_gateway([NOWHERE], edge={"static_downloads": {"max_concurrent": 16, "stall_seconds": 120}})
    path = _annotation(cluster, ISSUE_FILE_MB * MB)
    small = _annotation(cluster, 1024)
    assert httpx.get(gateway.url + small).status_code == 200  # every code path of a download imported
    before = _rss_mb(gateway)
    with ExitStack() as stalled:
        for _ in range(16):
            stalled.enter_context(_stalled_download(gateway, path))
        during = _rss_mb(gateway)
        _assert_refused(httpx.get(gateway.url + path, timeout=10))
        during = max(during, _rss_mb(gateway))
        print(f"gateway RSS: {before:.0f} MB before, {during:.0f} MB with 16 stalled downloads of {ISSUE_FILE_MB} MB")
        assert during - before < ALLOWED_GROWTH_MB, (before, during)


def test_a_stalled_download_is_cut_and_its_slot_freed(cluster: Cluster) -> None:
    """One slot: a client that reads nothing holds it until `stall_seconds` pass with no
    piece taken; meanwhile another download is refused; then the stalled one is cut (its
    answer ends short, the gateway logs it) and the next download runs whole."""
    # long enough for the refused request to be answered first on a busy machine
    gateway = cluster.start_gateway([NOWHERE], edge={"static_downloads": {"max_concurrent": 1, "stall_seconds": 3}})
    size = STALL_FILE_MB * MB
    path = _annotation(cluster, size)
    with _stalled_download(gateway, path) as client:
        _assert_refused(httpx.get(gateway.url + path, timeout=10))
        gateway.wait_for_log(MSG_STALLED, timeout_s=15)  # the line comes once the slot is free
        assert _read_to_the_end(client) < size, "the stalled answer was cut, not finished"
    response = httpx.get(gateway.url + path, timeout=30)
    assert response.status_code == 200 and len(response.content) == size
    assert response.headers["content-length"] == str(size)
