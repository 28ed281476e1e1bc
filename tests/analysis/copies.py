"""Copies of a labelled photo that change nothing about where its hairline is (issue 27):
its hair recoloured light through the hair network's own mask, and its top cropped just
above the hair. The truth stays where it was (cropping shifts it by the rows cut).

A dye colours hair, not skin: inside the mask, a pixel the face's skin model explains (the
scalp between sparse hairs, a thinning forelock) keeps its colour. Painting the whole mask
turned deepface_img33's sparse tuft into a solid block of light "hair" and moved its
hairline down by the tuft (docs/analysis_science.md § Robustness copies). That dye, and one
with the network's probability as its opacity, are here for measuring only
(scripts/sweep_copies.py): the acceptance makes its own copies."""

from __future__ import annotations

from typing import Any

import cv2
import numpy as np

from analysis.face.head_crop import HeadCrop
from analysis.face.head_samples import ColourModel, brow_strip_mask, skin_mask, to_lab
from analysis.types import Face, Hairline, HairSegmentation

from .test_real_photos import OK_WITHIN_MM

# target hair colours in OpenCV 8-bit Lab (L 0-255, a/b offset by 128). The lightness of
# the hair's own strands is kept about the new mean and its spread widened: light hair shows
# the shadows between its strands (the band above the hairline: lightness SD 25-35 on the
# labelled blonde photos, 12-16 on the dark ones); at the dark hair's own spread a black
# head recoloured is a flat cap of one colour, which no one would call hair either
LIGHT_HAIR_LAB = {"blonde": (190.0, 134.0, 165.0), "white": (225.0, 128.0, 131.0)}
LIGHTNESS_SPREAD = 1.5
FEATHER_PX = 1.5  # the mask's edge is blended, as a recolouring in an editor would be
# Mahalanobis distance to the face's skin (cheeks, nose bridge, the strip above the brows)
# under which a pixel is skin (not dyed) and over which it is hair (dyed), blended between
SKIN_DISTANCE, HAIR_DISTANCE = 3.0, 6.0
CROP_MARGIN = 0.02  # of the photo's height left above the hair's top
DYES = ("skin-kept", "whole-mask", "probability")  # `copy_of`; only the first is the tests'
PROBABILITY_REACH_PX = 4  # photo px beyond the subject's mask the probability dye may paint


def recoloured(rgb: np.ndarray, hair: np.ndarray, face: Face, colour: str) -> np.ndarray:
    """`rgb` with the hair pixels of the boolean `hair` mask turned `colour` (LIGHT_HAIR_LAB);
    the skin inside the mask (`face`'s own skin colour) is left as it is."""
    lab = to_lab(rgb)
    skin = ColourModel.fit(lab[skin_mask(lab.shape[:2], face) | brow_strip_mask(lab.shape[:2], face)])
    hairness = np.clip((skin.distance(lab) - SKIN_DISTANCE) / (HAIR_DISTANCE - SKIN_DISTANCE), 0.0, 1.0)
    return _dyed(lab, _feathered(hair) * hairness, hair, colour)


def painted_whole_mask(rgb: np.ndarray, hair: np.ndarray, colour: str) -> np.ndarray:
    """The naive recolouring, for measuring only (scripts/sweep_copies.py): the whole mask
    painted, the skin it holds included."""
    return _dyed(to_lab(rgb), _feathered(hair), hair, colour)


def painted_by_probability(rgb: np.ndarray, segmentation: HairSegmentation, face: Face, colour: str) -> np.ndarray:
    """The hair network's own probability as the paint's opacity (within PROBABILITY_REACH_PX
    of the subject's mask: another person's hair stays as it was), for measuring only."""
    if segmentation.probability is None:
        raise ValueError(f"the {segmentation.segmenter} segmenter gives no probability")
    head = HeadCrop.around(face)
    opacity = np.zeros(rgb.shape[:2], np.float32)
    size = (head.x1 - head.x0, head.y1 - head.y0)
    opacity[head.y0 : head.y1, head.x0 : head.x1] = cv2.resize(segmentation.probability[1], size)
    reach = np.ones((2 * PROBABILITY_REACH_PX + 1,) * 2, np.uint8)
    near = cv2.dilate(segmentation.hair.astype(np.uint8), reach) > 0
    return _dyed(to_lab(rgb), np.clip(opacity, 0.0, 1.0) * near, segmentation.hair, colour)


def _feathered(hair: np.ndarray) -> np.ndarray:
    return cv2.GaussianBlur(hair.astype(np.float32), (0, 0), FEATHER_PX)


def _dyed(lab: np.ndarray, weight: np.ndarray, hair: np.ndarray, colour: str) -> np.ndarray:
    """`lab` mixed by `weight` (0-1) with `colour`, the hair's lightness kept about its new mean."""
    target_l, target_a, target_b = LIGHT_HAIR_LAB[colour]
    lightness = lab[..., 0]
    mean = float(lightness[hair].mean()) if hair.any() else 0.0
    new = np.stack(
        [
            np.clip(target_l + LIGHTNESS_SPREAD * (lightness - mean), 0, 255),
            np.full_like(lightness, target_a),
            np.full_like(lightness, target_b),
        ],
        axis=-1,
    )
    mixed = (1 - weight[..., None]) * lab + weight[..., None] * new
    return cv2.cvtColor(np.clip(np.rint(mixed), 0, 255).astype(np.uint8), cv2.COLOR_Lab2RGB)


