"""A second opinion on the midline hairline from the image itself, not the mask.

Over the midline window, each row's mean colour is placed on the line from forehead skin
(t = 0, sampled between the mask edge and the brows) to hair (t = 1, sampled just above
the mask edge). The hairline is where t crosses 0.5 going down; how steeply it crosses,
in ΔE per working pixel, says whether the edge is sharp (dense hair) or soft (sparse,
light or stubble hairs). Measured on the labelled photos: the crossing matched the label
within ~1 working px on sharp edges and drifted on soft ones, so hairline_checks lets it
move the mask estimate only when the edge is sharp, <= 3 mm away and the same on both
halves of the window, or when the hair is too close to skin colour (white, grey) for the
mask to be trusted; otherwise the disagreement only widens the band.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .head_samples import face_height_px
from .types import Face

HAIR_BAND = 0.05  # face heights above the mask edge sampled as "hair"
SEARCH_ABOVE, SEARCH_BELOW = 0.03, 0.05  # face heights around the mask edge searched for the crossing


@dataclass(frozen=True)
class EdgeProfile:
    crossing_row: float  # working px
    sharpness: float  # ΔE per working px at the crossing


def midline_edge_profile(lab: np.ndarray, columns: np.ndarray, edge_row: float, brow_row: float, face: Face) -> EdgeProfile | None:
    """None when there is no forehead to compare with (fringe to the brows) or no crossing."""
    height = face_height_px(face)
    edge = int(round(edge_row))
    hair_rows = slice(max(0, edge - max(2, int(HAIR_BAND * height))), max(1, edge))
    skin_rows = slice(int((edge_row + brow_row) / 2), int(brow_row) - 2)
    if skin_rows.stop - skin_rows.start < 3 or hair_rows.stop <= hair_rows.start:
        return None
    hair = np.median(lab[hair_rows][:, columns].reshape(-1, 3), axis=0)
    skin = np.median(lab[skin_rows][:, columns].reshape(-1, 3), axis=0)
    contrast = hair - skin
    span = float(contrast @ contrast)
    if span < 1.0:
        return None
    t = (lab[:, columns].mean(axis=1) - skin) @ contrast / span
    first = max(1, int(edge_row - SEARCH_ABOVE * height))
    last = min(len(t) - 2, int(edge_row + SEARCH_BELOW * height), skin_rows.stop)
    rows = np.arange(first, last)
    falling = rows[(t[rows] >= 0.5) & (t[rows + 1] < 0.5)]
    if len(falling) == 0:
        return None
    row = int(falling[np.argmin(np.abs(falling - edge_row))])
    crossing = row + (t[row] - 0.5) / (t[row] - t[row + 1])
    slope = (t[row - 1] - t[row + 2]) / 3.0  # over the 3 px around the crossing
    return EdgeProfile(crossing_row=float(crossing), sharpness=float(slope * np.sqrt(span)))
