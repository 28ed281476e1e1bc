"""The upstream error tree (`edge.pool.errors`) is the one its docstring draws, and the
forward service takes its numbers as value objects (`Timeouts`, `UpstreamLimits`)."""

from __future__ import annotations

import re
from typing import get_type_hints

import edge.pool.errors as errors
import edge.pool.host_leases  # noqa: F401 - defines HostLeased, a leaf of the tree
from edge.forwarding.service import ApiService
from edge.pool.errors import AnswerError, TransportError, UpstreamError, WorkerFailure
from edge.pool.upstream import Timeouts, Upstream, UpstreamLimits

BRANCHES = (TransportError, AnswerError)
# "├── Name   * what it is": the branch a name sits under, and whether it is starred
NODE = re.compile(r"^(?P<indent>[ │]*)[├└]── (?P<name>\w+)(?:\s+(?P<star>\*))?")


def drawn() -> tuple[dict[str, str], set[str]]:
    """The docstring's tree: each leaf's branch, and the starred leaves (WorkerFailures)."""
    assert errors.__doc__ is not None
    branch_of: dict[str, str] = {}
    starred: set[str] = set()
    branch = ""
    for line in errors.__doc__.splitlines():
        node = NODE.match(line[4:])  # below the root, `UpstreamError`
        if node is None:
            continue
        if not node["indent"]:
            branch = node["name"]
            continue
        branch_of[node["name"]] = branch
        if node["star"]:
            starred.add(node["name"])
    return branch_of, starred


def concrete(cls: type[UpstreamError]) -> set[type[UpstreamError]]:
    below = {sub for child in cls.__subclasses__() for sub in {child, *concrete(child)}}
    return below - {*BRANCHES, WorkerFailure}


def test_every_error_is_under_exactly_one_branch_as_the_docstring_draws() -> None:
    branch_of, starred = drawn()
    classes = concrete(UpstreamError)
    assert {cls.__name__ for cls in classes} == set(branch_of)
    for cls in classes:
        (branch,) = [branch for branch in BRANCHES if issubclass(cls, branch)]
        assert branch_of[cls.__name__] == branch.__name__, cls
    assert {cls.__name__ for cls in classes if issubclass(cls, WorkerFailure)} == starred


def test_every_worker_failure_names_its_reason() -> None:
    # the metrics' `reason` label of an ejection or a retry
    for cls in concrete(UpstreamError):
        if issubclass(cls, WorkerFailure) and cls is not errors.HostFailed:
            assert cls.reason in {"connect", "closed", "timeout", "bad_status", "unusable_body"}, cls


def test_the_numbers_are_passed_whole() -> None:
    for method in (ApiService.__init__, ApiService.reconfigure):
        assert get_type_hints(method)["timeouts"] is Timeouts
    assert get_type_hints(Upstream.__init__)["limits"] is UpstreamLimits
    assert Timeouts(10, 30).for_class(slow=True) == 30 and Timeouts(10, 30).for_class(slow=False) == 10
