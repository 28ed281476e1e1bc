"""A gateway's local, append-only journal of its executions, so that a crash loses no row (audit.md § Crashes).

The trail writes rows in batches, half a second apart: a `kill -9` used to lose what was
still in memory and leave the rows of requests under way in `received`/`executing` for
good. Each gateway process now also appends one line per execution when it arrives (before
any answer can leave) and one when it ends, each a single `write()` to a file of its own:
the kernel keeps what was written through the death of the process (not through a power
cut: an fsync per request would cost milliseconds, and the trail's store does not promise
that either). The next gateway to start on the same directory writes those rows and closes
the unfinished ones as failed ("gateway restarted").

Whose journal is whose is the kernel's to say: a process holds an exclusive `flock` on its
own file for as long as it runs, and the kernel drops it when the process dies, however it
dies. A journal nobody holds is a dead gateway's (`adopt_dead`); gateways sharing one
directory (one SQLite file, or one host) never take each other's while they run.

The file only needs what the store may not have yet: `rewrite` replaces it with the
snapshots of the executions still pending or under way (a temporary file, locked, then
renamed over the journal: a crash in between leaves the old journal whole). Blocking code:
`create` and `adopt_dead` run in a worker thread at start, `append` and `rewrite` on the
event loop (one small write; a rewrite of what is pending and live).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
from collections.abc import Callable, Iterable
from pathlib import Path

from edge.audit.rows import Execution

log = logging.getLogger("edge.audit")

SUFFIX = ".journal"
_TEMPORARY = ".tmp"
_ENCODER = json.JSONEncoder(separators=(",", ":"))
_SNAPSHOT_FIELDS = len(Execution("", "", "", None, "", None, 0.0, 0.0).snapshot())
# A journal a gateway of before left (no model_version, the last field; nor error_type, the one
# before) is still adopted after an upgrade: the fields missing keep their defaults (None).
_OLDER_SNAPSHOT_FIELDS = (_SNAPSHOT_FIELDS - 1, _SNAPSHOT_FIELDS - 2)


def journal_directory(audit_path: str | Path, postgres_dsn: str = "") -> Path:
    """Where the journals of the gateways writing one store live, on this machine: beside the
    SQLite file (`var/audit.sqlite3.journals/`), or for PostgreSQL beside where that file would
    be, named after the database (`var/audit-postgresql-<12 hex>.journals/`, a digest of its
    host, port, database and user: never the password), so that a journal is only ever adopted
    into the store its rows were meant for."""
    path = Path(audit_path)
    if not postgres_dsn:
        return path.with_name(f"{path.name}.journals")
    from psycopg.conninfo import conninfo_to_dict  # only a gateway on PostgreSQL has psycopg loaded

    parts = conninfo_to_dict(postgres_dsn)
    where = " ".join(str(parts.get(key, "")) for key in ("host", "hostaddr", "port", "dbname", "user"))
    return path.with_name(f"audit-postgresql-{hashlib.sha256(where.encode()).hexdigest()[:12]}.journals")


def encode(execution: Execution) -> bytes:
    return (_ENCODER.encode(execution.snapshot()) + "\n").encode()


class Journal:
    """One gateway process's journal: `<directory>/<node>.journal`, locked while it runs."""

    def __init__(self, path: Path, descriptor: int, size: int) -> None:
        self.path = path
        self._descriptor = descriptor
        self.size_bytes = size  # bytes in the file now
        self.rewritten_bytes = size  # bytes the last rewrite left: the next one is due at twice that

    @classmethod
    def create(cls, directory: Path, name: str) -> Journal:
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"{name}{SUFFIX}"
        return cls(path, *_locked_file(path, []))

    def append(self, execution: Execution) -> None:
        """One line, one `write()` (O_APPEND): a crash keeps it whole or not at all. OSError
        (a full disk) is the caller's to report."""
        line = encode(execution)
        _write_all(self._descriptor, line)
        self.size_bytes += len(line)

    def rewrite(self, executions: Iterable[Execution]) -> None:
        """The journal becomes exactly these executions' snapshots (the rest is in the store)."""
        descriptor, size = _locked_file(self.path, executions)
        os.close(self._descriptor)  # the old file, already unlinked by the rename: its lock goes with it
        self._descriptor = descriptor
        self.size_bytes = self.rewritten_bytes = size

    def close(self, *, keep: bool) -> None:
        """At a clean shutdown: removed when the store has everything (`keep` false), else left,
        unlocked, for the next start to adopt."""
        if not keep:
            self.path.unlink(missing_ok=True)  # still locked: no other gateway is adopting it
        os.close(self._descriptor)

    def adopt_dead(self, settle: Callable[[Execution], None]) -> list[Execution]:
        """The executions of every journal in this directory that no live process holds: the last
        snapshot of each, passed to `settle` (which closes the unfinished ones), appended to this
        journal, and only then the dead file removed. Oldest files first."""
        adopted: list[Execution] = []
        for path in sorted(self.path.parent.glob(f"*{SUFFIX}"), key=_modified):
            if path != self.path:
                adopted += self._adopt(path, settle)
        for path in self.path.parent.glob(f".*{_TEMPORARY}"):
            _remove_if_dead(path)  # a rewrite cut short by a crash: its journal is whole
        return adopted

    def _adopt(self, path: Path, settle: Callable[[Execution], None]) -> list[Execution]:
        try:
            descriptor = os.open(path, os.O_RDONLY)
        except FileNotFoundError:  # another starting gateway adopted it meanwhile
            return []
        try:
            if not _lock(descriptor) or os.fstat(descriptor).st_nlink == 0:
                return []  # a live gateway's; or adopted by another gateway between our open and our lock
            with os.fdopen(os.dup(descriptor), "rb") as file:
                executions = _read(file.read(), path)
            for execution in executions:
                settle(execution)
                self.append(execution)
            path.unlink()
            return executions
        finally:
            os.close(descriptor)


