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

A file is never read whole: an annotation may be tens of megabytes (drawn over the client's
own photo), and a client that stops reading would pin all of it (issue 39: 16 stalled
downloads of 72 MB took the gateway from 82 MB to 1.2 GB). The answer streams in pieces of
`PIECE_BYTES`, one piece read only once the socket took the one before; how many downloads
run at once, and how long a stalled one may last, is `edge.annotations.downloads`'.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import trio
from quart_trio.wrappers.response import TrioFileBody

from edge.annotations.static_cleanup import ANNOTATIONS

# what `edge.annotations.rewrite` names a file: a lower-case UUID4
_ANNOTATION_NAME = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}\.png")
_NO_FOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC
PIECE_BYTES = 64 * 1024  # one read, one socket write: what a download holds in memory


def annotation_path(static_dir: str | Path, subpath: str) -> Path | None:
    """The file for a `/static/<subpath>` request, or None when the name is not allowed."""
    folder, _, name = subpath.partition("/")
    if folder != ANNOTATIONS or not _ANNOTATION_NAME.fullmatch(name):
        return None
    return Path(static_dir) / ANNOTATIONS / name


class FileChanged(OSError):
    """The file under an annotation's name is no longer the one that was checked."""


@dataclass(frozen=True)
class AnnotationFile:
    """An annotation that passed the checks: where, how large, and which file it was
    (device and inode), so that the file sent is the file checked."""

    path: Path
    size: int
    identity: tuple[int, int]


def _open_regular_file(path: Path) -> tuple[int, os.stat_result] | None:
    """An open descriptor of the regular, singly linked file at `path` and its status, or
    None; the caller closes the descriptor."""
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
        # not a directory, FIFO, device … planted there, nor a hard link to some other file
        if stat.S_ISREG(status.st_mode) and status.st_nlink == 1:
            return descriptor, status
    except OSError:
        pass
    os.close(descriptor)
    return None


def _check_file(path: Path) -> AnnotationFile | None:
    opened = _open_regular_file(path)
    if opened is None:
        return None
    descriptor, status = opened
    os.close(descriptor)
    return AnnotationFile(path, status.st_size, (status.st_dev, status.st_ino))


def _reopen(checked: AnnotationFile) -> BinaryIO:
    """The checked file opened again for reading; FileChanged if it went or was replaced
    since (the clean-up deleted it, someone planted another file under its name)."""
    opened = _open_regular_file(checked.path)
    if opened is None:
        raise FileChanged(f"{checked.path.name} is gone")
    descriptor, status = opened
    if (status.st_dev, status.st_ino) != checked.identity:
        os.close(descriptor)
        raise FileChanged(f"{checked.path.name} was replaced")
    return os.fdopen(descriptor, "rb")


async def check_annotation(
    static_dir: str | Path, subpath: str, limiter: trio.CapacityLimiter
) -> AnnotationFile | None:
    """The annotation a `/static/<subpath>` request names, checked, or None (a 404)."""
    path = annotation_path(static_dir, subpath)
    if path is None:
        return None
    return await trio.to_thread.run_sync(_check_file, path, limiter=limiter)


class AnnotationBody(TrioFileBody):
    """Quart-trio's file body — pieces of `PIECE_BYTES`, each read in a thread and sent
    before the next is read — over the file that was checked. Its own `__init__` and
    `__aenter__` because quart-trio's open the path by name, following links; this one is
    opened when the answer starts (a HEAD or an answer never started holds no descriptor)
    and only if it is still the file checked."""

    buffer_size = PIECE_BYTES

    def __init__(self, checked: AnnotationFile) -> None:
        self.file_path = checked.path
        self.size = checked.size
        self.begin = 0
        self.end = checked.size
        self.file = None
        self._checked = checked

    async def __aenter__(self) -> AnnotationBody:
        self.file = trio.wrap_file(await trio.to_thread.run_sync(_reopen, self._checked))
        return self
