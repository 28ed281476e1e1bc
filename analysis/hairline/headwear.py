"""Is the "hair" over the forehead a cap's band? Decided on the traced mask, before any number.

The hair network takes a dark cap band for hair (a navy officer's cap, grey hair showing
only at the temples): its edge is the cap's lower edge, and measured or
grown from, the cap becomes a fringe painted down the forehead (issue 17: "a headband or
hat edge is not a hairline"). Hair has strands and highlights; a band of cloth is one flat
colour. So a band just above the midline edge whose lightness varies by at most
FLAT_LIGHTNESS_SD and which is dark (median <= DARK_LIGHTNESS) may be a cap; it is one
(`occluded`) only with a cap's crown in view above it (`crown_gap`: the network does not
call a crown hair), never where the photo's top edge cuts the head. A flat dark band
without that evidence is very dark hair as likely as a cap (a parting's two dark sides, a
short dark cut under the frame's edge): hair, with NOTE_DARK_BAND (`uncertain`).
Measured on 28 real photos with hair or a cap (working frame, 160 px faces; OpenCV 8-bit
L): the spread is 3.0-5.4 on a cap's band (the photo, 2x, JPEG q30, +15 and +30 brighter;
`occluded` mirrored, 0.6x, 4x and 0.7x darker too), 7.1 on thin white hair (L 200),
>= 11.7 on every other photo and >= 12.4 on the dark-haired ones (black hair at L 3: 15.7,
its highlights). Seen but not used: the mask over the cap's band stops 0.31-0.34 face
heights under the head outline (the crown is not "hair"), as it does where a person mask
spills over people behind, and a +30 brighter copy's mask covers the crown: too weak a cue
on its own. A light or coloured flat band (a white cap) is not caught: none was seen. A
headband above visible hair has hair below it; `checks`' UNMASKED_GAP_MM handles it.
The band found is also taken out of the hair mask (endpoint 6: "masks hold the subject's
hair only"): the mask's pixels connected to the sampled band and at most
BAND_CEILING_SDS x FLAT_LIGHTNESS_SD lighter than its median. Grey or light hair beside it
(grey temples, L >= 100) stays; the cap's dark sides, which the network marks
down to her temples, go with the band.
"""

from __future__ import annotations

import cv2
import numpy as np

from ..face.head_samples import face_height_px, head_outline_rows
from ..types import Face
from .trace import Trace

FLAT_LIGHTNESS_SD = 8.0  # OpenCV 8-bit L, over the band just above the edge
DARK_LIGHTNESS = 60.0  # median L of a dark band (a navy cap's: 9, 45 on a +30 copy)
BAND_FACE_HEIGHTS = 0.08  # how far above the edge the band is sampled
# a pixel of the band is at most this many FLAT_LIGHTNESS_SD lighter than the band's median
# (a navy cap, median 9: of the working mask 7 % is left at 2, 4 % at 3, 2.5 % at 4, before
# the rim; grey temple hair is L >= 100, far above any of them)
BAND_CEILING_SDS = 3.0
# a cap's crown: the mask begins this many face heights below the head outline over the
# midline (a cap 0.33; haired heads <= 0.07, but 0.30 where the person mask spills over
# people behind: the cue only confirms a flat band)
CAP_CROWN_GAP = 0.2
NOTE_DARK_BAND = "前额上方的头发颜色深而均匀（可能是很黑的头发，也可能是帽檐），发际线位置不确定"
_RIM = np.ones((3, 3), np.uint8)  # working px: the band's edge, half skin, half cloth


def headwear_band(trace: Trace, window: np.ndarray, hair: np.ndarray, lab: np.ndarray, face: Face) -> np.ndarray | None:
    """The cap's band the mask took for hair, in the working frame (a boolean mask), or None
    when the mask over the midline is no flat, dark band: `window` selects the trace's
    midline columns, `hair` is coverage."""
    if not window.any():
        return None
    columns = trace.points[window, 0].astype(int)
    edge_row = float(np.median(trace.points[window, 1]))
    first = max(0, int(edge_row - BAND_FACE_HEIGHTS * face_height_px(face)))
    last = max(first + 1, int(edge_row) - 1)
    is_hair = hair >= 0.5
    sampled = np.zeros_like(is_hair)
    sampled[first:last, columns] = is_hair[first:last, columns]
    if not sampled.any():
        return None
    lightness = lab[..., 0]
    median = float(np.median(lightness[sampled]))
    if float(np.std(lightness[sampled])) > FLAT_LIGHTNESS_SD or median > DARK_LIGHTNESS:
        return None
    dark = is_hair & (lightness <= median + BAND_CEILING_SDS * FLAT_LIGHTNESS_SD)
    _, regions = cv2.connectedComponents(dark.astype(np.uint8), connectivity=8)
    touched = np.unique(regions[sampled & dark])
    band = np.isin(regions, touched[touched > 0]).astype(np.uint8)
    return is_hair & cv2.dilate(band, _RIM).astype(bool)  # with its rim, blended with the skin


def crown_gap(window_columns: np.ndarray, hair: np.ndarray, person: np.ndarray, face: Face) -> float:
    """How far below the head outline the mask begins over the midline columns, in face
    heights (median over the columns): ~0 where hair covers the top of the head; a cap's
    crown, which the network does not call hair, leaves a gap (a navy cap: 0.31-0.34)."""
    is_hair = hair[:, window_columns] >= 0.5
    outline = head_outline_rows(person)[window_columns]
    first_hair = np.where(is_hair.any(axis=0), np.argmax(is_hair, axis=0), hair.shape[0])
    return float(np.median(first_hair - outline)) / face_height_px(face)
