"""Is the top of the head bare scalp? Claimed only on positive evidence of skin.

`no_hairline` says "bald or shaved": a claim about the photo (analysis.md § Statuses and
claims), so it needs skin where hair would be, never only a weak hair mask. The top of the
head, just inside its outline (`head_samples.top_of_head_mask`), is bare scalp when all
three views say skin:
- colour: its median within ΔE 25 of the cheeks, or >= 40 % of it skin-coloured
  (`HeadColours.skin_coloured`, the test of issue 11);
- texture: its skin-coloured pixels are as smooth as the face's own skin. Hair has strands;
  a scalp is skin. The measure is the mean absolute high-pass of lightness (L minus its
  Gaussian blur, `TEXTURE_SIGMA_PX` working px) over those pixels, divided by the same over
  the cheek and nose-bridge disks. Measured on the 34 labelled photos: the three bald heads
  0.64-0.88; every haired head whose top reads skin-coloured 1.2 (thin white hair) to 2.45
  (red hair 2.35), the others higher still;
- the hair network (when there is one): it is not sure of hair there, mean probability
  under `NETWORK_SURE` (bald heads 0.30-0.55, its scalp ring; the light-haired heads the
  colour test calls skin 0.96-1.00).
Where colour says skin but texture or the network says hair, the hair is light (blonde,
red, white, grey) and close to the skin's colour: hair, low contrast (`light_hair`), and the
hairline checks decide how far to trust its edge.
And the top of the head must be in the photo: where the head outline runs along the
photo's top edge over most of the central columns (`CUT_SHARE`), the region "just inside
the outline" is whatever the frame's edge cuts through (forehead skin under curls), not
the top of the head: no claim of baldness can be read from it.
"""

from __future__ import annotations

from dataclasses import dataclass

import cv2
import numpy as np

from ..face.head_samples import HeadColours, face_width_px, head_colours, head_outline_rows, skin_mask, top_of_head_mask
from ..types import Face, LandmarkId

TEXTURE_SIGMA_PX = 1.5  # working px (faces 160 px tall): strands are a pixel or two wide there
SMOOTH_SCALP_RATIO = 1.05  # high-pass energy of a bare scalp / the cheeks' (bald 0.64-0.88, hair >= 1.2)
NETWORK_SURE = 0.8  # mean hair probability over the top of the head (bald <= 0.55, light hair >= 0.96)
CUT_SHARE = 0.5  # share of the central columns whose head outline is the photo's top edge
CUT_ROWS = 1  # working px: an outline this close to the top edge is the edge


@dataclass(frozen=True)
class TopOfHead:
    """What the top of the head shows, with the numbers behind it (for tests and logs)."""

    colours: HeadColours
    texture_ratio: float | None  # high-pass of the skin-coloured top / the cheeks'; None: no such pixel
    network_hair: float | None  # the network's mean probability there; None: no network
    cut_off: bool  # the photo's top edge cuts the head

    @property
    def smooth(self) -> bool:
        return self.texture_ratio is not None and self.texture_ratio <= SMOOTH_SCALP_RATIO

    @property
    def network_sees_hair(self) -> bool:
        return self.network_hair is not None and self.network_hair >= NETWORK_SURE

    @property
    def bare_scalp(self) -> bool:
        """Skin where hair would be: skin-coloured, smooth as the face, no network sure of hair."""
        return self.colours.skin_coloured and not self.cut_off and self.smooth and not self.network_sees_hair

    @property
    def light_hair(self) -> bool:
        """Skin-coloured, but with strands or seen by the network: hair close to the skin."""
        return self.colours.skin_coloured and not self.bare_scalp


def top_of_head(
    lab: np.ndarray, person: np.ndarray, face: Face, at_photo_top: bool, probability: np.ndarray | None = None
) -> TopOfHead:
    """`lab`, `person` (bool), `face` and `probability` (the network's, or None) in one
    working frame; `at_photo_top`: that frame's row 0 is the photo's top edge."""
    colours = head_colours(lab, person, face)
    region = top_of_head_mask(person, face)
    cut_off = at_photo_top and _outline_at_top(person, face)
    if not region.any():
        return TopOfHead(colours, None, None, cut_off)
    lightness = lab[..., 0]
    detail = np.abs(lightness - cv2.GaussianBlur(lightness, (0, 0), TEXTURE_SIGMA_PX))
    skin_pixels = region & colours.skin_explained(lab)
    reference = float(detail[skin_mask(lab.shape[:2], face)].mean())
    texture = float(detail[skin_pixels].mean()) / max(reference, 1e-3) if skin_pixels.any() else None
    network = None if probability is None else float(probability[region].mean())
    return TopOfHead(colours, texture, network, cut_off)


def _outline_at_top(person: np.ndarray, face: Face) -> bool:
    centre = face.points[LandmarkId.MESH_TOP][0]
    half = 0.3 * face_width_px(face)
    left, right = int(max(0, centre - half)), int(min(person.shape[1], centre + half + 1))
    if right <= left:
        return False
    return float(np.mean(head_outline_rows(person)[left:right] <= CUT_ROWS)) >= CUT_SHARE


def may_be_a_ring(top: TopOfHead) -> bool:
    """Whether the network's thin band over the midline (`subject_hair.is_scalp_ring`) can
    be its ring on a bald scalp: not where the photo's edge cuts the head (the band under
    the "outline" is then whatever hair the frame left), nor where the top of the head
    shows strands (skin-coloured pixels there textured like hair, not like the face)."""
    return not top.cut_off and (top.texture_ratio is None or top.smooth)
