"""The model version: which analysis produced an answer (seed 002 §6.2), computed once at a start.

A retry after an upgrade may draw a different picture, and every forehead figure on record
must say which analysis measured it. The version is

    "<package version>+<the first 12 hex digits of a SHA-256 over the inputs>"

e.g. `0.1.0+3f9a2b1c4d5e` (a PEP 440 local version). The inputs are named digests, hashed
sorted by name as `name NUL sha256-hex LF` lines: every data file the analysis ships
(`analysis/data/*`: the hair network's weights, the fitted decision parameters, the face
model's geometry; not its licence text), plus whatever a caller adds (a GPU host: its BiSeNet
weights, its ComfyUI workflow — `gpu_host.version`). The package version names the code; the
hash names the data, which changes without a release (`make fit` rewrites the parameters).

Nothing here imports the analysis (its modules pull in numpy, OpenCV, torch): the files are
found where the `analysis` package lies, so a GPU host's web process and the gateway's main
process compute the version without loading a model.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from importlib.metadata import version
from importlib.util import find_spec
from pathlib import Path
from typing import Any

DISTRIBUTION = "hairgate"  # the package whose version names the code
HASH_DIGITS = 12  # 48 bits: no two inputs an operator will ever deploy collide
MISSING = "missing"  # an input file that is not there (a host that cannot load it says why itself)
_NOT_MODEL_DATA = frozenset({"NOTICE"})  # the licence text changes no answer
_CHUNK_BYTES = 1024 * 1024


@dataclass(frozen=True)
class ModelVersion:
    """The version and what it was computed from, for the start's log line."""

    value: str
    inputs: tuple[tuple[str, str], ...]  # (name, sha256 hex), sorted by name

    def describe(self) -> str:
        """`name=<12 hex>` per input: which input differs between two hosts' versions."""
        return " ".join(f"{name}={digest[:HASH_DIGITS]}" for name, digest in self.inputs)


def compose(inputs: Mapping[str, str]) -> ModelVersion:
    """The version of the package's code with these named digests."""
    ordered = tuple(sorted(inputs.items()))
    digest = hashlib.sha256("".join(f"{name}\0{value}\n" for name, value in ordered).encode()).hexdigest()
    return ModelVersion(f"{version(DISTRIBUTION)}+{digest[:HASH_DIGITS]}", ordered)


def analysis_inputs() -> dict[str, str]:
    """Every data file the analysis ships, by its path in the repository: its SHA-256."""
    return {f"analysis/data/{path.name}": file_sha256(path) for path in _analysis_data_files()}


def analysis_version() -> ModelVersion:
    """The analysis alone: what the gateway's own endpoints (4 and 99) answer with."""
    return compose(analysis_inputs())


def file_sha256(path: Path) -> str:
    """The file's SHA-256 (read in chunks: BiSeNet's weights are tens of MB); `MISSING` when absent."""
    digest = hashlib.sha256()
    try:
        with path.open("rb") as file:
            while chunk := file.read(_CHUNK_BYTES):
                digest.update(chunk)
    except FileNotFoundError:
        return MISSING
    return digest.hexdigest()


def json_sha256(document: Any) -> str:
    """A JSON document's SHA-256, keys sorted and without spaces: reformatting a file changes nothing."""
    canonical = json.dumps(document, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def _analysis_data_files() -> list[Path]:
    spec = find_spec("analysis")  # a top-level package: found, not imported
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the analysis package is not installed: no model version can be computed")
    data = Path(next(iter(spec.submodule_search_locations))) / "data"
    return sorted(path for path in data.iterdir() if path.is_file() and path.name not in _NOT_MODEL_DATA)
