"""Colour evidence about a head: where skin and scalp hair are sampled, in Lab (`to_lab`).

Shared by the fallback segmenter (to seed GrabCut) and the hair-evidence checks (to
decide "no hairline visible" before any mask is trusted), so both read the same pixels.
Everything here works in the coordinates of the array it is given.
"""

from __future__ import annotations

from dataclasses import dataclass

import cv2
import numpy as np

from ..types import Face, LandmarkId

# cheek and nose-bridge points: skin on nearly every face (beards start lower, fringes higher)
SKIN_LANDMARKS = (50, 280, 205, 425, 197, 195)
# face-oval ring of the MediaPipe mesh, in drawing order
FACE_OVAL = (
    10,
    338,
    297,
    332,
    284,
    251,
    389,
    356,
    454,
    323,
    361,
    288,
    397,
    365,
    379,
    378,
    400,
    377,
    152,
    148,
    176,
    149,
    150,
    136,
    172,
    58,
    132,
    93,
    234,
    127,
    162,
    21,
    54,
    103,
    67,
    109,
)
# ΔE (OpenCV 8-bit Lab, see `to_lab`) under which a colour is "explained" by cheek skin;
# measured: bald scalps 21-23 from their cheeks, white hair on pink skin 30, brown hair 50+
SKIN_DELTA_E = 25.0
# share of the top of the head the skin explains from which it counts as bare scalp
# (measured: bald scalps 52-78 %, hair <= 29 %)
BALD_SKIN_FRACTION = 0.40


def to_lab(rgb: np.ndarray) -> np.ndarray:
    """Lab in OpenCV's 8-bit convention (L scaled to 0-255, a/b offset by 128), as float32.

    Every ΔE threshold in this package is a Euclidean distance in these units: lightness
    counts 2.55x more than in CIE76, which is what separates white hair from pale skin.
    """
    return cv2.cvtColor(np.ascontiguousarray(rgb, dtype=np.uint8), cv2.COLOR_RGB2Lab).astype(np.float32)


def face_height_px(face: Face) -> float:
    """Mesh top (10) to menton (152): the face-oval height every scale here is tied to."""
    return float(np.linalg.norm(face.points[LandmarkId.MENTON] - face.points[LandmarkId.MESH_TOP]))


def face_width_px(face: Face) -> float:
    return float(np.linalg.norm(face.points[454] - face.points[234]))


@dataclass(frozen=True)
class ColourModel:
    """A Gaussian in Lab: median as centre (robust to a few stray pixels)."""

    centre: np.ndarray  # (3,)
    inverse_covariance: np.ndarray  # (3, 3)

    @classmethod
    def fit(cls, samples: np.ndarray, floor: float = 4.0) -> ColourModel:
        centre = np.median(samples, axis=0)
        covariance = np.cov(samples.T) if len(samples) > 3 else np.zeros((3, 3))
        # the floor keeps a flat, evenly lit patch from making every other pixel "far"
        covariance = covariance + np.eye(3) * floor
        return cls(centre=centre.astype(np.float32), inverse_covariance=np.linalg.inv(covariance).astype(np.float32))

    def distance(self, lab: np.ndarray) -> np.ndarray:
        """Mahalanobis distance of each Lab pixel (any leading shape) to this model."""
        delta = lab - self.centre
        return np.sqrt(np.einsum("...i,ij,...j->...", delta, self.inverse_covariance, delta))


def skin_mask(shape: tuple[int, ...], face: Face) -> np.ndarray:
    """Small disks on the cheeks and the nose bridge: the face's own skin."""
    radius = max(2, round(0.04 * face_width_px(face)))
    mask = np.zeros(shape, np.uint8)
    for index in SKIN_LANDMARKS:
        x, y = face.points[index]
        cv2.circle(mask, (round(x), round(y)), radius, (1,), -1)
    return mask.astype(bool)


def skin_samples(lab: np.ndarray, face: Face) -> np.ndarray:
    """Lab pixels from small disks on the cheeks and the nose bridge."""
    return lab[skin_mask(lab.shape[:2], face)]


def brow_strip_mask(shape: tuple[int, ...], face: Face, height_fraction: float = 0.025) -> np.ndarray:
    """Forehead skin just above the brows: skin even under a long fringe, and lit like the
    forehead (cheek skin alone misses how much lighter a forehead can be)."""
    brows = face.points[list(LandmarkId.LEFT_BROW_UPPER + LandmarkId.RIGHT_BROW_UPPER)]
    brows = brows[np.argsort(brows[:, 0])]
    lift = height_fraction * face_height_px(face)
    upper = brows - np.array([0.0, lift])
    ring = np.round(np.concatenate([brows, upper[::-1]])).astype(np.int32)
    mask = np.zeros(shape, np.uint8)
    cv2.fillPoly(mask, [ring], (1,))
    return mask.astype(bool)


