"""The framework internals the code relies on where the frameworks offer no hook: each
overridden or copied name of Hypercorn, Quart and quart-trio still exists, with the
parameters our override takes and, where our code copies or replaces its body, the body it
was written against. Their versions are exact in the lock (requirements/lock.txt); a new
release changes what is checked here before it changes the gateway silently.

After an upgrade, a failure names what to re-read: adapt our override to the new code,
then record the new parameters or source digest in `PINNED`. An override of a framework's
method, or a use of a private name of a framework or of trio, that is not listed here
(`PINNED`, `READ`) fails too: pin it here when you add it."""

from __future__ import annotations

import ast
import hashlib
import importlib
import importlib.metadata
import inspect
import re
import ssl
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
import trio
import trio.testing
from hypercorn.config import Config
from hypercorn.protocol.h11 import H11Protocol
from hypercorn.trio.tcp_server import TCPServer
from hypercorn.trio.worker_context import TrioSingleTask
from quart.wrappers.request import Body, Request
from quart_schema.openapi import OpenAPIProvider
from quart_trio.wrappers.request import TrioBody, TrioRequest
from quart_trio.wrappers.response import TrioFileBody

from tests.test_lock import APPLICATION, read_lock

REPO = Path(__file__).resolve().parents[1]
OUR_PACKAGES = ("edge", "gpu_host", "shared", "cluster")
FRAMEWORKS = ("hypercorn", "quart", "quart_trio", "quart_schema", "h11", "werkzeug", "trio")  # import names
DISTRIBUTIONS = ("hypercorn", "quart", "quart-trio", "quart-schema", "h11", "werkzeug", "trio")


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
        "5e40283daa303ec7",
        why="HTTP1Protocol replaces it (shared/http_server.py): an answer's head is written with its body, "
        "one write per answer; GatewayH11Protocol drops the `100 Continue` it withholds there, then calls it",
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
    Pin(
        H11Protocol,
        "handle",
        ("self", "event"),
        "3b56e067447488df",
        why="HTTP1Protocol.handle counts the bytes and reads of each event, then hands it on; while a "
        "refused body drains it takes the bytes itself: it relies on this reading a RawData through "
        "_handle_events and a Closed ending the stream",
    ),
    Pin(
        H11Protocol,
        "stream_send",
        ("self", "event"),
        "56a36254a368d71a",
        why="HTTP1Protocol.stream_send calls it, then starts a drain at the answer's EndBody: it relies on "
        "this writing the answer's end and recycling through _maybe_recycle",
    ),
    Pin(
        H11Protocol,
        "_close_stream",
        ("self",),
        "378930655d7bb41a",
        why="HTTP1Protocol._maybe_recycle calls it to end the app's stream before its body is drained",
    ),
    # h11's server connection (shared/http_server.py)
    Pin(
        h11.Connection,
        "next_event",
        ("self",),
        why="_ServerConnection keeps the request line, the head and h11's error around it",
    ),
    # Hypercorn's TCP connection (shared/http_server.py)
    Pin(
        TCPServer,
        "run",
        ("self",),
        "fd34b021d1a86c98",
        why="ContainedTCPServer.run calls it and contains what escapes: it relies on this closing the "
        "stream on every way out",
    ),
    Pin(
        TCPServer,
        "protocol_send",
        ("self", "event"),
        "225856426bff7be0",
        why="ContainedTCPServer.protocol_send replaces its writes (bounded, counted) and hands it the rest",
    ),
    Pin(
        TCPServer,
        "_close",
        ("self",),
        "bc73c4ae25a1ceec",
        why="ContainedTCPServer._close calls it under the write lock (one closer, never beside a write): "
        "it must not take that lock itself",
    ),
    Pin(
        TCPServer,
        "_idle_timeout",
        ("self",),
        "210ce1014d98e1cb",
        why="KeepAliveTimer does what it does (closes an idle connection at keep_alive_timeout, or at once "
        "when the server stops) with one task per connection",
    ),
    Pin(
        TCPServer,
        "_initiate_server_close",
        ("self",),
        "7c1b548a65adc8b1",
        why="KeepAliveTimer closes an idle connection with it, as _idle_timeout does",
    ),
    Pin(
        TrioSingleTask,
        "restart",
        ("self", "task_group", "action"),
        "0170ab8e4418dc0e",
        why="KeepAliveTimer takes its place as TCPServer.idle_task: restarted at each answer's end",
    ),
    Pin(
        TrioSingleTask,
        "stop",
        ("self",),
        "044ad384dfd2f565",
        why="KeepAliveTimer takes its place as TCPServer.idle_task: stopped at each request",
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
    # quart-schema's OpenAPI provider (edge/web/openapi.py, its `openapi_provider_class` hook)
    Pin(
        OpenAPIProvider,
        "generate_rules",
        ("self",),
        why="ContractDocument keeps the rules it yields to the business endpoints",
    ),
    Pin(OpenAPIProvider, "generate_methods", ("self", "rule"), why="ContractDocument replaces it: POST alone"),
    Pin(
        OpenAPIProvider,
        "build_request_body",
        ("self", "model", "source"),
        why="ContractDocument replaces it: both media types of each body",
    ),
    Pin(
        OpenAPIProvider,
        "build_response_object",
        ("self", "model", "headers_model"),
        why="ContractDocument replaces it: the answer headers and a real example answer",
    ),
    Pin(
        OpenAPIProvider,
        "operation_id",
        ("self", "method", "path", "func"),
        why="ContractDocument replaces it: the id `operation_id(...)` set",
    ),
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


def _ssl_stream() -> trio.SSLStream[trio.abc.Stream]:
    return trio.SSLStream(trio.testing.memory_stream_pair()[0], ssl.create_default_context(), server_hostname="x")


def _h11_server() -> h11.Connection:
    return h11.Connection(h11.SERVER)


def _quart_body() -> Body:
    return Body(None, 10)


@dataclass(frozen=True)
class Read:
    """A private attribute of a framework's (or trio's) object that our code reads or writes in
    place, where the framework has no public way: `probe` builds such an object."""

    name: str
    probe: Callable[[], object]
    why: str


READ = [
    # trio's TLS stream (edge/pool/upstream.py, tls_holds_bytes): whether a kept-alive
    # connection to a worker already holds bytes, which a cancelled receive cannot tell
    Read("_ssl_object", _ssl_stream, why="decrypted bytes the last receive left: its pending()"),
    Read("_incoming", _ssl_stream, why="a whole record read off the socket, not yet decrypted: its pending"),
    # h11's unparsed bytes, read in place (shared/http_server.py): h11 has no peek
    Read("_receive_buffer", _h11_server, why="_ServerConnection's request line and unparsed_bytes"),
    Read("_data", lambda: _h11_server()._receive_buffer, why="the receive buffer's bytearray"),
    # Quart's request body (edge/web/http.py, GatewayBody; its kinds checked below)
    Read("_data", _quart_body, why="the body's bytes, appended to and read by GatewayBody"),
    Read("_complete", _quart_body, why="set by GatewayBody once the body is whole"),
    Read("_has_data", _quart_body, why="set by GatewayBody as bytes arrive"),
    Read("_must_raise", _quart_body, why="GatewayBody's refusal, raised to the reader"),
    Read("_max_content_length", _quart_body, why="the limit GatewayBody refuses past"),
]
# Private names of the standard library the code uses: no framework's, outside this file
STANDARD_LIBRARY = {
    "_exit": "os._exit, the process's end without cleanup (gpu_host/failure_kinds.py)",
    "_Hash": "hashlib._Hash, in an annotation only (edge/admission/idempotency.py)",
    "_value2member_map_": "Enum's value lookup (shared/contract/envelope.py)",
}


def _digest(function: Callable[..., Any]) -> str:
    return hashlib.sha256(inspect.getsource(function).encode()).hexdigest()[:16]


@pytest.mark.parametrize("pin", PINNED, ids=lambda pin: pin.label)
def test_each_pinned_name_exists_with_the_parameters_and_body_it_was_written_against(pin: Pin) -> None:
    assert pin.owner is None or pin.name in vars(pin.owner), f"{pin.label} is gone ({pin.why})"
    parameters = tuple(inspect.signature(pin.target).parameters)
    assert parameters == pin.parameters, f"{pin.label} now takes {parameters} ({pin.why})"
    if pin.source is not None:
        assert _digest(pin.target) == pin.source, f"{pin.label} changed: re-read it ({pin.why})"


@pytest.mark.parametrize("read", READ, ids=lambda read: f"{read.probe.__name__}.{read.name}")
def test_each_private_attribute_read_in_place_exists(read: Read) -> None:
    assert hasattr(read.probe(), read.name), f"{read.name} is gone ({read.why})"


def test_tls_holds_bytes_reads_what_trio_keeps_there() -> None:
    # edge/pool/upstream.py calls `_ssl_object.pending()` and reads `_incoming.pending`
    stream = _ssl_stream()
    assert isinstance(stream._incoming, ssl.MemoryBIO) and stream._incoming.pending == 0
    assert isinstance(stream._ssl_object, ssl.SSLObject) and stream._ssl_object.pending() == 0


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


def _framework_bases(cls: type) -> list[type]:
    return [base for base in cls.__mro__[1:] if base.__module__.partition(".")[0] in FRAMEWORKS]


def test_every_override_of_a_frameworks_method_is_pinned_here() -> None:
    # public ones too: HTTP1Protocol.handle relies on what Hypercorn's does as much as on a private name
    pinned = {(pin.owner, pin.name) for pin in PINNED if pin.owner is not None}
    unpinned = []
    for cls in _our_classes_on_frameworks():
        framework_bases = _framework_bases(cls)
        for name, value in vars(cls).items():
            if name in _NOT_OVERRIDES or not (name.startswith("_") or inspect.isfunction(value)):
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
        "edge.web.openapi.ContractDocument",
        "shared.http_server.HTTP1Protocol",
        "shared.http_server.ContainedTCPServer",
    } <= names


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _trees() -> list[ast.Module]:
    return [
        ast.parse(path.read_text(), filename=str(path))
        for package in OUR_PACKAGES
        for path in sorted((REPO / package).rglob("*.py"))
    ]


