"""The frontal hairline: traced from a hair mask, then judged before any number leaves.

Order matters (analysis.md § Real photos): first `hair_evidence` decides whether there is
a hairline to measure at all (bald -> `no_hairline`, hat -> `occluded`); only then is the
mask traced (`trace`), column by column between the outer brow ends, from the
brow curve up to the head outline; the trichion is the median edge over +-0.1 face widths around the midline;
a cap's band taken for hair (`headwear`) is `occluded`; plausibility gates and the
fringe check (`checks`) turn doubt into `uncertain` (with notes and a wide band)
or `occluded`. Everything runs in the working frame of
`HeadCrop` and is mapped back to image pixels at the end.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ..face.calibration import calibrate
from ..face.head_crop import HeadCrop
from ..face.head_samples import face_height_px, to_lab
from ..types import Calibration, Face, Hairline, HairSegmentation
from .checks import judge
from .hair_evidence import NOTE_BALD, NOTE_HAT, HairEvidence, assess_hair
from .headwear import CAP_CROWN_GAP, NOTE_DARK_BAND, crown_gap, headwear_band
from .trace import MIDLINE_HALF_WINDOW, Trace, bridge_parting, trace_edges

MIN_MIDLINE_COVERAGE = 0.5  # share of midline columns that must show an edge

# a parting's skin wedge: rising at least this many face heights (~2.5 mm) above the line
# its two sides make (`trace.bridge_parting`)
PARTING_RISE = 0.02
NOTE_NOT_FOUND = "前额中部未见头发边缘，无法定位发际线"


def trace_hairline(rgb: np.ndarray, face: Face, segmentation: HairSegmentation, calibration: Calibration) -> Hairline:
    """The hairline and its status (contract.md endpoint 1); never raises for "not found".
    `calibration` may be the photo's while `rgb` and `face` are a resized copy of it (the
    endpoints turn a rolled head upright on a smaller canvas): see `_in_pixels_of`."""
    traced = _traced(rgb, face, segmentation)
    if isinstance(traced, Hairline):
        return traced
    if traced.headwear is not None:
        return Hairline(status="occluded", notes=(NOTE_HAT,))  # the evidence read the cap's crown
    return judge(
        traced.trace,
        traced.work_face,
        traced.hair,
        traced.lab,
        traced.crop,
        _in_pixels_of(face, calibration),
        traced.evidence,
        segmentation.segmenter == "fallback",
    )


def headwear_in_mask(rgb: np.ndarray, face: Face, segmentation: HairSegmentation) -> np.ndarray | None:
    """The cap's band that makes `trace_hairline` answer `occluded` (`headwear`), as a
    boolean mask of `rgb`'s pixels; None when the hair mask holds none."""
    traced = _traced(rgb, face, segmentation)
    if isinstance(traced, Hairline) or traced.headwear is None:
        return None
    return traced.crop.paste(traced.headwear, rgb.shape[:2])


def midline_edge(rgb: np.ndarray, face: Face, segmentation: HairSegmentation) -> tuple[float, float] | None:
    """The mask's traced lower edge on the midline (the median over the trichion's window),
    in image pixels, before any check judges it: where a fringe hides the hairline, the
    fringe's edge. None where nothing was traced (bald, hat, no edge)."""
    traced = _traced(rgb, face, segmentation)
    if isinstance(traced, Hairline):
        return None
    window = traced.trace.near(0.0, MIDLINE_HALF_WINDOW)
    found = window[~np.isnan(window)]
    point = traced.crop.to_image(traced.trace.frame.to_image(np.array([[0.0, float(np.median(found))]])))[0]
    return float(point[0]), float(point[1])


@dataclass(frozen=True)
class _Traced:
    """The mask's lower edge in the working frame, and what it was traced from."""

    crop: HeadCrop
    work_face: Face
    lab: np.ndarray
    hair: np.ndarray  # coverage
    evidence: HairEvidence
    trace: Trace
    headwear: np.ndarray | None  # a cap's band the mask took for hair


def _traced(rgb: np.ndarray, face: Face, segmentation: HairSegmentation) -> _Traced | Hairline:
    """The traced edge, or the answer when there is none to trace (bald, hat, no edge)."""
    crop = HeadCrop.around(face)
    work_face = crop.face_in_work(face)
    person = crop.mask_in_work(segmentation.person) >= 0.5
    lab = to_lab(crop.cut_reusing(segmentation, rgb))
    evidence = assess_hair(lab, person, work_face, segmentation, crop)
    if evidence.verdict != "hair":
        return Hairline(status=evidence.verdict, notes=evidence.notes)
    hair = crop.mask_in_work(segmentation.hair)
    trace, _ = bridge_parting(trace_edges(hair, person, work_face), PARTING_RISE * face_height_px(work_face))
    window = trace.near(0.0, MIDLINE_HALF_WINDOW)
    found = window[~np.isnan(window)]
    if len(found) < MIN_MIDLINE_COVERAGE * max(1, len(window)):
        # an empty or edgeless mask is no evidence of a bare scalp by itself
        if segmentation.scalp_seen:
            return Hairline(status="no_hairline", notes=(*evidence.notes, NOTE_BALD))
        return Hairline(status="uncertain", notes=(*evidence.notes, NOTE_NOT_FOUND))
    midline = trace.in_window(0.0, MIDLINE_HALF_WINDOW)
    band = headwear_band(trace, midline, hair, lab, work_face)
    # a flat dark band is a cap only with a cap's crown above it, in view: very dark, flat
    # hair (a parting's two sides) and hair the frame cuts off are hair, their edge uncertain
    is_a_cap = (
        band is not None
        and not evidence.top.cut_off
        and crown_gap(trace.points[midline, 0].astype(int), hair, person, work_face) >= CAP_CROWN_GAP
    )
    if band is not None and not is_a_cap:
        evidence = replace(evidence, notes=(*evidence.notes, NOTE_DARK_BAND))
    return _Traced(crop, work_face, lab, hair, evidence, trace, band if is_a_cap else None)


def _in_pixels_of(face: Face, calibration: Calibration) -> Calibration:
    """The calibration in `face`'s own pixels: the same millimetres per iris, whatever
    canvas the face was drawn on. Every threshold of the hairline checks is in mm, so a
    photo's scale used on a smaller canvas shrank the forehead and the band by the canvas
    scale (a 58 mm forehead read as < 40 mm)."""
    own = calibrate(face)
    ratio = calibration.iris_diameter_px / own.iris_diameter_px
    if abs(ratio - 1.0) < 1e-6:
        return calibration
    return replace(
        calibration,
        mm_per_px=calibration.mm_per_px * ratio,
        iris_diameter_px=own.iris_diameter_px,
        left_iris_px=own.left_iris_px,
        right_iris_px=own.right_iris_px,
    )
