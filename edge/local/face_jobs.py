"""What runs inside the gateway's face worker processes (endpoint 99, endpoint 4's photo checks).

Each job takes the client's buffered body and Content-Type and does everything CPU-bound
off the gateway's event loop, in the GPU host's order and with its messages: the upload
(1001/1003, `shared.contract.uploads`), decoding (1002/1003/1004, `analysis.image_input`), one
frontal face (1005/1006/1008). Parsing a 2 MB multipart body alone costs ~4-8 ms, too much
for the loop that answers `/monitor`.

The analysis (all but its error, `analysis.errors`) is imported inside the functions: the
gateway's main process imports this module (to name the jobs) and must stay free of
MediaPipe, OpenCV and SciPy. A refusal crosses the process boundary as a `Refusal` value, not
as the `ContractError` itself, whose constructor pickling cannot replay.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from analysis.errors import AnalysisError
from shared.contract import Code, ContractError
from shared.contract.uploads import read_request
from shared.settings import AnalysisSettings

if TYPE_CHECKING:
    import numpy as np

    from analysis.face.landmarks import FaceMeshDetector

# What the vision LLM is shown (gateway.md § Endpoints 4 and 99): enough to judge skin and
# hair, small enough to upload fast.
FEATURES_PHOTO_LONG_SIDE_PX = 1024
FEATURES_PHOTO_JPEG_QUALITY = 90

_detector: FaceMeshDetector | None = None  # one per process: MediaPipe graphs are not thread-safe


@dataclass(frozen=True)
class Refusal:
    """A ContractError on its way back from a worker process."""

    code: int
    message: str

    def error(self) -> ContractError:
        return ContractError(Code(self.code), self.message)


def prepare_worker() -> None:
    """Import what the jobs run and build this process's detector (the worker context's
    `init`, once per process: ~1 s each on 2 cores). Left to the first job, the import of
    `analysis.endpoints` (SciPy, OpenCV) made a worker's first answer, even a 1004 for a
    1×1 PNG, take 1.2 s."""
    global _detector
    if _detector is None:
        import analysis.endpoints  # noqa: F401 (imported for its cost, not a name)
        from analysis.face.landmarks import FaceMeshDetector

        _detector = FaceMeshDetector()


def special_points(body: bytes, content_type: str | None, limits: AnalysisSettings) -> dict[str, Any] | Refusal:
    """Endpoint 99's `data`, or why not."""
    from analysis.endpoints import special_points as points_of

    try:
        rgb = _photo("special-points", body, content_type, limits)
        return points_of(rgb, _loaded_detector(), limits)
    except (ContractError, AnalysisError) as error:
        return _refusal(error)


def features_photo(body: bytes, content_type: str | None, limits: AnalysisSettings) -> bytes | Refusal:
    """The photo endpoint 4 sends to the LLM (upright JPEG, long side ≤ 1024 px, no EXIF)
    once it passed every check of the GPU host; or why not."""
    from analysis.endpoints import frontal_face

    try:
        rgb = _photo("features", body, content_type, limits)
        frontal_face(rgb, _loaded_detector(), limits)
    except (ContractError, AnalysisError) as error:
        return _refusal(error)
    return _jpeg(rgb, FEATURES_PHOTO_LONG_SIDE_PX)


def _refusal(error: ContractError | AnalysisError) -> Refusal:
    """The request's refusal (`shared.contract.uploads`) or the analysis' (its kind's code)."""
    if isinstance(error, AnalysisError):
        error = ContractError.refusing(error.kind, error.message)
    return Refusal(int(error.code), error.message)


def _loaded_detector() -> FaceMeshDetector:
    prepare_worker()
    assert _detector is not None
    return _detector


def _photo(endpoint: str, body: bytes, content_type: str | None, limits: AnalysisSettings) -> np.ndarray:
    """The decoded photo once the fields passed; ContractError, then AnalysisError, in the host's order."""
    from analysis.image_input import decode_image

    return decode_image(read_request(endpoint, body, content_type, limits).image, limits)


def _jpeg(rgb: np.ndarray, long_side_px: int) -> bytes:
    from PIL import Image

    picture = Image.fromarray(rgb)
    picture.thumbnail((long_side_px, long_side_px), Image.Resampling.LANCZOS)  # only ever shrinks
    buffer = io.BytesIO()
    picture.save(buffer, format="JPEG", quality=FEATURES_PHOTO_JPEG_QUALITY)
    return buffer.getvalue()
