"""The stateful models of one model process, built once and injected into the analysis.

Importing this module loads neither torch nor MediaPipe: the GPU host's web process imports
the analysis package and must stay free of both; `load_models` imports them when called.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .face.landmarks import FaceMeshDetector
from .types import HairSegmenter

CPU = "cpu"
CUDA = "cuda:0"

log = logging.getLogger("analysis.models")


class ModelLoadError(Exception):
    """The models cannot be loaded; the message says why (the GPU host shows it in /health)."""


@dataclass
class Models:
    """The detector and the segmenter of one model process; `close()` releases both."""

    detector: FaceMeshDetector
    segmenter: HairSegmenter
    device: str  # where the segmenter runs: "cpu" or "cuda:0"

    def close(self) -> None:
        self.detector.close()
        self.segmenter.close()


def resolve_device(device: str) -> str:
    """ "auto" -> cuda:0 when torch sees a GPU, else cpu; "cuda" -> cuda:0 (which must exist)."""
    if device == CPU:
        return CPU
    try:
        import torch  # lazy: see the module docstring
    except ImportError:
        raise ModelLoadError("torch is not installed: the hair network and BiSeNet need the [gpu] extra") from None
    if device == "auto":
        return CUDA if torch.cuda.is_available() else CPU
    if device in ("cuda", CUDA):
        if not torch.cuda.is_available():
            raise ModelLoadError(f"device {device!r} requested but torch sees no CUDA GPU")
        return CUDA
    raise ModelLoadError(f"unknown device {device!r}: expected auto, cpu or cuda")


def load_models(bisenet_weights: str, device: str = "auto") -> Models:
    """The detector and the segmenter: BiSeNet when weights are named (they must load);
    otherwise the bundled hair network (torch, CUDA when there is one); the fallback
    (MediaPipe + OpenCV, always on the CPU) only when the network cannot run here. A
    network has run once on a blank input (`warm_up`): its first run's allocations and
    kernel choice (~0.2 s on a CPU, CUDA's start more) are the load's, not the first
    photo's, and CUDA trouble shows at the load, as the other reasons a network cannot run.
    """
    if bisenet_weights:
        resolved = resolve_device(device)
        segmenter = _load_bisenet(Path(bisenet_weights), resolved)
    else:
        resolved, segmenter = _load_hairnet(device)
    from .face.head_samples import to_lab  # OpenCV: lazy, see the module docstring

    to_lab(np.zeros((8, 8, 3), np.uint8))  # OpenCV builds its Lab tables at the first conversion (~0.1 s)
    return Models(detector=FaceMeshDetector(), segmenter=segmenter, device=resolved)


def _load_hairnet(device: str) -> tuple[str, HairSegmenter]:
    """(device, segmenter): the hair network, or the fallback with the reason logged."""
    try:
        resolved = resolve_device(device)
        from .segmentation.hairnet import HairNetSegmenter  # torch: imported only when a segmenter is built

        segmenter = HairNetSegmenter(resolved)
        segmenter.warm_up()
        return resolved, segmenter
    except Exception as error:  # no torch, a damaged data file, CUDA trouble: all mean "cannot run"
        if isinstance(error, ModelLoadError) and device not in ("auto", CPU):
            raise  # a device the operator asked for and the host lacks: say so, do not hide it
        log.warning("hair network unavailable, using the fallback segmenter: %s: %s", type(error).__name__, error)
        from .segmentation.fallback import FallbackSegmenter  # another module's model: built only when used

        return CPU, FallbackSegmenter()


def _load_bisenet(path: Path, device: str) -> HairSegmenter:
    if not path.is_file():
        raise ModelLoadError(f"BiSeNet weights file not found: {path}")
    from .segmentation.bisenet import BisenetSegmenter

    try:
        segmenter = BisenetSegmenter(path, device)
        segmenter.warm_up()
        return segmenter
    except Exception as error:  # unpickling, wrong keys/shapes, CUDA: all mean "not loadable"
        raise ModelLoadError(f"BiSeNet weights {path} cannot be loaded: {type(error).__name__}: {error}") from error
