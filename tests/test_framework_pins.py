"""The framework internals the code relies on where the frameworks offer no hook: each
overridden or copied name of Hypercorn, Quart and quart-trio still exists, with the
parameters our override takes and, where our code copies or replaces its body, the body it
was written against. Their versions are exact in the lock (requirements/lock.txt); a new
release changes what is checked here before it changes the gateway silently.

After an upgrade, a failure names what to re-read: adapt our override to the new code,
then record the new parameters or source digest in `PINNED`. An override of a framework's
private name that is not in `PINNED` fails too: pin it here when you add it."""

from __future__ import annotations

import ast
import hashlib
import importlib
import importlib.metadata
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h11
import hypercorn.protocol
import hypercorn.trio
import hypercorn.trio.run
import hypercorn.utils
import pytest
from hypercorn.config import Config
from hypercorn.protocol.h11 import H11Protocol
from hypercorn.trio.tcp_server import TCPServer
from quart.wrappers.request import Body, Request
from quart_trio.wrappers.request import TrioBody, TrioRequest
from quart_trio.wrappers.response import TrioFileBody

from tests.test_lock import APPLICATION, read_lock

REPO = Path(__file__).resolve().parents[1]
OUR_PACKAGES = ("edge", "gpu_host", "shared", "cluster")
FRAMEWORKS = ("hypercorn", "quart", "quart_trio", "h11", "werkzeug")  # import names
DISTRIBUTIONS = ("hypercorn", "quart", "quart-trio", "h11", "werkzeug")


@dataclass(frozen=True)
class Pin:
    owner: type | None  # None: a module-level function
    name: str
    parameters: tuple[str, ...]
    source: str | None = None  # sha256 of its source, first 16 digits: our code copies or replaces its body
    why: str = ""

    @property
    def target(self) -> Callable[..., Any]:
        return getattr(self.owner, self.name) if self.owner is not None else self._function()

    def _function(self) -> Callable[..., Any]:
        module, _, name = self.name.rpartition(".")
        return getattr(importlib.import_module(module), name)

    @property
    def label(self) -> str:
        return f"{self.owner.__module__}.{self.owner.__qualname__}.{self.name}" if self.owner else self.name


PINNED = [
    # quart-trio's file body (edge/annotations/static_files.py)
    Pin(
        TrioFileBody,
        "__aenter__",
        ("self",),
        why="AnnotationBody opens the checked file itself (not by name) and sets the fields TrioFileBody "
        "reads: file_path, size, begin, end, file, buffer_size",
    ),
    # Hypercorn's HTTP/1.1 protocol (edge/web/server.py, shared/http_server.py)
    Pin(
        H11Protocol,
        "_create_stream",
        ("self", "request"),
        why="GatewayH11Protocol decides per request whether to withhold `100 Continue`, then calls it",
    ),
    Pin(
        H11Protocol,
        "_send_h11_event",
        ("self", "event"),
        why="GatewayH11Protocol drops the `100 Continue` it withholds there, then calls it",
    ),
    Pin(
        H11Protocol,
        "_handle_events",
        ("self",),
        "bd4a76b2837e8722",
        why="sends `100 Continue` through _send_h11_event after _create_stream: where the gateway withholds it",
    ),
    Pin(
        H11Protocol,
        "_check_protocol",
        ("self", "event"),
        why="HTTP1Protocol replaces it (shared/http_server.py): no HTTP/2, no WebSocket, no ambiguous body",
    ),
    Pin(
        H11Protocol,
        "_send_error_response",
        ("self", "status_code"),
        why="HTTP1Protocol replaces it (shared/http_server.py): a request h11 refuses is told what was "
        "malformed (the envelope under /api/), not a bare status",
    ),
    Pin(
        H11Protocol,
        "_maybe_recycle",
        ("self",),
        why="HTTP1Protocol waits for a body its answer left unread before recycling (shared/http_server.py)",
    ),
    # Hypercorn's TCP connection (shared/http_server.py)
    Pin(
        TCPServer,
        "_close",
        ("self",),
        "bc73c4ae25a1ceec",
        why="ContainedTCPServer._close calls it under the write lock (one closer, never beside a write): "
        "it must not take that lock itself",
    ),
    # Quart's request body (edge/web/http.py)
    Pin(
        Body,
        "append",
        ("self", "data"),
        "bb46c66a53b8b016",
        why="GatewayBody.append is Quart's own, except that an over-limit body is not marked complete",
    ),
    Pin(Body, "set_complete", ("self",), why="GatewayBody extends it"),
    Pin(TrioRequest, "get_data", ("self", "cache", "as_text", "parse_form_data"), why="GatewayRequest replaces it"),
    # Hypercorn's serving functions below its public `serve` (gpu_host/main.py)
    Pin(
        None,
        "hypercorn.trio.run.worker_serve",
        ("app", "config", "sockets", "shutdown_trigger", "task_status"),
        why="the GPU host serves on sockets it bound and checked itself",
    ),
    Pin(
        None,
        "hypercorn.utils.wrap_app",
        ("app", "wsgi_max_body_size", "mode"),
        why="the GPU host wraps its app as serve() would",
    ),
]


