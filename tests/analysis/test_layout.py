"""analysis/ keeps its stage order: no module imports a later stage, and no import circles.

The imports are read with `ast` (every `import`, lazy ones inside functions included), so
the layout cannot rot silently: an arrow back up, a circle, or a new top-level module that
no stage claims fails here.
"""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

import pytest

import analysis

ROOT = Path(analysis.__file__).resolve().parent

# top-level modules every stage may import: plain types, the analysis' error and the shared helpers
SHARED = {"analysis.types", "analysis.frame", "analysis.native_logs", "analysis.image_input", "analysis.errors"}
# top-level modules that wire the stages together: they may import anything, nothing imports them
ENTRIES = {"analysis", "analysis.endpoints", "analysis.models", "analysis.command"}
# what each stage may import besides itself and SHARED. hairline sits below segmentation:
# the segmenters reuse its trace, edge profile and bare-scalp test; it reads masks only as
# types.HairSegmentation. drawing reads a Hairline and the face, never a segmenter.
STAGE_MAY_IMPORT: dict[str, set[str]] = {
    "face": set(),
    "hairline": {"face"},
    "segmentation": {"face", "hairline"},
    "drawing": {"face"},
}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_module(name: str) -> bool:
    relative = Path(*name.split(".")[1:]) if "." in name else Path()
    return (ROOT / relative).with_suffix(".py").is_file() or (ROOT / relative / "__init__.py").is_file()


def imported_modules(path: Path) -> set[str]:
    """The analysis modules `path` imports, `from x import name` resolved to x.name where that is a module."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.split(".")[0] == "analysis")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(base_parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            if base.split(".")[0] != "analysis":
                continue
            submodules = {f"{base}.{alias.name}" for alias in node.names if is_module(f"{base}.{alias.name}")}
            found.update(submodules or {base})
    found.discard(name)
    return found


def stage_of(name: str) -> str:
    if name in SHARED:
        return "shared"
    if name in ENTRIES:
        return "entry"
    parts = name.split(".")
    if len(parts) >= 3 and parts[1] in STAGE_MAY_IMPORT:
        return parts[1]
    if len(parts) == 2 and parts[1] in STAGE_MAY_IMPORT:  # a stage's own __init__
        return parts[1]
    raise AssertionError(f"{name}: no stage claims it; add it to a stage package, SHARED or ENTRIES")


def import_graph() -> dict[str, set[str]]:
    return {module_name(path): imported_modules(path) for path in sorted(ROOT.rglob("*.py"))}


def test_the_parser_sees_the_known_arrows() -> None:
    # if the parser missed imports, the order tests below would pass on anything
    graph = import_graph()
    assert "analysis.hairline.trace" in graph["analysis.segmentation.subject_hair"]
    assert "analysis.drawing.designs" in graph["analysis.endpoints"]  # `from .drawing import designs`
    assert "analysis.segmentation.hairnet" in graph["analysis.models"]  # a lazy import in a function
    assert "analysis.face.head_samples" in graph["analysis.drawing.preview"]


def test_every_module_belongs_to_a_stage() -> None:
    for name in import_graph():
        stage_of(name)


def test_no_import_goes_back_up_the_stages() -> None:
    wrong: list[str] = []
    for name, targets in import_graph().items():
        stage = stage_of(name)
        for target in targets:
            target_stage = stage_of(target)
            if stage == "entry" or target_stage in ("shared", stage):
                allowed = target_stage != "entry" or stage == "entry"
            else:
                allowed = stage != "shared" and target_stage in STAGE_MAY_IMPORT[stage]
            if not allowed:
                wrong.append(f"{name} ({stage}) imports {target} ({target_stage})")
    assert not wrong, "\n".join(wrong)


def test_there_are_no_import_circles() -> None:
    graph = import_graph()
    # a package's __init__ is imported by its modules implicitly; only the explicit arrows count
    sorter = graphlib.TopologicalSorter(graph)
    try:
        sorter.prepare()
    except graphlib.CycleError as error:
        pytest.fail(f"import circle: {' -> '.join(error.args[1])}")
