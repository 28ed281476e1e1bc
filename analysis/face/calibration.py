"""Pixel -> millimetre scale from the iris, and how far to trust it.

The horizontal visible iris diameter is nearly constant across adults (11.71 ± 0.42 mm), so
it is the ruler in every photo. Only the horizontal pair of each iris ring is used: the
eyelids hide the top and bottom of the iris. Precision scales with the size of the face in
the photo, not with the photo: ±1 px on an 8 px iris is ±12 %.
"""

from __future__ import annotations

import math

import numpy as np

from ..types import Calibration, Face

IRIS_DIAMETER_MM = 11.7
# Population spread of the horizontal visible iris diameter: 11.71 ± 0.42 mm.
POPULATION_RELATIVE_SPREAD = 0.42 / 11.71
MEASUREMENT_ERROR_PX = 1.0
# Below this the ±1 px measurement error dominates; callers add a note (analysis.md).
SMALL_IRIS_PX = 20.0

# Horizontal ends of each iris ring (image-left eye 469/471, image-right eye 474/476).
LEFT_IRIS_HORIZONTAL = (469, 471)
RIGHT_IRIS_HORIZONTAL = (474, 476)


def calibrate(face: Face, iris_diameter_mm: float = IRIS_DIAMETER_MM) -> Calibration:
    """mm per pixel from the mean horizontal iris diameter of both eyes."""
    left = _horizontal_diameter(face, LEFT_IRIS_HORIZONTAL)
    right = _horizontal_diameter(face, RIGHT_IRIS_HORIZONTAL)
    mean = (left + right) / 2.0
    if not mean > 0.0:
        raise ValueError(f"iris diameters {left:.2f}/{right:.2f} px: the landmarks are degenerate")
    return Calibration(
        iris_diameter_px=mean,
        mm_per_px=iris_diameter_mm / mean,
        relative_uncertainty=relative_uncertainty(left, right),
        left_iris_px=left,
        right_iris_px=right,
    )


def relative_uncertainty(left_px: float, right_px: float) -> float:
    """Independent error sources added in quadrature: population spread, ±1 px, left/right disagreement."""
    mean = (left_px + right_px) / 2.0
    measurement = MEASUREMENT_ERROR_PX / mean
    disagreement = abs(left_px - right_px) / (2.0 * mean)
    return math.sqrt(POPULATION_RELATIVE_SPREAD**2 + measurement**2 + disagreement**2)


def _horizontal_diameter(face: Face, ends: tuple[int, int]) -> float:
    # 2-D distance: stays right when the head rolls, and MediaPipe's iris depth is not
    # reliable enough to correct for yaw (≤ 3.5 % at the 15° limit).
    first, second = face.points[list(ends)]
    return float(np.hypot(*(first - second)))