def _digest(function: Callable[..., Any]) -> str:
    return hashlib.sha256(inspect.getsource(function).encode()).hexdigest()[:16]


@pytest.mark.parametrize("pin", PINNED, ids=lambda pin: pin.label)
def test_each_pinned_name_exists_with_the_parameters_and_body_it_was_written_against(pin: Pin) -> None:
    assert pin.owner is None or pin.name in vars(pin.owner), f"{pin.label} is gone ({pin.why})"
    parameters = tuple(inspect.signature(pin.target).parameters)
    assert parameters == pin.parameters, f"{pin.label} now takes {parameters} ({pin.why})"
    if pin.source is not None:
        assert _digest(pin.target) == pin.source, f"{pin.label} changed: re-read it ({pin.why})"


def test_the_frameworks_installed_are_the_locked_versions_these_pins_were_written_against() -> None:
    locked = read_lock(APPLICATION)
    for distribution in DISTRIBUTIONS:
        installed, pinned = importlib.metadata.version(distribution), str(locked[distribution].version)
        assert installed == pinned, (
            f"{distribution}: installed {installed}, locked {pinned} (`make install` installs the lock)"
        )


def test_the_body_state_gatewaybody_reads_and_writes_is_quarts() -> None:
    # GatewayBody's limit/append/read/_refuse work on these; TrioBody sets them without
    # calling Body.__init__, so both are checked
    for body in (TrioBody(None, 10), Body(None, 10)):
        assert isinstance(body._data, bytearray)
        assert body._must_raise is None and body._max_content_length == 10
        for event in (body._complete, body._has_data):
            assert callable(event.set) and callable(event.is_set) and callable(event.wait)
    # GatewayRequest's max_content_length setter writes the attribute Quart's getter reads
    assert "_max_content_length" in vars(Request)
    assert isinstance(vars(Request)["max_content_length"], property)
    assert {"max_content_length", "body_timeout"} <= set(inspect.signature(Request.__init__).parameters)
    assert "body_class" in vars(Request) and "body_timeout" in Request.__init__.__code__.co_names


