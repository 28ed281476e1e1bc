"""Hairline designs: growth plans (endpoint 2), the user's mark (3), the four styles (5)
and the inpainting mask for generation.

All geometry is done in the face's midline frame (`FaceFrame`): `v` is the height above
the glabella along the facial midline, `u` the signed distance across it (image-right
positive), both in pixels. Heights in mm go through the iris calibration.

Choices where analysis.md is silent (docs/analysis_cli.md repeats them):
- gender `unknown`: the standard height follows the rule of facial thirds (upper third =
  middle third, glabella -> subnasale), clamped to 60-80 mm (between the female and male
  standards); conservative / aggressive are 5 mm above / below it.
- the frontotemporal points lie on the lateral canthal lines (through 33 / 263) at
  `TEMPLE_RISE` x the design height above the design trichion; every style passes through
  them and through the design trichion on the midline.
- a design is never above the current hairline: plans take the lower of the design curve
  and the detected hairline at every point; the drop is measured at the trichion.
- no usable hairline (`no_hairline`, `occluded`): designs come from the face geometry
  alone (heights above the glabella) and the drop is None: the top of the mesh is not a
  hairline, so no honest drop can be computed.
- plans use the detected shape when it is one of the four styles, else `rounded`.
"""

from __future__ import annotations

from dataclasses import dataclass

import cv2
import numpy as np
from scipy.interpolate import PchipInterpolator

from ..frame import FaceFrame
from ..types import STYLES, Calibration, Face, Gender, Hairline, LandmarkId, Plan, Style

# Target trichion height above the glabella, mm (analysis.md § Designs).
PLAN_TARGETS_MM: dict[str, dict[str, float]] = {
    "male": {"conservative": 85.0, "standard": 80.0, "aggressive": 75.0},
    "female": {"conservative": 65.0, "standard": 60.0, "aggressive": 55.0},
}
UNKNOWN_STANDARD_RANGE_MM = (60.0, 80.0)
UNKNOWN_PLAN_OFFSET_MM = {"conservative": 5.0, "standard": 0.0, "aggressive": -5.0}
TEMPLE_RISE = 0.15  # frontotemporal points sit this fraction of the design height above the trichion
MASK_DILATION_MM = 3.0
CURVE_SAMPLES = 61

# Style profiles: (t, k) control points for t in [0, 1] (midline -> canthal line), mirrored
# for the other side; height = trichion + k * temple rise. PCHIP keeps them smooth (C1)
# without overshooting the control points.
_STYLE_PROFILES: dict[str, tuple[tuple[float, float], ...]] = {
    "straight": ((0.0, 0.0), (0.5, 0.04), (0.85, 0.25), (1.0, 1.0)),
    "rounded": ((0.0, 0.0), (0.5, 0.25), (1.0, 1.0)),
    "m_shape": ((0.0, 0.0), (0.3, 0.15), (0.6, 0.9), (0.8, 1.25), (1.0, 1.0)),
    "widows_peak": ((0.0, 0.0), (0.12, 0.35), (0.5, 0.45), (1.0, 1.0)),
}


@dataclass(frozen=True)
class Design:
    """One designed hairline: a polyline in image px, left to right."""

    name: str
    points: np.ndarray  # (N, 2)
    drop_mm: float | None  # how far the trichion moves down; None without a current hairline


def has_hairline(hairline: Hairline) -> bool:
    return hairline.status in ("ok", "uncertain") and hairline.points is not None and len(hairline.points) >= 2


def middle_third_mm(face: Face, frame: FaceFrame, calibration: Calibration) -> float:
    glabella, subnasale = frame.to_frame(face.points[[LandmarkId.GLABELLA, LandmarkId.SUBNASALE]])
    return float((glabella[1] - subnasale[1]) * calibration.mm_per_px)


def plan_target_mm(plan: Plan, gender: Gender, middle_third: float) -> float:
    """Target trichion height above the glabella for a plan (see the module docstring)."""
    if gender in PLAN_TARGETS_MM:
        return PLAN_TARGETS_MM[gender][plan]
    standard = float(np.clip(middle_third, *UNKNOWN_STANDARD_RANGE_MM))
    return standard + UNKNOWN_PLAN_OFFSET_MM[plan]


def current_heights(hairline: Hairline, frame: FaceFrame, u: np.ndarray) -> np.ndarray:
    """Height (v, px) of the detected hairline at each u; flat beyond its ends."""
    if hairline.points is None:
        raise ValueError("the hairline has no points (check has_hairline first)")
    uv = frame.to_frame(hairline.points)
    order = np.argsort(uv[:, 0])
    return np.interp(u, uv[order, 0], uv[order, 1])


def current_trichion_v(hairline: Hairline, frame: FaceFrame) -> float:
    if hairline.trichion is not None:
        return float(frame.to_frame(np.asarray(hairline.trichion))[0, 1])
    return float(current_heights(hairline, frame, np.zeros(1))[0])


def canthal_u(face: Face, frame: FaceFrame) -> tuple[float, float]:
    """u of the lateral canthal lines (through landmarks 33 and 263), image-left first."""
    left, right = frame.to_frame(face.points[list(LandmarkId.OUTER_EYE_CORNERS)])[:, 0]
    return (float(min(left, right)), float(max(left, right)))