def _read(data: bytes, path: Path) -> list[Execution]:
    """The last snapshot of each execution in a journal's bytes; a line that does not parse (a
    disk that filled mid-line) is skipped and counted in one log line."""
    latest: dict[str, Execution] = {}
    unreadable = 0
    for line in data.splitlines():
        try:
            values = json.loads(line)
            if not isinstance(values, list) or len(values) not in (_SNAPSHOT_FIELDS, *_OLDER_SNAPSHOT_FIELDS):
                raise ValueError("not a snapshot")
            execution = Execution(*values)
        except (ValueError, TypeError):
            unreadable += 1
            continue
        latest[execution.execution_id] = execution
    if unreadable:
        log.error("审计日志文件 %s 有 %d 行无法读取，已跳过", path.name, unreadable)
    return list(latest.values())


def _locked_file(path: Path, executions: Iterable[Execution]) -> tuple[int, int]:
    """A new file at `path` holding `executions`, locked before it gets its name (no other
    gateway can ever see it unlocked): (its descriptor, its size)."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}{_TEMPORARY}")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o600)
    try:
        if not _lock(descriptor):
            raise OSError(f"cannot lock {temporary}")
        data = b"".join(encode(execution) for execution in executions)
        _write_all(descriptor, data)
        os.replace(temporary, path)
    except BaseException:
        os.close(descriptor)
        with contextlib.suppress(OSError):
            temporary.unlink()
        raise
    return descriptor, len(data)


def _lock(descriptor: int) -> bool:
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _write_all(descriptor: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(descriptor, view) :]


def _remove_if_dead(path: Path) -> None:
    with contextlib.suppress(OSError):
        descriptor = os.open(path, os.O_RDONLY)
        try:
            if _lock(descriptor):
                path.unlink()
        finally:
            os.close(descriptor)


def _modified(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except FileNotFoundError:
        return 0.0
