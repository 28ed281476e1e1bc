"""Millimetres from landmarks and the hairline: the `measurements` and `assessment` objects
of contract.md endpoint 1.

Vertical lengths are measured along the facial midline (`FaceFrame.up`), so a rolled head
does not shorten them. A missing hairline nulls exactly what contract.md says and keeps
the middle and lower thirds. The forehead is classed against the reference ranges in
`AnalysisSettings` only when the number deserves it (see `forehead_class`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from shared.settings import AnalysisSettings

from ..face.calibration import SMALL_IRIS_PX
from ..frame import FaceFrame
from ..types import Calibration, Face, Gender, Hairline, LandmarkId
from .checks import NOTE_FRINGE

NOTE_SMALL_IRIS = "脸部在照片中较小（虹膜约 {px:.0f} px，建议 ≥ 20 px）：毫米换算精度较低，请靠近拍摄"
NOTE_GENDER = "未提供性别：男女额头参考范围不同，本次额头高度未作评估"
NOTE_BORDERLINE = "额头高度 {mm:.1f} mm 介于正常与偏高之间"


def measure_face(
    face: Face, hairline: Hairline, calibration: Calibration, gender: Gender, limits: AnalysisSettings
) -> dict[str, Any]:
    """{"measurements": {...}, "assessment": {...}} exactly as in contract.md endpoint 1."""
    frame = FaceFrame.from_face(face)
    mm = calibration.mm_per_px
    height = lambda point: float(frame.to_frame(np.asarray(point))[0, 1])  # noqa: E731  (px up the midline)
    glabella, subnasale, menton = (
        height(face.points[i]) for i in (LandmarkId.GLABELLA, LandmarkId.SUBNASALE, LandmarkId.MENTON)
    )
    middle = (glabella - subnasale) * mm
    lower = (subnasale - menton) * mm
    measurements: dict[str, Any] = {
        "forehead_height_mm": None,
        "upper_third_mm": None,
        "middle_third_mm": _mm(middle),
        "lower_third_mm": _mm(lower),
        "thirds_ratio": None,
        "hairline_width_mm": None,
        "temple_recession_mm": None,
    }
    notes = list(hairline.notes)
    if hairline.status in ("ok", "uncertain") and hairline.trichion is not None:
        trichion = height(hairline.trichion)
        upper = (trichion - glabella) * mm
        total = upper + middle + lower
        measurements.update(
            forehead_height_mm=_mm(upper),
            upper_third_mm=_mm(upper),
            thirds_ratio=[round(part / total, 2) for part in (upper, middle, lower)],
            hairline_width_mm=_width(hairline, mm),
            temple_recession_mm=_recession(hairline, trichion, height, mm),
        )
    forehead = forehead_class(measurements["forehead_height_mm"], hairline, gender, limits, notes)
    if calibration.iris_diameter_px < SMALL_IRIS_PX:
        notes.append(NOTE_SMALL_IRIS.format(px=calibration.iris_diameter_px))
    return {"measurements": measurements, "assessment": {"forehead": forehead, "notes": notes}}


def forehead_class(
    forehead_mm: float | None, hairline: Hairline, gender: Gender, limits: AnalysisSettings, notes: list[str]
) -> str | None:
    """normal | high | low, or None when the number cannot carry a verdict.

    None for: no number; a fringe (its edge is not the hairline); an `uncertain` band that
    straddles two classes; gender unknown and the male and female ranges disagree. Male
    values between the normal range and the "high" threshold are `normal` with a note.
    """
    if forehead_mm is None or NOTE_FRINGE in hairline.notes:
        return None
    genders: tuple[Gender, ...] = ("female", "male") if gender == "unknown" else (gender,)
    if len({_class(forehead_mm, g, limits) for g in genders}) > 1:
        notes.append(NOTE_GENDER)
        return None
    band = (hairline.uncertainty_mm or 0.0) if hairline.status == "uncertain" else 0.0
    classes = {_class(value, g, limits) for g in genders for value in (forehead_mm - band, forehead_mm + band)}
    if len(classes) > 1:
        return None
    verdict = classes.pop()
    if gender == "male" and verdict == "normal" and forehead_mm > limits.male_forehead_normal_mm[1]:
        notes.append(NOTE_BORDERLINE.format(mm=forehead_mm))
    return verdict


def _class(forehead_mm: float, gender: Gender, limits: AnalysisSettings) -> str:
    if gender == "female":
        low, _ = limits.female_forehead_normal_mm
        high_above = limits.female_forehead_high_above_mm
    else:
        low, _ = limits.male_forehead_normal_mm
        high_above = limits.male_forehead_high_above_mm
    if forehead_mm < low:
        return "low"
    return "high" if forehead_mm > high_above else "normal"


def _width(hairline: Hairline, mm: float) -> float | None:
    if hairline.left_temple is None or hairline.right_temple is None:
        return None
    return _mm(float(np.hypot(*np.subtract(hairline.right_temple, hairline.left_temple))) * mm)


def _recession(hairline: Hairline, trichion: float, height: Any, mm: float) -> dict[str, float | None]:
    """How far each temple point sits above the trichion level; 0 when it sits lower (a
    rounded hairline has no recession)."""

    def side(point: tuple[float, float] | None) -> float | None:
        return None if point is None else _mm(max(0.0, (height(point) - trichion) * mm))

    return {"left": side(hairline.left_temple), "right": side(hairline.right_temple)}


def _mm(value: float) -> float:
    return round(float(value), 1)