# a headscarf over the hairline (`scarved`): flat cloth in these RGB colours, one close to
# skin (the bald model's hardest case: smooth and skin-coloured like a scalp) and one not
SCARF_RGB = {"beige": (200, 190, 170), "blue": (40, 60, 150)}
SCARF_BELOW_HAIR = 0.06  # face heights the cloth reaches below the hair's edge, over the line
SCARF_SHADE = 0.05  # the cloth's lightness varies this much (folds, weave), not like strands


def scarved(rgb: np.ndarray, hair: np.ndarray, face: Face, colour: str) -> np.ndarray:
    """`rgb` with the hair of the boolean `hair` mask, and the forehead SCARF_BELOW_HAIR face
    heights below it (but not below landmark 10), under a flat cloth of SCARF_RGB[colour]: a
    covered hairline, which no answer may give a number for or call bald."""
    points = face.points
    reach = max(1, int(SCARF_BELOW_HAIR * (points[152, 1] - points[10, 1])))
    lowered = np.zeros_like(hair)
    lowered[reach:] = hair[:-reach]
    rows = np.arange(rgb.shape[0])[:, None]
    cloth = cv2.dilate(hair.astype(np.uint8), np.ones((9, 9), np.uint8)).astype(bool) | lowered
    cloth &= rows < points[10, 1]
    shade = 1.0 + SCARF_SHADE * np.random.default_rng(0).standard_normal(rgb.shape[:2])
    painted = np.clip(np.array(SCARF_RGB[colour], float)[None, None, :] * shade[..., None], 0, 255)
    return np.where(cloth[..., None], painted.astype(np.uint8), rgb)


def cropped_above_hair(rgb: np.ndarray, hair: np.ndarray, margin: float = CROP_MARGIN) -> tuple[np.ndarray, int]:
    """`rgb` with its rows above the hair's top cut off (`margin` of the height left), and the
    rows cut."""
    rows = np.nonzero(hair.any(axis=1))[0]
    first = 0 if len(rows) == 0 else max(0, int(rows[0] - margin * rgb.shape[0]))
    return np.ascontiguousarray(rgb[first:]), first


def copy_of(rgb: np.ndarray, face: Face, segmentation: HairSegmentation, name: str) -> tuple[np.ndarray, int]:
    """The copy called `name`, and the rows it cut off the top: "top cropped" (CROP_MARGIN
    left) or "top cropped <margin>", "<colour>" dyed as the tests dye, or "<dye> <colour>"
    with a dye of DYES."""
    if name.startswith("top cropped"):
        margin = name.removeprefix("top cropped").strip()
        return cropped_above_hair(rgb, segmentation.hair, float(margin) if margin else CROP_MARGIN)
    dye, _, colour = name.rpartition(" ")
    if dye in ("", "skin-kept"):
        return recoloured(rgb, segmentation.hair, face, colour), 0
    if dye == "whole-mask":
        return painted_whole_mask(rgb, segmentation.hair, colour), 0
    if dye == "probability":
        return painted_by_probability(rgb, segmentation, face, colour), 0
    raise ValueError(f"no copy called {name!r}")


def problems(
    label: dict[str, Any], original: Hairline, copy: Hairline, mm_per_px: float, rows_cut: int = 0
) -> list[str]:
    """What the answer on a copy of the photo `label` describes gets wrong (empty: nothing).
    A copy changes nothing about where the hairline is, so it must not turn the photo's own
    `ok`/`uncertain` (`original`) into a claim of baldness or of a hat, a bald head stays
    bald, and a number must hold by the rule of the labelled photos: an `ok` within
    max(OK_WITHIN_MM, the label's tolerance), an `uncertain` band covering its miss.
    `mm_per_px` is the copy's calibration; `rows_cut` the rows a crop took off the top."""
    found = []
    if original.status in ("ok", "uncertain") and copy.status not in ("ok", "uncertain"):
        found.append(f"{original.status} -> {copy.status}: {copy.notes}")
    if label["kind"] == "no_hairline" and copy.status != "no_hairline":
        found.append(f"a bald head answered {copy.status}: {copy.notes}")
    if label["kind"] == "hairline" and copy.trichion is not None:
        error_mm = abs(copy.trichion[1] + rows_cut - label["trichion_row"]) * mm_per_px
        tolerance_mm = label["tolerance_px"] * mm_per_px
        allowed = max(OK_WITHIN_MM, tolerance_mm)
        if copy.status == "uncertain":
            allowed = max(tolerance_mm, copy.uncertainty_mm or 0.0)
        if error_mm > allowed:
            found.append(f"{copy.status}, {error_mm:.1f} mm off (allowed {allowed:.1f})")
    return found
