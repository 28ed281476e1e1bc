"""What kind of failure an exception in the model child is (gateway.md § Failure kinds), and
the test switch that makes a CPU-only child raise the CUDA ones.

Runs in the model child: `classify` reads an exception by its type and text, as torch
raises it, without importing torch (a host without torch still classifies, and the web
process never imports it). The gateway acts on the kind: a corrupted CUDA context takes the
host out, an out-of-memory backs it off, a photo the model cannot take is never retried.

`raise_simulated` is the test switch (`gpu_host.simulated_failures_file`): each inference
takes the first line of that file (and removes it) and raises what a GPU would raise for
that kind — torch's own exception classes where torch is installed — so that the real
classification and the real answers run on a machine with no GPU. Nothing is patched.
Two lines act out a process's death instead: `exit` (the child dies mid-inference, as a
segfault in a driver does) and `load_fail` (taken by the next load, `fail_load_if_simulated`:
the child dies while loading its models, so the host is not ready for a while).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from shared.contract import (
    DEFAULT_MESSAGES,
    MSG_CUDA_ERROR,
    MSG_CUDA_OOM,
    Code,
    ContractError,
    ErrorType,
)

# torch's texts (c10/cuda/CUDAException.h, CUDACachingAllocator.cpp); cuDNN and cuBLAS name
# their own status codes; a device-side assert and an illegal address poison the context.
_CUDA_ERROR_MARKS = (
    "cuda error",
    "cudnn_status_",
    "cublas_status_",
    "cusolver_status_",
    "device-side assert",
    "illegal memory access",
    "illegal instruction",
    "cuda driver",
    "cuda runtime",
)
_OOM_TYPE_NAMES = frozenset({"OutOfMemoryError"})  # torch.OutOfMemoryError (torch.cuda.OutOfMemoryError)
_CUDA_ERROR_TYPE_NAMES = frozenset({"AcceleratorError", "CudaError"})  # torch >= 2.8, cupy-style
_SLEEP_PREFIX = "sleep:"
_EXIT, _LOAD_FAIL = "exit", "load_fail"
_SIMULATED_EXIT_CODE = 70  # EX_SOFTWARE: a child that died on purpose, in the host's log


def classify(error: BaseException) -> ErrorType:
    """The kind of an exception the analysis raised (its refusals, `AnalysisError`, are not asked here)."""
    name, text = type(error).__name__, str(error).lower()
    if name in _OOM_TYPE_NAMES or ("out of memory" in text and "cuda" in text):
        return ErrorType.CUDA_OOM
    if name in _CUDA_ERROR_TYPE_NAMES or any(mark in text for mark in _CUDA_ERROR_MARKS):
        return ErrorType.CUDA_ERROR
    if _is_undecodable_image(error):
        return ErrorType.INPUT_REJECTED
    return ErrorType.INTERNAL


def as_contract_error(error: BaseException) -> ContractError:
    """The answer for an exception the analysis raised: its kind, a message a client can
    act on, and the code — 1002 for a photo the decoder cannot read, else 1007."""
    kind = classify(error)
    if kind is ErrorType.INPUT_REJECTED:
        return ContractError(Code.UNSUPPORTED_IMAGE, error_type=kind)
    message = {ErrorType.CUDA_OOM: MSG_CUDA_OOM, ErrorType.CUDA_ERROR: MSG_CUDA_ERROR}.get(
        kind, DEFAULT_MESSAGES[Code.SYSTEM_ERROR]
    )
    return ContractError(Code.SYSTEM_ERROR, message, error_type=kind)


def _is_undecodable_image(error: BaseException) -> bool:
    # PIL's own errors for a file it cannot read (the host's checks passed its header)
    try:
        from PIL import Image, UnidentifiedImageError
    except ImportError:  # pragma: no cover - PIL is a dependency of the host
        return False
    return isinstance(error, (UnidentifiedImageError, Image.DecompressionBombError))


# -- the test switch -----------------------------------------------------------------------


def raise_simulated(switch_file: str) -> None:
    """Take the next line of `switch_file` (if any) and act it out: a kind's exception, or
    `sleep:<seconds>` (a slow inference, for the host's deadline). Empty path or no line: nothing."""
    line = _take_first_line(Path(switch_file)) if switch_file else None
    if not line:
        return
    if line == _EXIT:
        os._exit(_SIMULATED_EXIT_CODE)
    if line.startswith(_SLEEP_PREFIX):
        time.sleep(float(line.removeprefix(_SLEEP_PREFIX)))
        return
    raise simulated_exception(ErrorType(line))


def fail_load_if_simulated(switch_file: str) -> None:
    """At a load: when the switch's next line is `load_fail`, take it and die (the host's
    supervisor restarts the child after a backoff); any other line is left for an inference."""
    path = Path(switch_file) if switch_file else None
    if path is None or _first_line(path) != _LOAD_FAIL:
        return
    _take_first_line(path)
    os._exit(_SIMULATED_EXIT_CODE)


def simulated_exception(kind: ErrorType) -> BaseException:
    """What a GPU (or the decoder) raises for `kind`: torch's classes where torch is installed."""
    torch_errors = _torch_errors()
    if kind is ErrorType.CUDA_OOM:
        oom = torch_errors[0] if torch_errors else RuntimeError
        return oom("CUDA out of memory. Tried to allocate 2.00 GiB (simulated by gpu_host.simulated_failures_file)")
    if kind is ErrorType.CUDA_ERROR:
        cuda = torch_errors[1] if torch_errors else RuntimeError
        return cuda("CUDA error: an illegal memory access was encountered (simulated)")
    if kind is ErrorType.INPUT_REJECTED:
        from PIL import UnidentifiedImageError

        return UnidentifiedImageError("cannot identify image file (simulated)")
    return RuntimeError(f"simulated {kind.value} failure")


def _torch_errors() -> tuple[type[Exception], type[Exception]] | None:
    """torch's out-of-memory and CUDA error classes, when torch is installed (the child may import it)."""
    try:
        import torch
    except ImportError:
        return None
    cuda_error = getattr(torch, "AcceleratorError", RuntimeError)  # torch >= 2.8
    return torch.cuda.OutOfMemoryError, cuda_error


def _first_line(path: Path) -> str | None:
    try:
        return next((line.strip() for line in path.read_text().splitlines() if line.strip()), None)
    except FileNotFoundError:
        return None


def _take_first_line(path: Path) -> str | None:
    """Remove and return the first non-blank line of `path` (None: no file, or nothing left).
    Rewritten atomically, so a test that appends meanwhile loses nothing it wrote before."""
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return None
    while lines and not lines[0].strip():
        lines.pop(0)
    if not lines:
        return None
    first, rest = lines[0].strip(), lines[1:]
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text("".join(f"{line}\n" for line in rest))
    os.replace(temporary, path)
    return first
