"""`hairgate audit`'s arguments (issue 39 item 7): a usage error for what it cannot answer, never a
traceback, and the options common to every question on either side of it, as people type them.

In-process through `cluster.cli.main`, on a SQLite file a trail wrote.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio

from cluster.cli import main
from edge.audit.store import SqliteAuditStore
from shared.contract import Code
from tests.edge.test_audit import MEASURE, arrive, trail_on
from tests.edge.test_audit_conflicts import finish


@pytest.fixture
def config(tmp_path: Path) -> str:
    """Settings naming an audit file with three failed executions."""
    trail = trail_on(SqliteAuditStore(tmp_path / "audit.sqlite3"))
    finish(trail, arrive(trail, 3), Code.SYSTEM_ERROR)
    assert trio.run(trail.flush)
    path = tmp_path / "settings.toml"
    path.write_text(f'[edge.audit]\npath = "{tmp_path / "audit.sqlite3"}"\n')
    return str(path)


def audit(capsys: pytest.CaptureFixture[str], *arguments: str) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of `hairgate audit …`."""
    try:
        status = main(["audit", *arguments])
    except SystemExit as exited:  # argparse's usage error
        status = int(exited.code or 0)
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def test_a_since_too_far_back_is_a_usage_error_and_the_farthest_is_answered(
    config: str, capsys: pytest.CaptureFixture[str]
) -> None:
    for since in ("99999999999d", "36501d", "9" * 400 + "s"):  # an OverflowError's traceback, before
        status, out, err = audit(capsys, "--config", config, "failures", "--since", since)
        assert (status, out) == (2, ""), since
        assert err.startswith("usage: hairgate audit failures") and "argument --since: must be at most 36500d" in err
    status, out, _ = audit(capsys, "--config", config, "--json", "failures", "--since", "36500d")
    assert status == 0 and json.loads(out)["code"] == [
        {"code": Code.SYSTEM_ERROR, "executions": 3, "failed": 3, "share": 1.0}
    ]


@pytest.mark.parametrize("top", ["-1", "0", "1001", "ten"])
def test_top_must_be_a_number_of_rows(config: str, capsys: pytest.CaptureFixture[str], top: str) -> None:
    status, out, err = audit(capsys, "--config", config, "retries", "--top", top)
    assert (status, out) == (2, "") and "argument --top: must be a whole number from 1 to 1000" in err


def test_the_common_options_go_before_or_after_the_question(config: str, capsys: pytest.CaptureFixture[str]) -> None:
    for arguments in (
        ["failures", "--since", "1h", "--json", "--config", config],  # "unrecognized arguments", before
        ["--json", "failures", "--config", config],
        ["--config", "elsewhere.toml", "failures", "--json", "--config", config],  # the last one given
        ["--config", config, "--json", "failures", "--since", "1h"],
    ):
        status, out, err = audit(capsys, *arguments)
        assert status == 0, (arguments, err)
        assert json.loads(out)["endpoint"] == [{"endpoint": MEASURE, "executions": 3, "failed": 3, "share": 1.0}]


def test_without_json_either_side_it_is_a_table(config: str, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = audit(capsys, "failures", "--config", config)
    assert status == 0 and out.lstrip().startswith("endpoint:")
