"""The stateful models of one model process, built once and injected into the analysis.

Importing this module loads neither torch nor MediaPipe: the GPU host's web process imports
the analysis package and must stay free of both; `load_models` imports them when called.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .landmarks import FaceMeshDetector
from .types import HairSegmenter

CPU = "cpu"
CUDA = "cuda:0"


class ModelLoadError(Exception):
    """The models cannot be loaded; the message says why (the GPU host shows it in /health)."""


@dataclass
class Models:
    """The detector and the segmenter of one model process; `close()` releases both."""

    detector: FaceMeshDetector
    segmenter: HairSegmenter
    device: str  # "cpu" or "cuda:0"

    def close(self) -> None:
        self.detector.close()
        self.segmenter.close()


def resolve_device(device: str) -> str:
    """"auto" -> cuda:0 when torch sees a GPU, else cpu; "cuda" -> cuda:0 (which must exist)."""
    if device == CPU:
        return CPU
    try:
        import torch  # lazy: see the module docstring
    except ImportError:
        raise ModelLoadError("torch is not installed: BiSeNet needs the [gpu] extra") from None
    if device == "auto":
        return CUDA if torch.cuda.is_available() else CPU
    if device in ("cuda", CUDA):
        if not torch.cuda.is_available():
            raise ModelLoadError(f"device {device!r} requested but torch sees no CUDA GPU")
        return CUDA
    raise ModelLoadError(f"unknown device {device!r}: expected auto, cpu or cuda")


def load_models(bisenet_weights: str, device: str = "auto") -> Models:
    """The detector and the segmenter: BiSeNet when weights are named, else the fallback.

    `Models.device` is where the segmenter runs: the fallback (MediaPipe + OpenCV) always
    runs on the CPU, so it never needs torch.
    """
    if bisenet_weights:
        resolved = resolve_device(device)
        segmenter = _load_bisenet(Path(bisenet_weights), resolved)
    else:
        from .segmentation import FallbackSegmenter  # another module's model: built only when used

        resolved, segmenter = CPU, FallbackSegmenter()
    return Models(detector=FaceMeshDetector(), segmenter=segmenter, device=resolved)


def _load_bisenet(path: Path, device: str) -> HairSegmenter:
    if not path.is_file():
        raise ModelLoadError(f"BiSeNet weights file not found: {path}")
    from .bisenet import BisenetSegmenter

    try:
        return BisenetSegmenter(path, device)
    except Exception as error:  # unpickling, wrong keys/shapes, CUDA: all mean "not loadable"
        raise ModelLoadError(f"BiSeNet weights {path} cannot be loaded: {type(error).__name__}: {error}") from error
