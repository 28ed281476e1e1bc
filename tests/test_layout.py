"""The top packages import only downward: `shared` (the contract, settings, the HTTP server
both services run) below everything; `analysis` on it; the two services on those and never
on each other; `cluster` (the `hairgate` command and the launcher) on top. Within edge/ and
analysis/ their own layout tests hold the rooms (tests/edge/test_layout.py,
tests/analysis/test_layout.py). The contract (`shared/contract/`) reads nothing of ours but
itself and the settings, and the analysis raises its own errors, never the contract's."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# each package -> the packages it may import
MAY_IMPORT = {
    "shared": set(),
    "analysis": {"shared"},
    "edge": {"shared", "analysis"},  # the gateway's face workers run endpoint 99's analysis
    "gpu_host": {"shared", "analysis"},
    "cluster": {"shared", "analysis", "edge", "gpu_host"},
}


def _imported_packages(path: Path) -> set[str]:
    """The top packages of ours a module names in an import statement or an import string
    (`importlib.import_module("edge.main")` is an arrow too)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name.partition(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.partition(".")[0])
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and _looks_like_a_module(node.value):
            found.add(node.value.partition(".")[0])
    return found & set(MAY_IMPORT)


def _looks_like_a_module(text: str) -> bool:
    head, dot, rest = text.partition(".")
    return bool(dot) and head in MAY_IMPORT and rest.replace(".", "").replace("_", "").isalnum()


def test_every_package_imports_only_the_packages_below_it() -> None:
    upward = [
        f"{path.relative_to(REPO)} imports {package}"
        for owner, allowed in MAY_IMPORT.items()
        for path in sorted((REPO / owner).rglob("*.py"))
        for package in _imported_packages(path) - allowed - {owner}
    ]
    assert not upward, "\n".join(upward)


def test_the_check_sees_an_import_string() -> None:
    module = REPO / "cluster" / "cli.py"
    assert {"edge", "gpu_host", "analysis"} <= _imported_packages(module)


# The contract is one package that stands alone: of ours it reads only itself and the
# settings (the limits its checks take), never a service.
CONTRACT_MAY_IMPORT = ("shared.contract", "shared.settings")
# The analysis raises its own error (`analysis.errors.AnalysisError`), never the contract's;
# only `hairgate analyze`, which prints the envelope, turns one into the other.
CONTRACT_ERRORS = frozenset({"ContractError"})
ANALYSIS_GLUE = REPO / "analysis" / "command.py"


def _imported_modules(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def test_the_contract_imports_only_itself_and_the_settings() -> None:
    outside = [
        f"{path.relative_to(REPO)} imports {module}"
        for path in sorted((REPO / "shared" / "contract").rglob("*.py"))
        for module in _imported_modules(path)
        if module.partition(".")[0] in MAY_IMPORT and not module.startswith(CONTRACT_MAY_IMPORT)
    ]
    assert not outside, "\n".join(outside)


def _contract_errors_named(path: Path) -> set[str]:
    return {
        alias.name
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("shared.contract")
        for alias in node.names
        if alias.name in CONTRACT_ERRORS
    }


def test_the_analysis_raises_its_own_errors_not_the_contracts() -> None:
    named = [
        f"{path.relative_to(REPO)} imports {', '.join(sorted(names))}"
        for path in sorted((REPO / "analysis").rglob("*.py"))
        if path != ANALYSIS_GLUE and (names := _contract_errors_named(path))
    ]
    assert not named, "\n".join(named)
    assert _contract_errors_named(ANALYSIS_GLUE)  # the check sees an import of one