def _private_names_of_others(trees: list[ast.Module]) -> set[str]:
    """Private attribute names our code reads that it never defines (a def, a class, an
    assignment): someone else's, such as `stream._ssl_object` on trio's SSLStream."""
    used: set[str] = set()
    defined: set[str] = set()
    for node in (node for tree in trees for node in ast.walk(tree)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined.add(node.name)
        elif isinstance(node, ast.Attribute) and _is_private(node.attr):
            (defined if isinstance(node.ctx, ast.Store) else used).add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            defined.add(node.id)
    return used - defined


def _private_names_inherited(cls: type) -> set[str]:
    """The private names our subclass of a framework's class uses on itself that it does not
    define, and that its framework bases' code does: theirs, such as Quart's `self._data`."""
    tree = ast.parse(inspect.getsource(cls).strip())  # stripped: a nested class is indented
    names = {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute) and _is_private(node.attr)}
    ours = {name for klass in cls.__mro__ if klass not in _framework_bases(cls) for name in vars(klass)}
    sources = "\n".join(inspect.getsource(base) for base in _framework_bases(cls) if base is not object)
    return {name for name in names - ours if re.search(rf"\b{name}\b", sources)}


def _private_names_of_frameworks_used() -> set[str]:
    inherited = (_private_names_inherited(cls) for cls in _our_classes_on_frameworks())
    return _private_names_of_others(_trees()).union(*inherited) - set(STANDARD_LIBRARY)


def test_every_private_name_of_a_framework_or_of_trio_the_code_uses_is_listed_here() -> None:
    listed = {pin.name for pin in PINNED} | {read.name for read in READ}
    unlisted = sorted(_private_names_of_frameworks_used() - listed)
    assert not unlisted, "pin each in PINNED or READ (tests/test_framework_pins.py): " + ", ".join(unlisted)


def test_the_grep_finds_the_known_private_names() -> None:
    # the check above is only as good as its grep
    assert {"_ssl_object", "_incoming", "_receive_buffer", "_data", "_handle_events", "_close_stream"} <= (
        _private_names_of_frameworks_used()
    )
