"""The lower edge of the hair, traced column by column from a hair mask (working frame).

For each column between the outer brow ends, scan up from the brow curve to the head
outline for the first run of MIN_RUN_PX hair pixels; its lower edge, to sub-pixel
precision, is where the hair coverage crosses 0.5. `frontal` traces, `checks`
judges the trace; both import `Trace` from here (no import cycle between them).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..face.head_samples import brow_curve, face_width_px, head_outline_rows
from ..frame import FaceFrame
from ..types import Face, LandmarkId

MIN_RUN_PX = 3  # working px: a hair region starts with >= 3 hair pixels in a row
MIDLINE_HALF_WINDOW = 0.10  # face widths either side of the midline: the trichion's window
# face widths from the midline of the hairline a parting's wedge is judged against (inside:
# where a wedge sits; outside the outer bound the temples curve away)
PARTING_FLANKS = (0.05, 0.25)
MIN_FLANK_COLUMNS = 5


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
    edges = np.array([_subpixel_edge(hair[:, x], r, b) for x, r, b in zip(columns, lowest, brow_rows, strict=True)])
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


@dataclass(frozen=True)
class Parting:
    """A parting's skin wedge over the midline: the columns it spans and how far it rises."""

    columns: np.ndarray  # bool over the trace's columns
    rise_px: float  # median height of the wedge above the bridge, working px


def bridge_parting(trace: Trace, min_rise_px: float) -> tuple[Trace, Parting | None]:
    """The trace with a parting's skin wedge bridged (analysis.md § Statuses and claims: at a
    parting the trichion is where the hair of the two sides meets the forehead skin at the
    midline; the wedge above it is scalp). The hairline either side of the midline
    (PARTING_FLANKS) is fitted with a parabola, which a rounded or straight line follows
    and a narrow notch over the midline does not; columns around the midline whose edge
    lies more than half of `min_rise_px` above that fit, in one run through the midline
    and rising `min_rise_px` or more at its middle, are the wedge: their edge becomes the
    fit's. No wedge: the trace as it came."""
    found = ~np.isnan(trace.v)
    inner, outer = (bound * trace.face_width for bound in PARTING_FLANKS)
    flanks = found & (np.abs(trace.u) > inner) & (np.abs(trace.u) <= outer)
    if (flanks & (trace.u < 0)).sum() < MIN_FLANK_COLUMNS or (flanks & (trace.u > 0)).sum() < MIN_FLANK_COLUMNS:
        return trace, None
    fit = np.polyval(np.polyfit(trace.u[flanks], trace.v[flanks], 2), trace.u)
    above = found & (trace.v - fit > min_rise_px / 2)
    middle = int(np.argmin(np.abs(trace.u)))
    if not above[middle]:
        return trace, None
    ends = np.nonzero(~above)[0]
    first = int(ends[ends < middle].max()) + 1 if (ends < middle).any() else 0
    last = int(ends[ends > middle].min()) if (ends > middle).any() else len(above)
    wedge = np.zeros_like(above)
    wedge[first:last] = True
    centre = wedge & (np.abs(trace.u) <= inner)
    rise = float(np.median((trace.v - fit)[centre])) if centre.any() else 0.0
    if rise < min_rise_px or np.abs(trace.u[wedge]).max() > outer:
        return trace, None
    v = np.where(wedge, fit, trace.v)
    points = trace.frame.to_image(np.stack([trace.u, np.nan_to_num(v)], axis=1))
    points[~found] = np.nan
    return Trace(trace.frame, trace.u, v, points, trace.brow_rows, trace.face_width), Parting(wedge, rise)
