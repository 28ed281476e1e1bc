"""The data that flows between the analysis stages. Coordinates are pixels of the
orientation-corrected input image, origin top-left, x to the right, y down."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Protocol

import numpy as np

HairlineStatus = Literal["ok", "uncertain", "no_hairline", "occluded"]
HairlineShape = Literal["straight", "rounded", "m_shape", "widows_peak", "receding"]
Gender = Literal["male", "female", "unknown"]
Plan = Literal["conservative", "standard", "aggressive"]
Style = Literal["straight", "rounded", "m_shape", "widows_peak"]
SegmenterName = Literal["hairnet", "bisenet", "fallback"]
# a head crop as (x0, y0, x1, y1, scale): `HeadCrop.key`
CropKey = tuple[int, int, int, int, float]

PLANS: tuple[Plan, ...] = ("conservative", "standard", "aggressive")
STYLES: tuple[Style, ...] = ("straight", "rounded", "m_shape", "widows_peak")


class LandmarkId:
    """MediaPipe face-mesh indices (analysis.md § Landmarks); image-left first."""

    MESH_TOP = 10  # top of the mesh: NOT the hairline (sits on a bald forehead)
    GLABELLA = 8
    NASION = 168
    NOSE_TIP = 1
    SUBNASALE = 2
    MENTON = 152
    OUTER_EYE_CORNERS = (33, 263)
    INNER_EYE_CORNERS = (133, 362)
    LEFT_BROW_UPPER = (70, 63, 105, 66, 107)
    RIGHT_BROW_UPPER = (300, 293, 334, 296, 336)
    IRIS_CENTERS = (468, 473)
    LEFT_IRIS_RING = (469, 470, 471, 472)
    RIGHT_IRIS_RING = (474, 475, 476, 477)
    UPPER_LATERAL_FOREHEAD = (54, 284)
    # midline points used to fit the facial midline, top to bottom
    MIDLINE = (10, 151, 9, 8, 168, 6, 197, 195, 5, 4, 1, 2, 164, 0, 17, 18, 200, 199, 175, 152)


@dataclass(frozen=True)
class Face:
    """One detected face: 478 landmarks in pixels (z scaled like x)."""

    landmarks: np.ndarray  # float64 (478, 3)
    image_width: int
    image_height: int

    @property
    def points(self) -> np.ndarray:
        """(478, 2) x, y in pixels."""
        return self.landmarks[:, :2]

    @property
    def bbox(self) -> tuple[int, int, int, int]:
        """x, y, w, h of the landmarks' bounding box, clipped to the image."""
        lo = np.clip(self.points.min(axis=0), 0, [self.image_width - 1, self.image_height - 1])
        hi = np.clip(self.points.max(axis=0), 0, [self.image_width - 1, self.image_height - 1])
        return int(lo[0]), int(lo[1]), int(hi[0] - lo[0]), int(hi[1] - lo[1])


@dataclass(frozen=True)
class Pose:
    yaw_degrees: float
    pitch_degrees: float
    roll_degrees: float


@dataclass(frozen=True)
class Calibration:
    """Scale from the horizontal iris diameter (11.7 mm)."""

    iris_diameter_px: float  # mean of both eyes
    mm_per_px: float
    relative_uncertainty: float  # e.g. 0.05 for ±5 %
    left_iris_px: float
    right_iris_px: float


@dataclass(frozen=True)
class Hairline:
    """The traced frontal hairline and how far to trust it (contract.md endpoint 1).

    For `no_hairline` and `occluded`, points/trichion/shape/uncertainty are None.
    """

    status: HairlineStatus
    points: np.ndarray | None = None  # (N, 2) lower edge of the hair, left to right
    trichion: tuple[float, float] | None = None
    shape: HairlineShape | None = None
    uncertainty_mm: float | None = None
    left_temple: tuple[float, float] | None = None  # frontotemporal points (on the canthal lines)
    right_temple: tuple[float, float] | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)


@dataclass(frozen=True)
class HairSegmentation:
    """What a hair segmenter saw, as boolean masks of the input's size."""

    segmenter: SegmenterName
    hair: np.ndarray  # bool (H, W)
    person: np.ndarray  # bool (H, W): head and body; its top outline is the head outline
    hat: np.ndarray | None = None  # bool (H, W) where the segmenter can tell (BiSeNet label 18)
    # the head crop at working scale, where the segmenter cut one (the fallback), keyed by
    # `HeadCrop.key`: the hairline takes it instead of resizing the photo's head again
    # (12 ms at 12 MP; `HeadCrop.cut_reusing`)
    work: tuple[CropKey, np.ndarray] | None = None
    # the hair network's probability in that working frame (float32), where a network gave
    # one: the bare-scalp test weighs it with colour and texture (`scalp`)
    probability: tuple[CropKey, np.ndarray] | None = None
    # the segmenter saw bare scalp where hair would be (`scalp`, or the hair network's ring
    # with the forehead's skin running up into it): its empty mask means bald, not "unseen"
    scalp_seen: bool = False


class HairSegmenter(Protocol):
    """One interface, three implementations: the hair network (default), BiSeNet (weights
    from settings) and the fallback."""

    @property
    def name(self) -> SegmenterName: ...

    def segment(self, rgb: np.ndarray, face: Face) -> HairSegmentation: ...

    def close(self) -> None: ...
