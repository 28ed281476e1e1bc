"""The fallback hair segmenter: bundled models only (MediaPipe selfie mask + GrabCut), the
last resort where the hair network (`hairnet`) cannot run, and a cross-check in tests.

Recipe (analysis.md § Hair segmentation): crop the head and resize it so the face oval is
`WORK_FACE_HEIGHT_PX` tall (a 12 MP photo costs what a 512 px one does), take the person
mask from MediaPipe selfie segmentation, build Lab colour models (skin from cheeks/nose,
hair from the top of the head just inside its outline minus what the skin model
explains, background from non-person pixels), seed GrabCut with them, keep the hair
components connected to the hair seeds, and map the masks back to full size.
"""

from __future__ import annotations

from typing import Literal

import cv2
import numpy as np

from ..face.head_crop import HeadCrop
from ..face.head_samples import HeadColours, brow_curve, brow_strip_mask, face_oval_mask, head_colours, to_lab
from ..hairline.scalp import top_of_head
from ..native_logs import quiet_native_logs
from ..types import Face, HairSegmentation, LandmarkId

GRABCUT_ITERATIONS = 1
PERSON_THRESHOLD = 0.5
NOT_SKIN_MAHALANOBIS = 4.0


class FallbackSegmenter:
    """`HairSegmenter` from bundled models; deterministic (GrabCut's RNG is reseeded).

    Known limits (README): a hat is taken for hair; a fringe is segmented as hair and the
    hairline checks report it; the person mask only covers the head crop.
    """

    name: Literal["fallback"] = "fallback"

    def __init__(self) -> None:
        quiet_native_logs()  # before mediapipe loads its native libraries
        import mediapipe as mp  # heavy: only the model process builds a segmenter

        self._selfie = mp.solutions.selfie_segmentation.SelfieSegmentation(model_selection=0)

    def close(self) -> None:
        self._selfie.close()

    def segment(self, rgb: np.ndarray, face: Face) -> HairSegmentation:
        crop = HeadCrop.around(face)
        work = crop.cut(rgb)
        work_face = crop.face_in_work(face)
        person_probability = self._selfie.process(np.ascontiguousarray(work)).segmentation_mask
        person = person_probability >= PERSON_THRESHOLD
        top = top_of_head(to_lab(work), person, work_face, crop.at_photo_top)
        hair = np.zeros(person.shape, bool) if top.bare_scalp else segment_hair(work, work_face, person_probability)
        shape = rgb.shape[:2]
        return HairSegmentation(
            segmenter="fallback",
            hair=crop.paste(hair, shape),
            person=crop.paste(person, shape),
            work=(crop.key, work),
            scalp_seen=top.bare_scalp,
        )


def segment_hair(work: np.ndarray, face: Face, person_probability: np.ndarray) -> np.ndarray:
    """Hair mask of a working-scale head crop (pure function of its inputs), for a head
    whose top is not bare scalp (`scalp`: the caller decides that)."""
    person = person_probability >= PERSON_THRESHOLD
    lab = to_lab(work)
    colours = head_colours(lab, person, face)
    seeds = colours.hair_seed
    # nothing but skin-coloured pixels on top of the head: no hair to grow from
    if seeds.sum() < 20:
        return np.zeros(person.shape, bool)
    labels = _grabcut_labels(lab, face, person_probability, colours)
    if not (labels == cv2.GC_BGD).any():
        return np.zeros(person.shape, bool)
    model_bg, model_fg = np.zeros((1, 65), np.float64), np.zeros((1, 65), np.float64)
    cv2.setRNGSeed(0)  # GrabCut's GMM initialisation is random: results would vary run to run
    cv2.grabCut(
        work, labels, (0, 0, 0, 0), model_bg, model_fg, GRABCUT_ITERATIONS, cv2.GC_INIT_WITH_MASK
    )  # rect unused with a mask
    hair = ((labels == cv2.GC_FGD) | (labels == cv2.GC_PR_FGD)) & person
    return _connected_to(hair, seeds)


def _grabcut_labels(lab: np.ndarray, face: Face, person_probability: np.ndarray, colours: HeadColours) -> np.ndarray:
    height = person_probability.shape[0]
    labels = np.full(person_probability.shape, cv2.GC_PR_BGD, np.uint8)
    not_skin = colours.skin.distance(lab) >= NOT_SKIN_MAHALANOBIS
    head = np.zeros(labels.shape, bool)
    head[: int(np.clip(face.points[LandmarkId.MENTON][1], 0, height))] = True
    labels[(person_probability >= PERSON_THRESHOLD) & not_skin & head] = cv2.GC_PR_FGD
    labels[person_probability < 0.1] = cv2.GC_BGD
    # the face from the brows down is never scalp hair (brows, beards and moustaches are
    # not what the hairline or the mask endpoint ask for)
    rows = np.arange(height)[:, None]
    lower_face = face_oval_mask(labels.shape, face) & (rows >= brow_curve(face, np.arange(labels.shape[1]))[None, :])
    labels[lower_face | brow_strip_mask(labels.shape, face)] = cv2.GC_BGD
    labels[colours.hair_seed] = cv2.GC_FGD
    return labels


def _connected_to(mask: np.ndarray, seeds: np.ndarray) -> np.ndarray:
    count, components = cv2.connectedComponents(mask.astype(np.uint8), connectivity=8)
    if count <= 1:
        return mask
    keep = np.zeros(count, bool)
    keep[np.unique(components[seeds & mask])] = True
    keep[0] = False
    return keep[components]
