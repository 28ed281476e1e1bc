"""How far the preview's grown band looks like the person's own hair (analysis.md § Rendering).

Measured per column of the midline frame, between the old hairline and the new lower edge
(the band), against a band of the same height just above the old hairline (the hair it
comes from), in lightness (OpenCV 8-bit L):
- high-frequency energy: mean |L − Gaussian(L, HIGH_PASS_MM)|, band / hair above (target ≥ 0.7);
- lightness spread: standard deviation of L, band / hair above (not a smoothed, darker strip);
- edge sharpness: the steepest lightness step across the line (per column, the largest
  |dL/dv| of the Gaussian-smoothed L within ±EDGE_REACH_MM of the line: the preview's own
  grown edge (`preview.grown_edge`), the traced hairline, median over the
  columns), the new edge in the grown photo / the old edge in the photo (target ≤ 1.5).
"""

from __future__ import annotations

from dataclasses import dataclass

import cv2
import numpy as np

from ..face.head_samples import to_lab
from ..frame import FaceFrame
from ..types import Calibration, Face, Hairline
from .designs import Design
from .preview import grown_edge

HIGH_PASS_MM = 0.5
EDGE_SMOOTH_MM = 0.3
EDGE_REACH_MM = 2.5


@dataclass(frozen=True)
class BandTexture:
    high_frequency_ratio: float
    lightness_spread_ratio: float
    edge_sharpness_ratio: float


def band_texture(
    before: np.ndarray, after: np.ndarray, face: Face, hairline: Hairline, design: Design, calibration: Calibration
) -> BandTexture | None:
    """The three ratios of the band grown between `hairline` and `design` (None: no band)."""
    if hairline.points is None or len(hairline.points) < 2:
        return None
    px_per_mm = 1.0 / calibration.mm_per_px
    frame = FaceFrame.from_face(face)
    old = frame.to_frame(np.asarray(hairline.points, dtype=np.float64))
    edge = grown_edge(face, hairline, design, calibration)  # the line the preview grows to
    if edge is None:
        return None
    new = frame.to_frame(edge)
    height, width = before.shape[:2]
    ys, xs = np.mgrid[0:height, 0:width]
    uv = frame.to_frame(np.stack([xs.ravel(), ys.ravel()], axis=1)).reshape(height, width, 2)
    u, v = uv[..., 0], uv[..., 1]
    lo, hi = max(old[:, 0].min(), new[:, 0].min()), min(old[:, 0].max(), new[:, 0].max())
    inside = (u >= lo) & (u <= hi)
    old_v = np.interp(u, *_sorted(old))
    new_v = np.interp(u, *_sorted(new))
    drop = old_v - new_v
    band = inside & (drop > 1.0) & (v < old_v) & (v > new_v)
    above = inside & (drop > 1.0) & (v >= old_v) & (v < old_v + drop)
    if band.sum() < 20 or above.sum() < 20:
        return None
    before_l, after_l = to_lab(before)[..., 0], to_lab(after)[..., 0]

    def detail(lightness: np.ndarray) -> np.ndarray:
        return np.abs(lightness - cv2.GaussianBlur(lightness, (0, 0), HIGH_PASS_MM * px_per_mm))

    high_frequency = float(detail(after_l)[band].mean()) / max(float(detail(before_l)[above].mean()), 1e-3)
    spread = float(after_l[band].std()) / max(float(before_l[above].std()), 1e-3)
    reach = EDGE_REACH_MM * px_per_mm
    new_edge = _edge_step(after_l, v, new_v, inside & (drop > 1.0), reach, px_per_mm)
    old_edge = _edge_step(before_l, v, old_v, inside & (drop > 1.0), reach, px_per_mm)
    return BandTexture(high_frequency, spread, new_edge / max(old_edge, 1e-3))


def _sorted(points: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    order = np.argsort(points[:, 0])
    return points[order, 0], points[order, 1]


def _edge_step(
    lightness: np.ndarray, v: np.ndarray, line_v: np.ndarray, where: np.ndarray, reach: float, px_per_mm: float
) -> float:
    """Median over image columns of the steepest vertical lightness step within `reach` px of the line."""
    smooth = cv2.GaussianBlur(lightness, (0, 0), EDGE_SMOOTH_MM * px_per_mm)
    step = np.abs(np.diff(smooth, axis=0, append=smooth[-1:]))
    near = where & (np.abs(v - line_v) <= reach)
    columns = np.nonzero(near.any(axis=0))[0]
    if len(columns) == 0:
        return 0.0
    return float(np.median([step[near[:, x], x].max() for x in columns]))
