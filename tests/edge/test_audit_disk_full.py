"""The audit writer on a full disk says so: SQLite's own error, not the rollback that followed it."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from edge.audit.store import SqliteAuditStore
from tests.edge.test_audit import arrive, trail_on


def fill(store: SqliteAuditStore) -> None:
    """The database may grow no more (SQLite's own limit on its pages, per connection): a write
    that needs a page more fails with SQLITE_FULL, "database or disk is full", and SQLite ends
    the transaction itself, as on a full disk."""
    (pages,) = store.query("PRAGMA page_count", ())[0]
    store.query(f"PRAGMA max_page_count = {pages}", ())


async def test_a_full_database_is_reported_as_full_not_as_the_rollback_after_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # issue 39: the writer's ROLLBACK after SQLite had rolled back already failed, and the log
    # said "cannot rollback - no transaction is active", hiding "database or disk is full"
    store = SqliteAuditStore(tmp_path / "audit.sqlite3")
    trail = trail_on(store)
    arrive(trail, 10)
    assert await trail.flush()  # the schema and 10 rows fit
    fill(store)
    arrive(trail, 500)
    assert not await trail.flush()
    assert trail.pending == 500  # held in memory, as on any failed write
    logged = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(logged) == 1 and "database or disk is full" in logged[0], logged
    assert "rollback" not in logged[0]
