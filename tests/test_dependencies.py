"""Every third-party module the code imports comes from a distribution pyproject.toml names,
not merely from one that something else happens to pull in (a dependency's dependency can
disappear in its next release); and the wheel carries every package and its data files."""

from __future__ import annotations

import ast
import importlib.metadata
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[1]
# make's plan as a person's shell would see it: under `make test TORCH=cpu` (CI) a nested make
# inherits the caller's variables (MAKEFLAGS, and the environment: make exports them), and the plan is the caller's.
MAKE_DRY_RUN = [
    "env",
    "-u",
    "MAKEFLAGS",
    "-u",
    "MFLAGS",
    "-u",
    "MAKELEVEL",
    "-u",
    "TORCH",
    "-u",
    "TORCH_INDEX",
    "make",
    "--no-print-directory",
]
PACKAGES = ("edge", "gpu_host", "shared", "cluster", "analysis")


def make_plan(*arguments: str) -> str:
    """What `make -n ARGUMENTS` would run (skips where make is not installed)."""
    if shutil.which("make") is None:
        pytest.skip("make is not installed here")
    result = subprocess.run([*MAKE_DRY_RUN, "-n", *arguments], cwd=REPO, capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    return result.stdout


PROJECT = "hairgate"


def _declared_distributions() -> set[str]:
    """Canonical names of the dependencies and of every extra (`gpu`: torch; `test`)."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    requirements = list(project["dependencies"])
    for extra in project.get("optional-dependencies", {}).values():
        requirements.extend(extra)
    return {canonicalize_name(Requirement(text).name) for text in requirements}


def _imported_top_level_modules() -> dict[str, set[str]]:
    """Top-level module -> the files that import it (absolute imports only; relative ones are ours)."""
    imports: dict[str, set[str]] = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
                if isinstance(node, ast.Import):
                    modules = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    modules = [node.module]
                else:
                    continue
                for module in modules:
                    imports.setdefault(module.partition(".")[0], set()).add(str(path.relative_to(REPO)))
    return imports


def test_every_imported_third_party_module_comes_from_a_declared_distribution() -> None:
    declared = _declared_distributions()
    providers = importlib.metadata.packages_distributions()
    undeclared = []
    for module, files in sorted(_imported_top_level_modules().items()):
        if module in sys.stdlib_module_names or module in PACKAGES:
            continue
        distributions = {canonicalize_name(name) for name in providers.get(module, [])}
        if not distributions:
            undeclared.append(f"{module} (installed by no distribution; imported in {sorted(files)})")
        elif not distributions & (declared | {PROJECT}):
            undeclared.append(f"{module} from {sorted(distributions)} (imported in {sorted(files)[:3]})")
    assert not undeclared, "imported but not named in pyproject.toml:\n" + "\n".join(undeclared)


def test_the_walk_sees_what_the_code_imports() -> None:
    # The check above is only as good as the walk: these imports are known to exist.
    imports = _imported_top_level_modules()
    assert {"h11", "quart", "cv2", "scipy", "trio", "numpy"} <= set(imports)
    assert "edge/pool/upstream.py" in imports["h11"]


def test_opencv_is_the_build_mediapipe_pulls_and_never_a_second_one() -> None:
    declared = _declared_distributions()
    installed = {canonicalize_name(dist.metadata["Name"]) for dist in importlib.metadata.distributions()}
    assert "opencv-contrib-python" in declared
    assert not {"opencv-python", "opencv-python-headless"} & (declared | installed)


def test_the_wheel_holds_every_sub_package_and_the_data_files_without_setuptools_warnings(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp_path), str(REPO)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "absent from the" not in result.stdout + result.stderr  # "… packages configuration"
    (wheel,) = tmp_path.glob("*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for source in [*(REPO / package for package in PACKAGES)]:
        for path in source.rglob("*.py"):
            assert str(path.relative_to(REPO)) in names, f"{path.relative_to(REPO)} missing from the wheel"
    for data in [*(REPO / "analysis/data").iterdir(), *(REPO / "gpu_host/workflows").glob("*.json")]:
        assert str(data.relative_to(REPO)) in names, f"{data.relative_to(REPO)} missing from the wheel"


def test_make_test_lints_and_type_checks_first_and_says_why_tests_skipped() -> None:
    plan = make_plan("-o", ".venv/.installed", "test")
    lines = plan.splitlines()
    ruff_check = lines.index(".venv/bin/ruff check .")
    ruff_format = lines.index(".venv/bin/ruff format --check .")
    mypy = next(index for index, line in enumerate(lines) if line.endswith("/bin/mypy"))
    pytest_line = next(index for index, line in enumerate(lines) if "-m pytest" in line)
    assert ruff_check < ruff_format < mypy < pytest_line and " -rs" in lines[pytest_line]
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert "mypy" in {
        canonicalize_name(Requirement(text).name) for text in project["project"]["optional-dependencies"]["test"]
    }
    assert project["tool"]["mypy"]["packages"]  # `mypy` alone checks the configured packages


def test_make_install_installs_the_lock_hash_checked_with_the_torch_build_asked_for(tmp_path: Path) -> None:
    if shutil.which("make") is None:
        pytest.skip("make is not installed here")
    cpu_index = "https://download.pytorch.org/whl/cpu"
    fresh = f"VENV={tmp_path / 'venv'}"  # no venv yet: no CPU build to keep
    commands, announced = {}, {}
    for name, variables in (
        ("default", [fresh]),
        ("cpu", [fresh, f"TORCH_INDEX={cpu_index}"]),
        ("asked", [fresh, "TORCH=cpu"]),
    ):
        lines = make_plan("-B", "install", *variables).splitlines()
        announced[name] = next(line for line in lines if "torch: the " in line)
        hash_checked = [line for line in lines if "--require-hashes" in line]
        # the locked installer first: it installs the rest
        assert hash_checked[0].endswith("--require-hashes -r requirements/installer.txt"), lines
        commands[name] = hash_checked[1]
        # the project alone, last: its dependencies came from the lock
        assert lines[-2].endswith("-m pip install -q --no-deps --no-build-isolation -e ."), lines
    # the default follows the machine (issue 41): the CUDA build only where an NVIDIA driver is
    # loaded; elsewhere a first `make run` takes the CPU build from PyTorch's CPU index
    if Path("/proc/driver/nvidia/version").exists():
        assert "index-url" not in commands["default"]
        assert commands["default"].endswith("-r requirements/lock.txt -r requirements/torch-cuda.txt")
        assert "the cuda build (an NVIDIA driver is loaded)" in announced["default"]
    else:
        assert f"--extra-index-url {cpu_index}" in commands["default"]
        assert commands["default"].endswith("-r requirements/lock.txt -r requirements/torch-cpu.txt")
        assert "the cpu build (no NVIDIA driver on this machine)" in announced["default"]
    assert "TORCH=cpu given" in announced["asked"]
    assert f"--extra-index-url {cpu_index}" in commands["cpu"]
    assert commands["cpu"].endswith("-r requirements/lock.txt -r requirements/torch-cpu.txt")
    assert "index-url" not in commands["asked"] and commands["asked"].endswith("-r requirements/torch-cpu.txt")


def test_make_lint_runs_ruff_with_the_houses_rules() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    lint = project["tool"]["ruff"]["lint"]
    assert {"E", "F", "W", "I", "B", "UP", "SIM"} <= set(lint["select"])
    # Chinese text's full-width punctuation is not an ambiguous character
    assert {"RUF001", "RUF002", "RUF003"} <= set(lint["ignore"]) or "RUF" not in lint["select"]
    assert "ruff" in {
        canonicalize_name(Requirement(text).name) for text in project["project"]["optional-dependencies"]["test"]
    }
    plan = make_plan("-o", ".venv/.installed", "lint")
    assert [line.split("/")[-1] for line in plan.splitlines()] == ["ruff check .", "ruff format --check ."]
