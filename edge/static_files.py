"""Serving annotation PNGs: `/static/annotations/<uuid>.png` and nothing else.

The name is matched against a UUID pattern before it touches the file system, so `..`,
encoded dots, absolute paths, backslashes and sub-folders never reach a path join; the
file is opened with O_NOFOLLOW so a planted symlink is not followed either.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

import trio

from edge.rewrite import ANNOTATIONS

_ANNOTATION_NAME = re.compile(r"[0-9a-f-]{36}\.png")


def annotation_path(static_dir: str | Path, subpath: str) -> Path | None:
    """The file for a `/static/<subpath>` request, or None when the name is not allowed."""
    folder, _, name = subpath.partition("/")
    if folder != ANNOTATIONS or not _ANNOTATION_NAME.fullmatch(name):
        return None
    return Path(static_dir) / ANNOTATIONS / name


def _read_regular_file(path: Path) -> bytes | None:
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:  # missing, a symlink (ELOOP), unreadable: all just "not found"
        return None
    with os.fdopen(descriptor, "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            return None
        return handle.read()


async def read_annotation(static_dir: str | Path, subpath: str, limiter: trio.CapacityLimiter) -> bytes | None:
    path = annotation_path(static_dir, subpath)
    if path is None:
        return None
    return await trio.to_thread.run_sync(_read_regular_file, path, limiter=limiter)
