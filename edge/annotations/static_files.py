"""Serving annotation PNGs: `/static/annotations/<uuid>.png` and nothing else.

The name is matched against a UUID pattern before it touches the file system, so `..`,
encoded dots, absolute paths, backslashes and sub-folders never reach a path join. The
file is opened with O_NOFOLLOW (a planted symlink is not followed) and O_NONBLOCK (a
planted FIFO cannot hold a file thread), must be a regular file, and is always closed.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

import trio

from edge.annotations.rewrite import ANNOTATIONS

_ANNOTATION_NAME = re.compile(r"[0-9a-f-]{36}\.png")


def annotation_path(static_dir: str | Path, subpath: str) -> Path | None:
    """The file for a `/static/<subpath>` request, or None when the name is not allowed."""
    folder, _, name = subpath.partition("/")
    if folder != ANNOTATIONS or not _ANNOTATION_NAME.fullmatch(name):
        return None
    return Path(static_dir) / ANNOTATIONS / name


def _read_regular_file(path: Path) -> bytes | None:
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:  # missing, a symlink (ELOOP), unreadable: all just "not found"
        return None
    try:
        status = os.fstat(descriptor)
        if not stat.S_ISREG(status.st_mode):  # a directory, FIFO, device … planted there
            return None
        chunks = []
        while chunk := os.read(descriptor, max(status.st_size, 65536)):
            chunks.append(chunk)
        return b"".join(chunks)
    except OSError:
        return None
    finally:
        os.close(descriptor)


async def read_annotation(static_dir: str | Path, subpath: str, limiter: trio.CapacityLimiter) -> bytes | None:
    path = annotation_path(static_dir, subpath)
    if path is None:
        return None
    return await trio.to_thread.run_sync(_read_regular_file, path, limiter=limiter)
