"""Copies of a labelled photo that change nothing about where its hairline is (issue 27):
its hair recoloured light through the hair network's own mask, and its top cropped just
above the hair. The truth stays where it was (cropping shifts it by the rows cut).

A dye colours hair, not skin: inside the mask, a pixel the face's skin model explains (the
scalp between sparse hairs, a thinning forelock) keeps its colour. Painting the whole mask
turned deepface_img33's sparse tuft into a solid block of light "hair" and moved its
hairline down by the tuft (docs/analysis_science.md § Robustness copies)."""

from __future__ import annotations

import cv2
import numpy as np

from analysis.face.head_samples import ColourModel, brow_strip_mask, skin_mask, to_lab
from analysis.types import Face

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


def recoloured(rgb: np.ndarray, hair: np.ndarray, face: Face, colour: str) -> np.ndarray:
    """`rgb` with the hair pixels of the boolean `hair` mask turned `colour` (LIGHT_HAIR_LAB);
    the skin inside the mask (`face`'s own skin colour) is left as it is."""
    lab = to_lab(rgb)
    skin = ColourModel.fit(lab[skin_mask(lab.shape[:2], face) | brow_strip_mask(lab.shape[:2], face)])
    hairness = np.clip((skin.distance(lab) - SKIN_DISTANCE) / (HAIR_DISTANCE - SKIN_DISTANCE), 0.0, 1.0)
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
    weight = (cv2.GaussianBlur(hair.astype(np.float32), (0, 0), FEATHER_PX) * hairness)[..., None]
    mixed = (1 - weight) * lab + weight * new
    return cv2.cvtColor(np.clip(np.rint(mixed), 0, 255).astype(np.uint8), cv2.COLOR_Lab2RGB)


def cropped_above_hair(rgb: np.ndarray, hair: np.ndarray) -> tuple[np.ndarray, int]:
    """`rgb` with its rows above the hair's top cut off (a margin left), and the rows cut."""
    rows = np.nonzero(hair.any(axis=1))[0]
    first = 0 if len(rows) == 0 else max(0, int(rows[0] - CROP_MARGIN * rgb.shape[0]))
    return np.ascontiguousarray(rgb[first:]), first
