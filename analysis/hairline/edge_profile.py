"""A second opinion on the midline hairline from the image itself, not the mask.

Over the midline window, each row's mean colour is placed on the line from forehead skin
(t = 0, sampled between the mask edge and the brows) to hair (t = 1, sampled just above
the mask edge). The hairline is where t crosses 0.5 going down; how steeply it crosses,
in ΔE per working pixel, says whether the edge is sharp (dense hair) or soft (sparse,
light or stubble hairs). Measured on the labelled photos: the crossing matched the label
within ~1 working px on sharp edges and drifted on soft ones, so `checks`
(`weigh_edges`) snaps to it only when the edge is sharp, <= 3 mm away and the same on both
halves of the window; a soft one counts only together with the top of the clear forehead
(`ClearForehead`, the third view), and any other disagreement widens the band.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..face.head_samples import ColourModel, brow_strip_mask, face_height_px
from ..types import Face

HAIR_BAND = 0.05  # face heights above the mask edge sampled as "hair"
SEARCH_ABOVE, SEARCH_BELOW = 0.03, 0.05  # face heights around the mask edge searched for the crossing
# the clear forehead: skin like the strip just above the brows (Mahalanobis distance to
# its colour model), on at least half of a row's window columns
FOREHEAD_STRIP = 0.05  # face heights above the brows sampled as forehead skin
FOREHEAD_DISTANCE = 3.5
FOREHEAD_SHARE = 0.5
# ... and where the hair is close to skin colour, skin across nearly the whole window: light
# strands pass the skin test on some of a row's columns, so half of them is not yet forehead
# (measured with 0.9, skin above the network's mask edge on light hair: 0.4-3.6 mm on the
# copies and photos it measured right, 4.6-5.4 mm on the three it put 5-13 mm low)
LIGHT_HAIR_FOREHEAD_SHARE = 0.9
# A row between hair and skin is a mixture of the two: its mean colour lies on the line from
# the skin to the hair. On the hair side of the crossing (rows at least HAIR_SIDE_T of the way
# to the hair) a row this far from that line, as a share of the hair-skin contrast, is a
# band of a third colour: roots of another colour, a shadow, a dye's rim. Such a band has
# two edges, and either could be where the hair meets the skin. Measured: at most 0.07 on
# every dark-haired photo and its mirrored, rescaled and JPEG copies. On light hair
# (contrast ~10 ΔE) the profile's own noise reaches 0.09 where the answer was right.
# On 510 answers from the first 34 photos (also brightened, darkened and rolled) it never
# fires. The hair network's mask dyed light gives 0.14-0.19, because the original's fade
# below the mask is left undyed (two blonde copies `ok` 3.5 and 4.0 mm under the label at
# the band's lower edge).
HAIR_SIDE_T = 0.75
THIRD_COLOUR_SHARE = 0.12


@dataclass(frozen=True)
class EdgeProfile:
    crossing_row: float  # working px
    sharpness: float  # ΔE per working px at the crossing
    width_px: float  # working px the skin-to-hair ramp would take at that slope
    # how far above the crossing a band of a third colour reaches (THIRD_COLOUR_SHARE), in
    # working px; None when the rows there are mixtures of the hair and the skin
    third_colour_px: float | None = None

    @property
    def contrast(self) -> float:
        """ΔE between the hair and the skin sampled on either side of the crossing."""
        return self.sharpness * self.width_px


def midline_edge_profile(
    lab: np.ndarray, columns: np.ndarray, edge_row: float, brow_row: float, face: Face
) -> EdgeProfile | None:
    """None when there is no forehead to compare with (fringe to the brows) or no crossing."""
    height = face_height_px(face)
    hair_rows = _hair_rows(edge_row, face)
    skin_rows = slice(int((edge_row + brow_row) / 2), int(brow_row) - 2)
    if len(columns) == 0 or skin_rows.stop - skin_rows.start < 3 or hair_rows.stop <= hair_rows.start:
        return None
    hair = np.median(lab[hair_rows][:, columns].reshape(-1, 3), axis=0)
    skin = np.median(lab[skin_rows][:, columns].reshape(-1, 3), axis=0)
    contrast = hair - skin
    span = float(contrast @ contrast)
    if span < 1.0:
        return None
    means = lab[:, columns].mean(axis=1)
    t = (means - skin) @ contrast / span
    first = max(1, int(edge_row - SEARCH_ABOVE * height))
    last = min(len(t) - 2, int(edge_row + SEARCH_BELOW * height), skin_rows.stop)
    rows = np.arange(first, last)
    falling = rows[(t[rows] >= 0.5) & (t[rows + 1] < 0.5)]
    if len(falling) == 0:
        return None
    row = int(falling[np.argmin(np.abs(falling - edge_row))])
    crossing = row + (t[row] - 0.5) / (t[row] - t[row + 1])
    # over the 3 px around the crossing; at least the fall across the crossing's own pixel,
    # which is positive by construction (a ragged profile made the 3 px slope negative:
    # a "ramp" of 856838 mm and a band to match, on a copy recoloured white)
    slope = max((t[row - 1] - t[row + 2]) / 3.0, t[row] - t[row + 1])
    return EdgeProfile(
        crossing_row=float(crossing),
        sharpness=float(slope * np.sqrt(span)),
        width_px=float(1.0 / max(slope, 1e-6)),
        third_colour_px=_third_colour_px(means, skin, contrast, t, np.arange(first, row + 1), crossing),
    )


def _third_colour_px(
    means: np.ndarray, skin: np.ndarray, contrast: np.ndarray, t: np.ndarray, above: np.ndarray, crossing: float
) -> float | None:
    """How far above `crossing` the highest of the rows `above` on the hair side lies whose
    mean colour is off the skin-to-hair line by more than THIRD_COLOUR_SHARE of the contrast."""
    hair_side = above[t[above] >= HAIR_SIDE_T]
    off_line = np.linalg.norm(means[hair_side] - skin - t[hair_side, None] * contrast, axis=1)
    banded = hair_side[off_line > THIRD_COLOUR_SHARE * np.linalg.norm(contrast)]
    return float(crossing - banded.min()) if len(banded) else None


def _hair_rows(edge_row: float, face: Face) -> slice:
    edge = round(edge_row)
    return slice(max(0, edge - max(2, int(HAIR_BAND * face_height_px(face)))), max(1, edge))


@dataclass(frozen=True)
class ClearForehead:
    """The forehead seen from below over one window's columns: the colour model of the strip
    just above the brows, how often that strip passes its own model, and, for each row from
    where the scan starts (just above the strip) up to the top, the share of the columns the
    model calls skin. Fitted and scanned once; `top` reads it at any share."""

    model: ColourModel
    strip_passes: float
    columns: np.ndarray
    start: int
    skin_share: np.ndarray | None  # rows 0..start; None when the brows are at the crop's top

    @classmethod
    def scan(cls, lab: np.ndarray, columns: np.ndarray, brow_row: float, face: Face) -> ClearForehead:
        strip = lab[brow_strip_mask(lab.shape[:2], face, FOREHEAD_STRIP)]
        model = ColourModel.fit(strip)
        start = int(brow_row - FOREHEAD_STRIP * face_height_px(face))
        skin_share = (
            None if start <= 0 else (model.distance(lab[: start + 1][:, columns]) < FOREHEAD_DISTANCE).mean(axis=1)
        )
        strip_passes = float((model.distance(strip) < FOREHEAD_DISTANCE).mean())
        return cls(model, strip_passes, columns, start, skin_share)

    def top(self, share: float = FOREHEAD_SHARE) -> float | None:
        """The highest row up to which the forehead stays skin on `share` of the columns: the
        hairline seen from below, whatever the hair looks like. None when there was nothing
        to scan."""
        if self.skin_share is None:
            return None
        not_skin = np.flatnonzero(self.skin_share[::-1] < share)  # counted upwards from `start`
        return float(self.start - not_skin[0] + 1) if len(not_skin) else 0.0

    def takes_hair_for_skin(self, lab: np.ndarray, edge_row: float, face: Face) -> bool:
        """Whether the model passes the hair just above the mask edge as often as the strip
        it was fitted on: then it cannot tell the two apart, and `top` cannot see where the
        hair starts (a grey-toned photo: all of its dark hair passes, on the photo and every
        copy, and the clear forehead "runs" 15-45 mm up into it; on the other sharp edges
        0.80-0.93 of the hair passed, of the strip 0.95-1.0)."""
        pixels = lab[_hair_rows(edge_row, face)][:, self.columns]
        return pixels.size > 0 and bool((self.model.distance(pixels) < FOREHEAD_DISTANCE).mean() >= self.strip_passes)
