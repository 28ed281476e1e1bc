"""The pipe protocol between the web process and the model child: every message, in one place.

Messages are small frozen dataclasses, told apart by type and pickled by `multiprocessing.Pipe`.
Only plain data crosses the pipe: image bytes in, JSON-ready dicts out (images inside them
as base64 PNG strings), and errors as a contract code + message, never a pickled exception
(an exception class the parent cannot import, or one that holds a model, would break it).

Conversation (parent -> child, child -> parent):

    child starts  -> Ready(device, segmenter) | LoadFailed(message)
    Ping          -> Pong
    Infer(...)    -> Result(request_id, data) | Failure(request_id, code, message)

The child answers messages strictly in order, one at a time; the parent never sends a
second `Infer` before the first is answered (it holds a lock), so replies need no matching
beyond the `request_id` sanity check. Closing the parent's end (EOF) tells the child to exit.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any, Literal

from shared.settings import AnalysisSettings


@dataclass(frozen=True)
class ChildConfig:
    """Everything the child needs to load the models and run the analysis."""

    bisenet_weights: str
    device: Literal["auto", "cpu", "cuda"]
    limits: AnalysisSettings
    # Test switch (`gpu_host.simulated_failures_file`): a file naming failures the real child
    # raises instead of running the analysis, one per inference (`gpu_host.failure_kinds`).
    simulated_failures_file: str = ""
    # Free-form knobs for a test child; the real child ignores them.
    extra: dict[str, Any] = field(default_factory=dict)


# -- child -> parent ----------------------------------------------------------------------


@dataclass(frozen=True)
class Ready:
    """Every model is loaded; sent once, first."""

    device: str
    segmenter: str


@dataclass(frozen=True)
class LoadFailed:
    """The models cannot be loaded (e.g. weights file missing); the child exits after this."""

    message: str


@dataclass(frozen=True)
class Pong:
    """The answer to `Ping`: the child is alive and idle."""


@dataclass(frozen=True)
class Result:
    """The endpoint's `data` dict, JSON-ready."""

    request_id: str
    data: dict[str, Any]


@dataclass(frozen=True)
class Failure:
    """A contract failure (1002-1008) or an internal one (1007), as code + message, and
    what kind of failure it was (an `ErrorType` value; None when not named)."""

    request_id: str
    code: int
    message: str
    error_type: str | None = None


# -- parent -> child ----------------------------------------------------------------------


@dataclass(frozen=True)
class Ping:
    """Are you alive? Sent once after `Ready`, before the child counts as ready."""


@dataclass(frozen=True)
class Infer:
    """Run one endpoint on one encoded image; `options` come from `parse_options`."""

    request_id: str
    endpoint: str
    image: bytes
    options: dict[str, Any]


ChildMessage = Ready | LoadFailed | Pong | Result | Failure
ParentMessage = Ping | Infer

# The signature of a child entry point: the real one (`gpu_host.child.serve`) or a test fake.
ChildEntry = Callable[[Connection, ChildConfig], None]
