"""edge/'s rooms import only downward, so the layout cannot rot unnoticed.

Layers, lowest first: `edge.exchange` (the `/api/` request and answer types) and
`edge.shared_state` (the Redis client) · the sub-packages that do one job each (`pool`,
`admission`, `observe`, `annotations`, `audit`, `local`; they may import one another, never
in a circle: not between modules, nor between the sub-packages themselves) · `edge.forwarding` (the forward
service) · `edge.web` (the HTTP layer) · the top (`gateway`, `app`, `reload`, `main`),
which assembles them. Imports under `if TYPE_CHECKING:` are annotations only (a view's
`Gateway`) and are not arrows.

Settings are pushed, never read live (style.md § The second step): outside the modules that
load and apply them (`edge.main`, `edge.reload`), `<x>.settings` is written only on `self`
(a component's own copy, which its constructor and `reconfigure()` set) or at the top of a
module-level factory (`create_*`, `build_*`, `*_blueprint`: run once at start, where a
restart-only setting is read), never in a function or lambda defined inside one (a view, a
hook: run per request).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path
from typing import TypeGuard

EDGE = Path(__file__).resolve().parents[2] / "edge"
LAYERS = [
    {"edge.exchange", "edge.shared_state"},
    {"edge.pool", "edge.admission", "edge.observe", "edge.annotations", "edge.audit", "edge.local"},
    {"edge.forwarding"},
    {"edge.web"},
    {"edge.gateway", "edge.app", "edge.reload", "edge.main"},
]


def _module(path: Path) -> str:
    parts = path.relative_to(EDGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _runtime_imports(tree: ast.Module) -> set[str]:
    """The edge modules a module imports when it runs (`from edge.x import y` names
    `edge.x.y` when that is a module of its own)."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def _graph() -> dict[str, set[str]]:
    paths = {_module(path): path for path in EDGE.rglob("*.py")}
    return {
        module: {imported for imported in _runtime_imports(ast.parse(path.read_text())) if imported in paths}
        for module, path in paths.items()
    }


def _layer(module: str) -> int:
    for rank, prefixes in enumerate(LAYERS):
        if any(module == prefix or module.startswith(prefix + ".") for prefix in prefixes):
            return rank
    raise AssertionError(f"{module} is in no layer: add it to LAYERS in tests/edge/test_layout.py")


def test_every_import_points_down_or_sideways() -> None:
    upward = [
        f"{module} imports {imported}"
        for module, imports in _graph().items()
        if module != "edge"
        for imported in imports
        if imported != "edge" and _layer(imported) > _layer(module)
    ]
    assert not upward, "\n".join(sorted(upward))


def test_the_exchange_types_import_nothing_of_edge() -> None:
    assert _graph()["edge.exchange"] == set()


def test_no_module_imports_itself_in_a_circle() -> None:
    circle = _circle(_graph())
    assert not circle, "import circle: " + " -> ".join(circle)


def _sub_package(module: str) -> str:
    return ".".join(module.split(".")[:2])


def test_no_sub_package_imports_itself_in_a_circle() -> None:
    """Modules may be acyclic while their rooms are not (issue 41: admission -> observe ->
    pool -> admission, each arrow from a different module)."""
    arrows: dict[str, set[str]] = {}
    for module, imports in _graph().items():
        for imported in imports:
            if _sub_package(imported) != _sub_package(module):
                arrows.setdefault(_sub_package(module), set()).add(_sub_package(imported))
    assert not _circle(arrows), "sub-package circle: " + " -> ".join(_circle(arrows))


def _circle(arrows: dict[str, set[str]]) -> list[str]:
    """One circle of `arrows` (a path that ends where it began), or []."""
    done: set[str] = set()

    def walk(node: str, path: list[str]) -> list[str]:
        if node in path:
            return [*path[path.index(node) :], node]
        if node in done:
            return []
        for target in sorted(arrows.get(node, ())):
            found = walk(target, [*path, node])
            if found:
                return found
        done.add(node)
        return []

    for node in sorted(arrows):
        found = walk(node, [])
        if found:
            return found
    return []


def test_the_circle_check_finds_a_circle() -> None:
    assert _circle({"edge.a": {"edge.b"}, "edge.b": {"edge.c"}, "edge.c": {"edge.a"}}) == [
        "edge.a",
        "edge.b",
        "edge.c",
        "edge.a",
    ]
    assert _circle({"edge.a": {"edge.b"}, "edge.b": set()}) == []


def test_the_check_sees_a_known_arrow() -> None:
    # the checks above are only as good as the graph they walk
    graph = _graph()
    assert "edge.pool.pool" in graph["edge.pool.dispatch"]
    assert "edge.exchange" in graph["edge.admission.gate"]
    assert "edge.gateway" not in graph["edge.web.api_routes"]  # TYPE_CHECKING only


# --- settings are pushed (`reconfigure()`), not read where a request runs

SETTINGS_OWNERS = {"edge/main.py", "edge/reload.py"}  # load the settings; apply a reload
FunctionDef = ast.FunctionDef | ast.AsyncFunctionDef


def _is_factory(node: ast.stmt) -> TypeGuard[FunctionDef]:
    return isinstance(node, FunctionDef) and (
        node.name.startswith(("create_", "build_")) or node.name.endswith("_blueprint")
    )


def _runs_once(factory: FunctionDef) -> Iterator[ast.AST]:
    """The nodes of a factory's own body: not those of a function or lambda defined in it,
    which runs later, per call (a view, a hook)."""
    todo: list[ast.AST] = list(factory.body)
    while todo:
        node = todo.pop()
        yield node
        if not isinstance(node, FunctionDef | ast.Lambda):
            todo.extend(ast.iter_child_nodes(node))


def live_settings_reads(tree: ast.Module) -> list[int]:
    """The lines where `tree` touches `<x>.settings`, `x` not `self`, outside a factory's own body."""
    at_start = {id(node) for factory in tree.body if _is_factory(factory) for node in _runs_once(factory)}
    return sorted(
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and node.attr == "settings"
        and not (isinstance(node.value, ast.Name) and node.value.id == "self")
        and id(node) not in at_start
    )


def test_no_settings_are_read_live() -> None:
    # Reading `gateway.settings` where a request runs is a second idiom beside `reconfigure()`;
    # edge/reload.py says why pushing is the one. A restart-only value: read it in the factory.
    reads = [
        f"{where}:{line}"
        for path in sorted(EDGE.rglob("*.py"))
        if (where := str(path.relative_to(EDGE.parent))) not in SETTINGS_OWNERS
        for line in live_settings_reads(ast.parse(path.read_text()))
    ]
    assert reads == [], "push the value through the component's reconfigure() (edge/reload.py)"


PLANTED = """
def pages_blueprint(gateway):
    static_dir = gateway.settings.edge.static_dir  # 3: at start, allowed

    @pages.get("/static")
    async def static():
        return gateway.settings.edge.static_dir  # 7: per request

    return lambda: gateway.settings  # 9: per call


class Guidance:
    def __init__(self, gateway):
        self.settings = gateway.settings.edge.features  # 14: not a factory

    async def __call__(self):
        return self.settings, self._gateway.settings  # 17: its own copy, allowed; the gateway's, not
"""


def test_the_settings_check_finds_a_live_read() -> None:
    assert live_settings_reads(ast.parse(PLANTED)) == [7, 9, 14, 17]
