"""Is there a frontal hairline to measure at all? Decided BEFORE any hair mask is trusted.

A segmenter always finds "hair" somewhere; on a bald head it is the scalp, and a number
traced from that is the worst answer the product can give. So the top of the head, just
inside its outline, is compared with the cheeks first (analysis.md § Real photos):
- the numbers of the top of the head (`scalp`: its colour against the face's own skin, its
  texture against the cheeks', the network's confidence there) are the bald model's
  evidence; whether they say bald is decided by the fitted decision layer
  (`decision`), never here. The photo's top edge cutting the head: a note when what the
  frame cuts through is skin-coloured;
- no top of the head in view at all: `uncertain` (nothing to judge), never bald;
- a hat (segmenters that can tell, i.e. BiSeNet) over the top of the head: occluded;
- hair colour close to skin (white, grey, sparse): the mask edge is soft -> low contrast.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from shared.contract import NOTE_TOP_OF_HEAD_CUT

from ..face.head_crop import HeadCrop
from ..face.head_samples import top_of_head_mask
from ..types import Face, HairSegmentation
from .scalp import TopOfHead, top_of_head

# hair this close to the skin colour still segments, but its edge is diffuse
LOW_CONTRAST_DELTA_E = 40.0
HAT_FRACTION = 0.30

# the colour test reads light hair in a dim photo as skin (white hair at 0.7x the
# exposure: ΔE 28.7 -> 22.3 from the cheeks): the note says how to get a real answer
NOTE_HAT = "帽子遮挡了发际线，请摘帽后重拍"
NOTE_LOW_CONTRAST = "发色与肤色接近（浅色、花白或稀疏头发），发际线位置不确定"
NOTE_TOP_CUT = NOTE_TOP_OF_HEAD_CUT
NOTE_NO_OUTLINE = "头顶不在画面内或未能识别头部轮廓，看不到发际线：请拍摄完整的头部"

Verdict = Literal["hair", "uncertain", "occluded"]


@dataclass(frozen=True)
class HairEvidence:
    """What the top of the head says, with the numbers behind it (for tests and logs)."""

    verdict: Verdict
    top: TopOfHead
    hair_delta_e: float | None  # non-skin top-of-head pixels vs cheek skin
    low_contrast: bool
    notes: tuple[str, ...]


def assess_hair(
    lab: np.ndarray, person: np.ndarray, work_face: Face, segmentation: HairSegmentation, crop: HeadCrop
) -> HairEvidence:
    """`lab`, `person` and `work_face` are in the working frame of `crop`. A claim needs its
    evidence (analysis.md § Statuses and claims): no top of the head in view is
    `uncertain`, not bald; a skin-coloured top is bald only when `scalp` finds a bare scalp."""
    probability = segmentation.probability
    top = top_of_head(
        lab,
        person,
        work_face,
        crop.at_photo_top,
        probability[1] if probability is not None and probability[0] == crop.key else None,
    )
    colours = top.colours
    hair_delta_e = (
        None if colours.hair_median is None else float(np.linalg.norm(colours.hair_median - colours.skin_median))
    )
    low_contrast = hair_delta_e is None or hair_delta_e < LOW_CONTRAST_DELTA_E or top.light_hair

    def verdict(kind: Verdict, *notes: str) -> HairEvidence:
        return HairEvidence(kind, top, hair_delta_e, low_contrast, notes)

    if colours.top_median is None:
        return verdict("uncertain", NOTE_NO_OUTLINE)
    if _hat_covers_top(segmentation, crop, person, work_face):
        return verdict("occluded", NOTE_HAT)
    if top.cut_off and colours.skin_coloured:  # hair may begin above the frame
        return verdict("hair", NOTE_TOP_CUT)
    return verdict("hair")  # low contrast is noted by the hairline checks, unless two views agree


def _hat_covers_top(segmentation: HairSegmentation, crop: HeadCrop, person: np.ndarray, work_face: Face) -> bool:
    if segmentation.hat is None or not segmentation.hat.any():
        return False
    hat = crop.mask_in_work(segmentation.hat) >= 0.5
    # the hat itself is the head outline, so look at the band below the outline
    top = top_of_head_mask(person | hat, work_face)
    return bool(top.any()) and float(hat[top].mean()) >= HAT_FRACTION
