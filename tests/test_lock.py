"""The lock (requirements/) against pyproject.toml: every requirement of the application, of
its extras, of its build and of the installer is locked at a version that satisfies it,
exactly and with hashes; the two torch builds are the CPU and the CUDA one; what two files
share is locked alike. A failure here after an edit of pyproject.toml means: run
`make lock` (README, Set-up)."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

REPO = Path(__file__).resolve().parents[1]
LOCKS = REPO / "requirements"
INSTALLER = LOCKS / "installer.txt"
APPLICATION = LOCKS / "lock.txt"
TORCH_BUILDS = {"cpu": LOCKS / "torch-cpu.txt", "cuda": LOCKS / "torch-cuda.txt"}


@dataclass(frozen=True)
class Locked:
    version: Version
    hashes: frozenset[str]


def read_lock(path: Path) -> dict[str, Locked]:
    """Canonical name -> its pin, from a pip-compile requirements file with hashes."""
    locked: dict[str, Locked] = {}
    for line in path.read_text().replace("\\\n", " ").splitlines():
        line = line.partition("#")[0].strip()
        if not line:
            continue
        # An option line (--find-links, --index-url) would carry one machine's pip configuration
        assert not line.startswith("-"), f"{path.name}: {line!r}: the lock names packages only"
        text, *options = line.split()
        requirement = Requirement(text)
        (specifier,) = requirement.specifier
        assert specifier.operator == "==", f"{path.name}: {text} is not pinned exactly"
        hashes = frozenset(option.removeprefix("--hash=") for option in options if option.startswith("--hash=sha256:"))
        assert hashes, f"{path.name}: {text} has no sha256 hash"
        locked[canonicalize_name(requirement.name)] = Locked(Version(specifier.version), hashes)
    return locked


def _requirements(texts: list[str]) -> list[Requirement]:
    """The requirements that apply here (markers evaluated: Python 3.11 on Linux, as the lock)."""
    requirements = [Requirement(text) for text in texts]
    return [requirement for requirement in requirements if requirement.marker is None or requirement.marker.evaluate()]


def _installer_inputs() -> list[str]:
    lines = (line.partition("#")[0].strip() for line in (LOCKS / "installer.in").read_text().splitlines())
    return [line for line in lines if line]


def _unsatisfied(requirements: list[Requirement], locked: dict[str, Locked]) -> list[str]:
    problems = []
    for requirement in requirements:
        pin = locked.get(canonicalize_name(requirement.name))
        if pin is None:
            problems.append(f"{requirement} is not in the lock")
        elif not requirement.specifier.contains(pin.version, prereleases=True):
            problems.append(f"{requirement} is locked at {pin.version}")
    return problems


PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
EXTRAS = PROJECT["project"]["optional-dependencies"]


def test_every_requirement_of_the_application_and_its_tests_is_locked_at_a_version_it_allows() -> None:
    problems = _unsatisfied(
        _requirements([*PROJECT["project"]["dependencies"], *EXTRAS["test"]]), read_lock(APPLICATION)
    )
    assert not problems, "requirements/lock.txt is behind pyproject.toml (run `make lock`):\n" + "\n".join(problems)


def test_the_installer_and_the_build_backend_are_locked_at_versions_the_build_allows() -> None:
    requirements = _requirements([*PROJECT["build-system"]["requires"], *_installer_inputs()])
    problems = _unsatisfied(requirements, read_lock(INSTALLER))
    assert not problems, "requirements/installer.txt is behind (run `make lock`):\n" + "\n".join(problems)
    assert {"pip", "setuptools"} <= set(read_lock(INSTALLER))


@pytest.mark.parametrize("build", sorted(TORCH_BUILDS))
def test_each_torch_build_locks_the_gpu_extra(build: str) -> None:
    problems = _unsatisfied(_requirements(EXTRAS["gpu"]), read_lock(TORCH_BUILDS[build]))
    behind = f"{TORCH_BUILDS[build].name} is behind pyproject.toml (run `make lock`):"
    assert not problems, "\n".join([behind, *problems])


def test_every_extra_is_locked_somewhere() -> None:
    # A new extra would need its own place in the lock and in `make install`
    assert set(EXTRAS) == {"gpu", "test"}


def test_the_torch_builds_are_the_cpu_wheel_and_pypis_cuda_build() -> None:
    cpu, cuda = read_lock(TORCH_BUILDS["cpu"]), read_lock(TORCH_BUILDS["cuda"])
    assert cpu["torch"].version.local == "cpu"
    # The CUDA compile must not see the `+cpu` wheel (on find-links it matches `==2.13.0` too)
    assert cuda["torch"].version.local is None
    assert not cpu["torch"].hashes & cuda["torch"].hashes
    assert any(name.startswith("nvidia-") for name in cuda)  # the CUDA libraries it brings
    assert not any(name.startswith("nvidia-") for name in cpu)


@pytest.mark.parametrize("build", sorted(TORCH_BUILDS))
def test_what_the_files_of_one_install_share_is_locked_alike(build: str) -> None:
    # `make install` installs these into one venv: one version and one hash set per package
    files = [INSTALLER, APPLICATION, TORCH_BUILDS[build]]
    for index, first in enumerate(files):
        for second in files[index + 1 :]:
            one, other = read_lock(first), read_lock(second)
            differing = sorted(name for name in one.keys() & other.keys() if one[name] != other[name])
            assert not differing, f"{first.name} and {second.name} differ on {differing} (run `make lock`)"
    assert "torch" not in read_lock(APPLICATION)
