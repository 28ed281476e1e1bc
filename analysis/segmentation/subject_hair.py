"""From the hair network's probability to the subject's scalp hair (pure, any frame).

The network (hairnet) finds hair well on people who have it, but on bald and shaved heads
it marks a ring or cap of scalp skin as hair, and it knows nothing of whose hair it sees.
So (analysis.md § Hair segmentation):
- a bald or shaved head has no hair mask at all: the segmenter first compares the top of
  the head, just inside its outline, with the cheeks (`HeadColours.bare_scalp`, the very
  test behind the hairline's `no_hairline`), before the network's answer is used;
- hair is never the face below the brows (brows, beards and moustaches are not scalp
  hair) nor the thin forehead strip above them;
- only components that reach the subject's head (the face oval grown by HEAD_REACH face
  heights) are kept: another person's hair, or hair-like background, is not hers;
- the network's scalp ring itself (`is_scalp_ring`): over the midline its "hair" is a band
  thinner than RING_FACE_HEIGHTS under the head outline, and the clear forehead runs from
  the brows up into it (skin, not an edge): also a bald head, also an empty mask. Measured
  on the labelled photos with the colour test switched off: the three bald heads' bands
  0.08-0.10 face heights with the forehead running 0.04-0.07 into them; every haired head's
  band >= 0.15; the receded stubble head (0.04) has 0.08 of non-skin between forehead and
  band, so it stays a hairline. Dark hair painted above a receding line on those bald heads
  (a thin band with a sharp edge: the skin stops at it) stays hair too.
The hairline is traced on the same mask, so its edge is where the labelled lines lie: the
network's probability falls off over a few pixels at the front edge, and its 0.5 contour
ran a median 2.6 mm above the labelled line on the 26 labelled hairline photos, the 0.2
contour 1.3 mm (docs/analysis_science.md). So the mask is the 0.5 region grown into the
0.2 contour by at most EDGE_REACH square px (~3 mm): the faint front edge, not a faint
trail down the neck or the collar.
"""

from __future__ import annotations

import cv2
import numpy as np

from ..face.head_samples import brow_curve, brow_strip_mask, face_height_px, face_oval_mask, head_outline_rows
from ..hairline.edge_profile import ClearForehead
from ..hairline.trace import MIDLINE_HALF_WINDOW, trace_edges
from ..types import Face

# hysteresis: hair is where the network is sure (CORE), and where it is at least EDGE_PROBABILITY
# sure within EDGE_REACH square px of that (the faint front edge, not faint trails)
CORE_PROBABILITY, EDGE_PROBABILITY, EDGE_REACH = 0.5, 0.2, 4
HEAD_REACH = 0.35  # face heights around the face oval that count as the subject's head
RING_FACE_HEIGHTS = 0.12  # a midline hair band thinner than this under the outline: a ring
RING_SKIN_INTO = 0.02  # face heights the forehead's skin must run up into that band


def subject_hair(probability: np.ndarray, face: Face) -> np.ndarray:
    """Boolean hair mask of the subject, in the frame of `probability` (and of `face`)."""
    kernel = cv2.getStructuringElement(cv2.MORPH_ELLIPSE, (2 * EDGE_REACH + 1, 2 * EDGE_REACH + 1))
    near_core = cv2.dilate((probability >= CORE_PROBABILITY).astype(np.uint8), kernel).astype(bool)
    hair = near_core & (probability >= EDGE_PROBABILITY) & ~not_scalp_hair_region(probability.shape, face)
    return _reaching_the_head(hair, face)


def not_scalp_hair_region(shape: tuple[int, ...], face: Face) -> np.ndarray:
    """The face from the brows down, and the strip of forehead just above the brows."""
    rows = np.arange(shape[0])[:, None]
    below_brows = rows >= brow_curve(face, np.arange(shape[1]))[None, :]
    return (face_oval_mask(shape, face) & below_brows) | brow_strip_mask(shape, face)


def _reaching_the_head(hair: np.ndarray, face: Face) -> np.ndarray:
    count, components = cv2.connectedComponents(hair.astype(np.uint8), connectivity=8)
    if count <= 1:
        return hair
    # within HEAD_REACH of the oval: a distance transform, not a dilation by a disc that
    # size (a 121 px kernel took 37 ms on the network's 512 px square; this takes 3-5 ms)
    outside_oval = (~face_oval_mask(hair.shape, face)).astype(np.uint8)
    head = cv2.distanceTransform(outside_oval, cv2.DIST_L2, cv2.DIST_MASK_PRECISE) <= HEAD_REACH * face_height_px(face)
    keep = np.zeros(count, bool)
    keep[np.unique(components[head & hair])] = True
    keep[0] = False
    return keep[components]


def is_scalp_ring(hair: np.ndarray, person: np.ndarray, lab: np.ndarray, face: Face) -> bool:
    """Whether the mask over the midline is the network's ring on a bald scalp (see the
    module docstring). Working frame: `hair` coverage, `person` bool, `lab`, `face`."""
    trace = trace_edges(hair, person, face)
    window = trace.in_window(0.0, MIDLINE_HALF_WINDOW)
    if not window.any():
        return False
    columns = trace.points[window, 0].astype(int)
    edge_row = float(np.median(trace.points[window, 1]))
    height = face_height_px(face)
    band = (edge_row - float(np.median(head_outline_rows(person)[columns]))) / height
    forehead_top = ClearForehead.scan(lab, columns, float(np.min(trace.brow_rows[window])), face).top()
    return band < RING_FACE_HEIGHTS and forehead_top is not None and forehead_top <= edge_row - RING_SKIN_INTO * height
