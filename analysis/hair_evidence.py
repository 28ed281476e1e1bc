"""Is there a frontal hairline to measure at all? Decided BEFORE any hair mask is trusted.

A segmenter always finds "hair" somewhere; on a bald head it is the scalp, and a number
traced from that is the worst answer the product can give. So the top of the head, just
inside its outline, is compared with the cheeks first (analysis.md § Real photos):
- its median colour within ΔE 25 of the cheek skin, or >= 40 % of it skin-coloured: no
  hairline (measured: bald scalps ΔE 21-23 and 52-78 % skin; hair 30+ and <= 29 %; white
  hair on pink skin, ΔE 30, is the closest call);
- a hat (segmenters that can tell, i.e. BiSeNet) over the top of the head: occluded;
- hair colour close to skin (white, grey, sparse): the mask edge is soft -> low contrast.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from .head_crop import HeadCrop
from .head_samples import head_colours, top_of_head_mask
from .types import Face, HairSegmentation

# hair this close to the skin colour still segments, but its edge is diffuse
LOW_CONTRAST_DELTA_E = 40.0
HAT_FRACTION = 0.30

# the colour test reads light hair in a dim photo as skin (biden2's white hair at 0.7x the
# exposure: ΔE 28.7 -> 22.3 from the cheeks): the note says how to get a real answer
NOTE_BALD = "头顶以皮肤为主，未见前额发际线（光头或剃发）；如有浅色或花白头发，请在光线充足处重拍"
NOTE_HAT = "帽子遮挡了发际线，请摘帽后重拍"
NOTE_LOW_CONTRAST = "发色与肤色接近（浅色、花白或稀疏头发），发际线位置不确定"
NOTE_NO_OUTLINE = "头顶不在画面内或未能识别头部轮廓，看不到发际线：请拍摄完整的头部"

Verdict = Literal["hair", "no_hairline", "occluded"]


@dataclass(frozen=True)
class HairEvidence:
    """What the top of the head says, with the numbers behind it (for tests and logs)."""

    verdict: Verdict
    top_delta_e: float | None  # top-of-head median vs cheek skin
    top_skin_fraction: float
    hair_delta_e: float | None  # non-skin top-of-head pixels vs cheek skin
    low_contrast: bool
    notes: tuple[str, ...]


def assess_hair(lab: np.ndarray, person: np.ndarray, work_face: Face, segmentation: HairSegmentation,
                crop: HeadCrop) -> HairEvidence:
    """`lab`, `person` and `work_face` are in the working frame of `crop`."""
    colours = head_colours(lab, person, work_face)
    if colours.top_median is None:
        return HairEvidence("no_hairline", None, 0.0, None, False, (NOTE_NO_OUTLINE,))
    top_delta_e = colours.top_delta_e
    hair_delta_e = None if colours.hair_median is None else float(np.linalg.norm(colours.hair_median - colours.skin_median))
    low_contrast = hair_delta_e is None or hair_delta_e < LOW_CONTRAST_DELTA_E

    def verdict(kind: Verdict, *notes: str) -> HairEvidence:
        return HairEvidence(kind, top_delta_e, colours.top_skin_fraction, hair_delta_e, low_contrast, notes)

    if _hat_covers_top(segmentation, crop, person, work_face):
        return verdict("occluded", NOTE_HAT)
    if colours.bare_scalp:
        return verdict("no_hairline", NOTE_BALD)
    return verdict("hair")  # low contrast is noted by the hairline checks, unless two views agree


def _hat_covers_top(segmentation: HairSegmentation, crop: HeadCrop, person: np.ndarray, work_face: Face) -> bool:
    if segmentation.hat is None or not segmentation.hat.any():
        return False
    hat = crop.mask_in_work(segmentation.hat) >= 0.5
    # the hat itself is the head outline, so look at the band below the outline
    top = top_of_head_mask(person | hat, work_face)
    return bool(top.any()) and float(hat[top].mean()) >= HAT_FRACTION
