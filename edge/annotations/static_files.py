"""Serving annotation PNGs: `/static/annotations/<uuid4>.png` and nothing else.

Only what the gateway itself wrote is served. The name must be one the gateway makes
(`str(uuid.uuid4())` + ".png") before it touches the file system, so `..`, encoded dots,
absolute paths, backslashes and sub-folders never reach a path join. Nothing is followed:
the annotations folder is opened with O_NOFOLLOW (a folder replaced by a symlink is not
entered) and the file relative to it with O_NOFOLLOW (a planted symlink) and O_NONBLOCK (a
planted FIFO cannot hold a file thread). It must be a regular file with one link: the
gateway writes a temp file and renames it, so a second link means someone planted a hard
link to another file (the secrets file, say) under an annotation's name. Descriptors are
always closed.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

import trio

from edge.annotations.static_cleanup import ANNOTATIONS

# what `edge.annotations.rewrite` names a file: a lower-case UUID4
_ANNOTATION_NAME = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}\.png")
_NO_FOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC


def annotation_path(static_dir: str | Path, subpath: str) -> Path | None:
    """The file for a `/static/<subpath>` request, or None when the name is not allowed."""
    folder, _, name = subpath.partition("/")
    if folder != ANNOTATIONS or not _ANNOTATION_NAME.fullmatch(name):
        return None
    return Path(static_dir) / ANNOTATIONS / name


def _read_regular_file(path: Path) -> bytes | None:
    try:
        folder = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | _NO_FOLLOW)
    except OSError:  # missing, or a symlink (ELOOP, ENOTDIR)
        return None
    try:
        descriptor = os.open(path.name, os.O_RDONLY | os.O_NONBLOCK | _NO_FOLLOW, dir_fd=folder)
    except OSError:  # missing, a symlink (ELOOP), unreadable: all just "not found"
        return None
    finally:
        os.close(folder)
    try:
        status = os.fstat(descriptor)
        # a directory, FIFO, device … planted there; or a hard link to some other file
        if not stat.S_ISREG(status.st_mode) or status.st_nlink != 1:
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