def brow_curve(face: Face, columns: np.ndarray) -> np.ndarray:
    """Upper edge of the brows at each column, joined straight across the glabella and
    held level beyond the outer brow ends."""
    brows = face.points[list(LandmarkId.LEFT_BROW_UPPER + LandmarkId.RIGHT_BROW_UPPER)]
    brows = brows[np.argsort(brows[:, 0])]
    return np.interp(columns, brows[:, 0], brows[:, 1])


def face_oval_mask(shape: tuple[int, ...], face: Face) -> np.ndarray:
    mask = np.zeros(shape, np.uint8)
    ring = np.round(face.points[list(FACE_OVAL)]).astype(np.int32)
    cv2.fillPoly(mask, [ring], (1,))
    return mask.astype(bool)


def head_outline_rows(person: np.ndarray) -> np.ndarray:
    """Per column, the first person row from the top (the head outline); H where none."""
    has_person = person.any(axis=0)
    first = np.argmax(person, axis=0)
    return np.where(has_person, first, person.shape[0])


def top_of_head_mask(person: np.ndarray, face: Face) -> np.ndarray:
    """The scalp region just inside the head outline, over the central face width.

    This is where hair is on anyone who has hair, and where bare scalp is on a bald or
    receded head -- unlike a fixed band above landmark 10, which is forehead skin on
    exactly the clients this product is for.
    """
    height, width = person.shape
    points = face.points
    mesh_top_y = points[LandmarkId.MESH_TOP][1]
    centre_x = points[LandmarkId.MESH_TOP][0]
    half = 0.3 * face_width_px(face)
    left, right = int(max(0, centre_x - half)), int(min(width, centre_x + half + 1))
    depth_from, depth_to = 0.02 * face_height_px(face), 0.12 * face_height_px(face)
    outline = head_outline_rows(person)
    rows = np.arange(height)[:, None]
    columns = np.zeros(width, bool)
    columns[left:right] = True
    inside = (rows >= outline[None, :] + depth_from) & (rows <= outline[None, :] + depth_to)
    # never below the mesh top: on a shaved head the outline can be a forehead away
    return inside & columns[None, :] & (rows < mesh_top_y) & person


@dataclass(frozen=True)
class HeadColours:
    """What the top of the head looks like compared with the cheeks."""

    skin: ColourModel
    skin_median: np.ndarray  # Lab
    top_median: np.ndarray | None  # Lab median of the whole top-of-head region
    hair_median: np.ndarray | None  # Lab median of its pixels the skin model does not explain
    top_skin_fraction: float  # share of the top-of-head region the skin model explains
    hair_seed: np.ndarray  # bool mask: top-of-head pixels that are not skin

    @property
    def top_delta_e(self) -> float | None:
        """ΔE of the top of the head's median colour from the cheek skin."""
        return None if self.top_median is None else float(np.linalg.norm(self.top_median - self.skin_median))

    @property
    def skin_coloured(self) -> bool:
        """The top of the head has the colour of skin: its median within SKIN_DELTA_E of
        the cheeks, or at least BALD_SKIN_FRACTION of it skin-coloured. False when the
        top of the head is not in view (nothing to judge). Colour alone is no evidence of
        a bare scalp: light hair passes too (`scalp.TopOfHead.bare_scalp` decides)."""
        delta_e = self.top_delta_e
        return delta_e is not None and (delta_e < SKIN_DELTA_E or self.top_skin_fraction >= BALD_SKIN_FRACTION)

    def skin_explained(self, lab: np.ndarray) -> np.ndarray:
        """Which pixels of `lab` lie within SKIN_DELTA_E of the cheek skin."""
        return np.linalg.norm(lab - self.skin_median, axis=-1) < SKIN_DELTA_E


def head_colours(lab: np.ndarray, person: np.ndarray, face: Face) -> HeadColours:
    skin = skin_samples(lab, face)
    skin_model = ColourModel.fit(skin)
    region = top_of_head_mask(person, face)
    pixels = lab[region]
    if len(pixels) == 0:
        return HeadColours(skin_model, np.median(skin, axis=0), None, None, 0.0, region)
    skin_median = np.median(skin, axis=0)
    explained = np.linalg.norm(pixels - skin_median, axis=1) < SKIN_DELTA_E
    seed = region.copy()
    seed[region] = ~explained
    hair_pixels = pixels[~explained]
    return HeadColours(
        skin=skin_model,
        skin_median=skin_median,
        top_median=np.median(pixels, axis=0),
        hair_median=np.median(hair_pixels, axis=0) if len(hair_pixels) else None,
        top_skin_fraction=float(explained.mean()),
        hair_seed=seed,
    )