def test_where_hypercorn_looks_up_what_is_replaced_or_read() -> None:
    # ProtocolWrapper creates `H11Protocol` from its own module's globals for each connection:
    # assigning hypercorn.protocol.H11Protocol installs a subclass there
    assert "H11Protocol" in hypercorn.protocol.ProtocolWrapper.__init__.__code__.co_names
    # what GatewayH11Protocol uses of its instance: set in H11Protocol.__init__
    assert {"config", "connection", "send"} <= set(H11Protocol.__init__.__code__.co_names)
    assert h11.InformationalResponse and h11.LocalProtocolError and h11.ERROR
    # shared.http_server._ServerConnection reads what h11 holds unparsed in place (h11 has no
    # peek; `trailing_data` copies all of it): its buffer and that buffer's bytes
    connection = h11.Connection(h11.SERVER)
    connection.receive_data(b"GET / HTTP/1.1\r\n")
    assert isinstance(connection._receive_buffer._data, bytearray)
    assert bytes(connection._receive_buffer._data) == connection.trailing_data[0] == b"GET / HTTP/1.1\r\n"
    assert len(connection._receive_buffer) == 16
    # and Hypercorn answers a request h11 refused through the _send_error_response it replaces
    assert "_send_error_response" in H11Protocol._handle_events.__code__.co_names
    # GatewayConfig.reconfigure (a reload) assigns these two: Hypercorn must read them where it
    # uses them, not copy them at start (the header buffer per connection, the grace at shutdown)
    assert {"h11_max_incomplete_size", "graceful_timeout"} <= set(vars(Config))
    assert "h11_max_incomplete_size" in H11Protocol.__init__.__code__.co_names
    assert "graceful_timeout" in hypercorn.trio.run.worker_serve.__code__.co_names


def _our_classes_on_frameworks() -> list[type]:
    """Every class of ours (the service packages) with a framework class among its bases."""
    classes = []
    for package in OUR_PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            tree = ast.parse(path.read_text(), filename=str(path))
            imported = {
                (node.module if isinstance(node, ast.ImportFrom) else alias.name).partition(".")[0]
                for node in ast.walk(tree)
                if isinstance(node, (ast.Import, ast.ImportFrom))
                and not (isinstance(node, ast.ImportFrom) and node.level)
                for alias in node.names
                if isinstance(node, ast.Import) or node.module
            }
            if not imported & set(FRAMEWORKS):
                continue
            module = importlib.import_module(
                ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
            )
            for value in vars(module).values():
                if (
                    inspect.isclass(value)
                    and value.__module__ == module.__name__
                    and any(base.__module__.partition(".")[0] in FRAMEWORKS for base in value.__mro__[1:])
                ):
                    classes.append(value)
    return classes


_NOT_OVERRIDES = {
    "__init__",
    "__module__",
    "__qualname__",
    "__doc__",
    "__dict__",
    "__weakref__",
    "__annotations__",
    "__firstlineno__",
    "__static_attributes__",
    "__parameters__",
    "__orig_bases__",
    "_abc_impl",  # an abstract base class's own bookkeeping, not a name of the framework's
    "__abstractmethods__",
}


def test_every_override_of_a_frameworks_private_name_is_pinned_here() -> None:
    pinned = {(pin.owner, pin.name) for pin in PINNED if pin.owner is not None}
    unpinned = []
    for cls in _our_classes_on_frameworks():
        framework_bases = [base for base in cls.__mro__[1:] if base.__module__.partition(".")[0] in FRAMEWORKS]
        for name in vars(cls):
            if not name.startswith("_") or name in _NOT_OVERRIDES:
                continue
            owner = next((base for base in framework_bases if name in vars(base)), None)
            if owner is not None and (owner, name) not in pinned:
                ours, theirs = f"{cls.__module__}.{cls.__qualname__}", f"{owner.__module__}.{owner.__qualname__}"
                unpinned.append(f"{ours}.{name} overrides {theirs}.{name}")
    assert not unpinned, "add each to PINNED in tests/test_framework_pins.py:\n" + "\n".join(unpinned)


def test_the_walk_finds_the_known_overrides() -> None:
    # the check above is only as good as its walk
    names = {f"{cls.__module__}.{cls.__qualname__}" for cls in _our_classes_on_frameworks()}
    assert {
        "edge.web.server.GatewayH11Protocol",
        "edge.web.http.GatewayBody",
    } <= names