def style_curve(style: Style, frame: FaceFrame, canthal: tuple[float, float], trichion_v: float) -> np.ndarray:
    """(N, 2) image px: the style's curve through the design trichion on the midline and
    the frontotemporal points on the canthal lines."""
    ts, ks = zip(*_STYLE_PROFILES[style], strict=True)
    profile = PchipInterpolator(np.concatenate([-np.array(ts[:0:-1]), ts]), np.concatenate([ks[:0:-1], ks]))
    t = np.linspace(-1.0, 1.0, CURVE_SAMPLES)
    u = np.where(t < 0, -t * canthal[0], t * canthal[1])  # piecewise: the midline need not be centred
    v = trichion_v + TEMPLE_RISE * trichion_v * profile(t)
    return frame.to_image(np.stack([u, v], axis=1))


def frontotemporal_points(frame: FaceFrame, canthal: tuple[float, float], trichion_v: float) -> np.ndarray:
    """(2, 2) image px, image-left first: where every style meets the canthal lines."""
    v = trichion_v * (1 + TEMPLE_RISE)
    return frame.to_image(np.array([[canthal[0], v], [canthal[1], v]]))


def _placed_trichion(
    target_mm: float, hairline: Hairline, frame: FaceFrame, calibration: Calibration
) -> tuple[float, float | None]:
    """The design trichion's height (v, px), capped at the current one, and the drop (mm)
    from the current trichion to it: None without a detected hairline, else >= 0."""
    target_v = target_mm / calibration.mm_per_px
    if not has_hairline(hairline):
        return target_v, None
    current_v = current_trichion_v(hairline, frame)
    design_v = min(target_v, current_v)
    return design_v, (current_v - design_v) * calibration.mm_per_px


def _never_above(points: np.ndarray, hairline: Hairline, frame: FaceFrame) -> np.ndarray:
    uv = frame.to_frame(points)
    uv[:, 1] = np.minimum(uv[:, 1], current_heights(hairline, frame, uv[:, 0]))
    return frame.to_image(uv)


def plan_design(plan: Plan, face: Face, hairline: Hairline, calibration: Calibration, gender: Gender) -> Design:
    """A growth plan: the style at the plan's target height, never above the current hairline."""
    frame = FaceFrame.from_face(face)
    target_mm = plan_target_mm(plan, gender, middle_third_mm(face, frame, calibration))
    trichion_v, drop_mm = _placed_trichion(target_mm, hairline, frame, calibration)
    style: Style = hairline.shape if hairline.shape in STYLES else "rounded"
    points = style_curve(style, frame, canthal_u(face, frame), trichion_v)
    if drop_mm is not None:
        points = _never_above(points, hairline, frame)
    return Design(plan, points, drop_mm)


def plan_designs(
    plans: list[Plan], face: Face, hairline: Hairline, calibration: Calibration, gender: Gender
) -> list[Design]:
    return [plan_design(plan, face, hairline, calibration, gender) for plan in plans]


def style_design(style: Style, face: Face, hairline: Hairline, calibration: Calibration, gender: Gender) -> Design:
    """A style at the `standard` plan's height, never above the current trichion (the
    candidate shape itself is drawn whole: it is a proposal, not a plan)."""
    frame = FaceFrame.from_face(face)
    target_mm = plan_target_mm("standard", gender, middle_third_mm(face, frame, calibration))
    trichion_v, drop_mm = _placed_trichion(target_mm, hairline, frame, calibration)
    return Design(style, style_curve(style, frame, canthal_u(face, frame), trichion_v), drop_mm)


def lowered_hairline(face: Face, hairline: Hairline, calibration: Calibration, drop_mm: float) -> Design:
    """The detected hairline moved down the midline by `drop_mm` (endpoint 3)."""
    if not has_hairline(hairline):
        raise ValueError("no detected hairline to lower")
    frame = FaceFrame.from_face(face)
    shift = frame.up * (drop_mm / calibration.mm_per_px)
    return Design("mark", np.asarray(hairline.points, dtype=np.float64) - shift, drop_mm)


def marked_hairline(points: list[list[float]]) -> Design:
    """The user's polyline as given (endpoint 3); checked to lie inside the image upstream."""
    return Design("mark", np.asarray(points, dtype=np.float64), None)


def inpainting_mask(
    face: Face,
    design: Design,
    hairline: Hairline,
    calibration: Calibration,
    person: np.ndarray | None = None,
) -> np.ndarray:
    """uint8 (H, W), 255 where hair is to be grown: between the design and the current
    hairline (or, without one, everything above the design inside the person mask),
    dilated by ~3 mm so the generator blends the edge."""
    frame = FaceFrame.from_face(face)
    uv = frame.to_frame(design.points)
    reach = 2.0 * (face.image_width + face.image_height)  # past any image edge: fillPoly clips
    upper_v = current_heights(hairline, frame, uv[:, 0]) if has_hairline(hairline) else uv[:, 1] + reach
    upper_v = np.maximum(upper_v, uv[:, 1])
    mask = np.zeros((face.image_height, face.image_width), dtype=np.uint8)
    if np.max(upper_v - uv[:, 1]) < 1.0:
        return mask  # the design is the current hairline: nothing to grow
    upper = frame.to_image(np.stack([uv[:, 0], upper_v], axis=1))
    polygon = np.concatenate([design.points, upper[::-1]])
    cv2.fillPoly(mask, [_int_points(polygon)], (255,))
    if person is not None and not has_hairline(hairline):
        mask[~person] = 0
    radius = max(2, round(MASK_DILATION_MM / calibration.mm_per_px))
    kernel = cv2.getStructuringElement(cv2.MORPH_ELLIPSE, (2 * radius + 1, 2 * radius + 1))
    return cv2.dilate(mask, kernel)


def _int_points(points: np.ndarray) -> np.ndarray:
    """int32 px for OpenCV, bounded so far-away points cannot overflow its fixed-point maths."""
    bound = 1 << 20
    return np.clip(np.round(points), -bound, bound).astype(np.int32)
