"""The frontal hairline: traced from a hair mask, then judged before any number leaves.

Order matters (analysis.md § Real photos): first `hair_evidence` decides whether there is
a hairline to measure at all (bald -> `no_hairline`, hat -> `occluded`); only then is the
mask traced, column by column between the outer brow ends, from the brow curve up to the
head outline; the trichion is the median edge over +-0.1 face widths around the midline;
plausibility gates and the fringe check (`hairline_checks`) turn doubt into `uncertain`
(with notes and a wide band) or `occluded`. Everything runs in the working frame of
`HeadCrop` and is mapped back to image pixels at the end.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .designs import FaceFrame
from .hair_evidence import assess_hair
from .hairline_checks import MIDLINE_HALF_WINDOW, judge
from .head_crop import HeadCrop
from .head_samples import brow_curve, face_width_px, head_outline_rows, to_lab
from .types import Calibration, Face, HairSegmentation, Hairline, LandmarkId

MIN_RUN_PX = 3  # working px: a hair region starts with >= 3 hair pixels in a row
MIN_MIDLINE_COVERAGE = 0.5  # share of midline columns that must show an edge

NOTE_NOT_FOUND = "前额中部未见头发边缘，无法定位发际线"


@dataclass(frozen=True)
class Trace:
    """Lower edge of the hair, in the working frame's midline coordinates (u across, v up, px)."""

    frame: FaceFrame
    u: np.ndarray  # (N,) per traced column
    v: np.ndarray  # (N,) NaN where the column shows no hair below the head outline
    points: np.ndarray  # (N, 2) working px (NaN rows where v is NaN)
    brow_rows: np.ndarray  # (N,) working px: upper edge of the brows under each column
    face_width: float

    def near(self, u_centre: float, half_width: float) -> np.ndarray:
        """v of the edge (NaN: none) in the columns within `half_width` face widths of u_centre."""
        return self.v[np.abs(self.u - u_centre) <= half_width * self.face_width]

    def in_window(self, u_centre: float, half_width: float) -> np.ndarray:
        """Which columns lie within `half_width` face widths of u_centre and show an edge."""
        return (np.abs(self.u - u_centre) <= half_width * self.face_width) & ~np.isnan(self.v)


def trace_hairline(rgb: np.ndarray, face: Face, segmentation: HairSegmentation, calibration: Calibration) -> Hairline:
    """The hairline and its status (contract.md endpoint 1); never raises for "not found"."""
    crop = HeadCrop.around(face)
    work_face = crop.face_in_work(face)
    person = crop.mask_in_work(segmentation.person) >= 0.5
    lab = to_lab(segmentation.work_rgb(crop, rgb))
    evidence = assess_hair(lab, person, work_face, segmentation, crop)
    if evidence.verdict != "hair":
        return Hairline(status=evidence.verdict, notes=evidence.notes)
    hair = crop.mask_in_work(segmentation.hair)
    trace = trace_edges(hair, person, work_face)
    window = trace.near(0.0, MIDLINE_HALF_WINDOW)
    found = window[~np.isnan(window)]
    if len(found) < MIN_MIDLINE_COVERAGE * max(1, len(window)):
        return Hairline(status="no_hairline", notes=(*evidence.notes, NOTE_NOT_FOUND))
    return judge(trace, work_face, hair, lab, crop, calibration, evidence)


def trace_edges(hair: np.ndarray, person: np.ndarray, face: Face) -> Trace:
    """Per column between the outer brow ends: scan up from the brow curve to the head
    outline for the first run of MIN_RUN_PX hair pixels; its lower edge, to sub-pixel
    precision, is where the hair coverage crosses 0.5."""
    height = hair.shape[0]
    columns = np.arange(*_brow_span(face, hair.shape[1]))
    brow_rows = np.clip(brow_curve(face, columns), 0, height - 1).astype(int)
    outline = head_outline_rows(person)[columns]
    rows = np.arange(height)[:, None]
    is_hair = hair[:, columns] >= 0.5
    run = is_hair.copy()
    for step in range(1, MIN_RUN_PX):  # run[r]: rows r, r-1, ... all hair
        run[step:] &= is_hair[:-step]
    run[: MIN_RUN_PX - 1] = False
    searchable = (rows <= brow_rows[None, :]) & (rows - (MIN_RUN_PX - 1) >= outline[None, :])
    lowest = np.where(run & searchable, rows, -1).max(axis=0)
    edges = np.array([_subpixel_edge(hair[:, x], r, b) for x, r, b in zip(columns, lowest, brow_rows)])
    points = np.stack([columns.astype(float), edges], axis=1)
    frame = FaceFrame.from_face(face)
    uv = frame.to_frame(np.nan_to_num(points))
    v = np.where(np.isnan(edges), np.nan, uv[:, 1])
    return Trace(frame, uv[:, 0], v, points, brow_curve(face, columns), face_width_px(face))


def _brow_span(face: Face, width: int) -> tuple[int, int]:
    brows = face.points[list(LandmarkId.LEFT_BROW_UPPER + LandmarkId.RIGHT_BROW_UPPER)]
    return int(max(0, np.ceil(brows[:, 0].min()))), int(min(width, np.floor(brows[:, 0].max()) + 1))


def _subpixel_edge(coverage: np.ndarray, lowest: int, brow_row: int) -> float:
    if lowest < 0:
        return np.nan
    below = lowest + 1
    if below > brow_row or below >= len(coverage) or coverage[below] >= 0.5:
        return float(lowest)
    drop = coverage[lowest] - coverage[below]
    return float(lowest + (coverage[lowest] - 0.5) / drop) if drop > 0 else float(lowest)
