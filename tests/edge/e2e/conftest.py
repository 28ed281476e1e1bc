"""Fixtures for black-box tests of the real gateway process in front of fake worker processes.

`cluster` kills every process a test started, whatever happened, and prints the gateway's
log at teardown so that a failing test shows it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.edge.e2e.harness import Cluster


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    cluster = Cluster(tmp_path)
    try:
        yield cluster
    finally:
        cluster.stop()
