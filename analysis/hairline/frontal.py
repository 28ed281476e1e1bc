"""The frontal hairline: traced from a hair mask, then judged before any number leaves.

Order matters (analysis.md § Real photos): first `hair_evidence` reads the top of the head
(a hat -> `occluded`; its numbers are the bald model's evidence); then the
mask is traced (`trace`), column by column between the outer brow ends, from the
brow curve up to the head outline; the trichion is the median edge over +-0.1 face widths around the midline;
a cap's band taken for hair (`headwear`) is `occluded`; plausibility gates and the
fringe check (`checks`) add notes or answer `occluded`; the fitted decision layer
(`decision`) weighs the evidence: bald, `ok` or `uncertain`, and the band. Everything runs in the working frame of
`HeadCrop` and is mapped back to image pixels at the end.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from ..face.calibration import calibrate
from ..face.head_crop import HeadCrop
from ..face.head_samples import face_height_px, to_lab
from ..types import Calibration, Face, Hairline, HairSegmentation
from .checks import judge
from .decision import Candidate, Decision, Evidence, decide
from .hair_evidence import NOTE_HAT, HairEvidence, assess_hair
from .headwear import CAP_CROWN_GAP, NOTE_DARK_BAND, crown_gap, headwear_band
from .trace import MIDLINE_HALF_WINDOW, Trace, bridge_parting, trace_edges

MIN_MIDLINE_COVERAGE = 0.5  # share of midline columns that must show an edge

# a parting's skin wedge: rising at least this many face heights (~2.5 mm) above the line
# its two sides make (`trace.bridge_parting`)
PARTING_RISE = 0.02
NOTE_NOT_FOUND = "前额中部未见头发边缘，无法定位发际线"


def trace_hairline(
    rgb: np.ndarray,
    face: Face,
    segmentation: HairSegmentation,
    calibration: Calibration,
    decision: Decision | None = None,
) -> Hairline:
    """The hairline and its status (contract.md endpoint 1); never raises for "not found".
    `calibration` may be the photo's while `rgb` and `face` are a resized copy of it (the
    endpoints turn a rolled head upright on a smaller canvas): see `_in_pixels_of`.
    `decision`: the fitted parameters (default: the shipped file)."""
    return decide(hairline_candidate(rgb, face, segmentation, calibration), decision)


def hairline_candidate(
    rgb: np.ndarray, face: Face, segmentation: HairSegmentation, calibration: Calibration
) -> Candidate:
    """What tracing found and the evidence the decision weighs (the eval script fits on it)."""
    traced = _traced(rgb, face, segmentation)
    if isinstance(traced, Candidate):
        return traced
    if traced.headwear is not None:  # the evidence read the cap's crown
        return Candidate(Hairline(status="occluded", notes=(NOTE_HAT,)), Evidence(traced.bald), settled=True)
    return judge(
        traced.trace,
        traced.work_face,
        traced.hair,
        traced.lab,
        traced.crop,
        _in_pixels_of(face, calibration),
        traced.evidence,
        segmentation.segmenter == "fallback",
        traced.bald,
    )


def headwear_in_mask(rgb: np.ndarray, face: Face, segmentation: HairSegmentation) -> np.ndarray | None:
    """The cap's band that makes `trace_hairline` answer `occluded` (`headwear`), as a
    boolean mask of `rgb`'s pixels; None when the hair mask holds none."""
    traced = _traced(rgb, face, segmentation)
    if isinstance(traced, Candidate) or traced.headwear is None:
        return None
    return traced.crop.paste(traced.headwear, rgb.shape[:2])


def midline_edge(rgb: np.ndarray, face: Face, segmentation: HairSegmentation) -> tuple[float, float] | None:
    """The mask's traced lower edge on the midline (the median over the trichion's window),
    in image pixels, before any check judges it: where a fringe hides the hairline, the
    fringe's edge. None where nothing was traced (bald, hat, no edge)."""
    traced = _traced(rgb, face, segmentation)
    if isinstance(traced, Candidate):
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
    bald: dict[str, float]  # the bald model's evidence


def _traced(rgb: np.ndarray, face: Face, segmentation: HairSegmentation) -> _Traced | Candidate:
    """The traced edge, or the candidate answer when there is none to trace (a hat, no head
    outline, no edge on the midline)."""
    crop = HeadCrop.around(face)
    work_face = crop.face_in_work(face)
    person = crop.mask_in_work(segmentation.person) >= 0.5
    lab = to_lab(crop.cut_reusing(segmentation, rgb))
    evidence = assess_hair(lab, person, work_face, segmentation, crop)
    if evidence.verdict != "hair":  # a hat, or no top of the head to judge: seen directly
        return Candidate(Hairline(status=evidence.verdict, notes=evidence.notes), Evidence({}), settled=True)
    hair = crop.mask_in_work(segmentation.hair)
    trace, _ = bridge_parting(trace_edges(hair, person, work_face), PARTING_RISE * face_height_px(work_face))
    window = trace.near(0.0, MIDLINE_HALF_WINDOW)
    found = window[~np.isnan(window)]
    coverage = len(found) / max(1, len(window))
    bald = bald_evidence(evidence)
    if coverage < MIN_MIDLINE_COVERAGE:  # the bald model decides whether this is a bare scalp
        return Candidate(Hairline(status="uncertain", notes=(*evidence.notes, NOTE_NOT_FOUND)), Evidence(bald))
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
    return _Traced(crop, work_face, lab, hair, evidence, trace, band if is_a_cap else None, bald)


def bald_evidence(evidence: HairEvidence) -> dict[str, float]:
    """The bald model's features (`decision.BALD_FEATURES`): the top of the head against the
    face's own skin, whatever the mask's edge (a bald head's mask may hold a ring, or
    nothing; the frame may cut its crown); NaN where a view is missing."""
    top, colours = evidence.top, evidence.top.colours
    return {
        "top_delta_e": math.nan if colours.top_delta_e is None else colours.top_delta_e,
        "top_skin_fraction": colours.top_skin_fraction,
        "log_texture_ratio": math.nan if not top.texture_ratio else math.log(top.texture_ratio),
        "network_hair": math.nan if top.network_hair is None else top.network_hair,
    }


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
