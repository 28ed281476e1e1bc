"""The one reload idiom (edge/reload.py): a component is told reloaded settings by its
`reconfigure()`; none is handed a reader of the live settings to call when it needs them."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

from pydantic import BaseModel

import shared.settings
from edge.admission.rate_limit import ClientKeys

EDGE = Path(__file__).resolve().parents[2] / "edge"
# What a reload replaces: every settings model, and what is built from one per reload.
RELOADED = frozenset(
    {
        name
        for name, value in vars(shared.settings).items()
        if inspect.isclass(value) and issubclass(value, BaseModel) and value.__module__ == shared.settings.__name__
    }
    | {ClientKeys.__name__}
)
# The loader of the settings files, which SIGHUP calls: what reads the files, not a reader of the live settings.
LOADER = {
    ("edge/main.py", "serve", "reload"),
    ("edge/main.py", "_reload", "reload"),
    ("edge/reload.py", "reload_settings", "read"),
}


def sources() -> list[tuple[str, ast.Module]]:
    return [(str(path.relative_to(EDGE.parent)), ast.parse(path.read_text())) for path in sorted(EDGE.rglob("*.py"))]


def _name(node: ast.expr) -> str:
    return node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else ""


def reader_of(annotation: ast.expr | None) -> str | None:
    """The reloaded type a `Callable[..., T]` in this annotation returns, if any."""
    for node in ast.walk(annotation) if annotation is not None else ():
        if isinstance(node, ast.Subscript) and _name(node.value) == "Callable" and isinstance(node.slice, ast.Tuple):
            returned = _name(node.slice.elts[-1])
            if returned in RELOADED:
                return returned
    return None


def test_the_check_knows_the_settings_and_a_reader() -> None:
    assert {"Settings", "EdgeSettings", "StaticCleanupSettings", "RateLimitSettings", "ClientKeys"} <= RELOADED
    annotation = ast.parse("x: Callable[[], StaticCleanupSettings] | None").body[0]
    assert isinstance(annotation, ast.AnnAssign) and reader_of(annotation.annotation) == "StaticCleanupSettings"


def test_no_component_takes_a_reader_of_the_settings() -> None:
    # A parameter typed `Callable[[], SomeSettings]` is a component reading the live
    # settings itself: it would miss what a reload decides (the restart-only keys kept,
    # a limiter rebuilt only on change). Take the settings and add `reconfigure()`.
    readers = []
    for where, tree in sources():
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                arguments = node.args
                for argument in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]:
                    returned = reader_of(argument.annotation)
                    if returned is not None and (where, node.name, argument.arg) not in LOADER:
                        readers.append(f"{where}:{node.lineno} {node.name}({argument.arg}: -> {returned})")
    assert readers == []


def test_no_lambda_reads_the_settings() -> None:
    # `lambda: gateway.settings.edge.x` handed to a component is the same reader, untyped.
    lambdas = []
    for where, tree in sources():
        for node in ast.walk(tree):
            if isinstance(node, ast.Lambda) and any(
                isinstance(inner, ast.Attribute) and inner.attr == "settings" for inner in ast.walk(node.body)
            ):
                lambdas.append(f"{where}:{node.lineno}")
    assert lambdas == []
