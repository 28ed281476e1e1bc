"""From a traced edge to a candidate answer: trichion, temples, shape, and the evidence of trust.

The views of the edge (mask, the image's crossing, the clear forehead) place the point and
measure how far they agree; the plausibility gates (analysis.md § Real photos) add notes.
Whether the answer is `ok` or `uncertain`, and its band, is not decided here: the numbers
go to the fitted decision layer (`decision`) as evidence. A fringe whose edge no hairline
could be at, within 5 mm of the brows or under `MIN_FOREHEAD_MM` above the glabella, hides
the hairline: `occluded` (contract.md endpoint 1: "a cap, hat or fringe hides the
hairline"), no number; a fringe edge higher up may be a low hairline: `uncertain`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from scipy.stats import theilslopes

from ..face.head_crop import HeadCrop
from ..face.head_samples import face_height_px
from ..types import Calibration, Face, Hairline, HairlineShape, LandmarkId
from .decision import Candidate, Evidence
from .edge_profile import FOREHEAD_SHARE, LIGHT_HAIR_FOREHEAD_SHARE, ClearForehead, EdgeProfile, midline_edge_profile
from .hair_evidence import NOTE_LOW_CONTRAST, HairEvidence
from .trace import MIDLINE_HALF_WINDOW, Trace

TEMPLE_HALF_WINDOW = 0.03  # face widths either side of a canthal line
RATIO_RANGE = (0.7, 2.2)  # forehead / middle third
MIN_FOREHEAD_MM = 40.0
ABOVE_MESH_TOP = 0.02  # face heights the trichion must clear landmark 10 by
MAX_BAND_HAIR = 0.30  # share of the forehead band (brows .. mesh top) labelled hair
FRINGE_TO_BROWS_MM = 5.0  # a fringe edge this close to the brows hides the whole forehead
# a photo pixel larger than this is half the 3 mm a confident answer must hold: the face is
# too small in the photo for one (an 8 px iris: a 9.1 ΔE/px "sharp" edge snapped 3.2 mm off)
MAX_OK_MM_PER_PX = 1.5
QUANTISATION_PX = 0.5  # working px
# median absolute deviation of the midline edge about its own straight line that means
# "ragged". The MAD, not half the inter-quartile range: the trichion is a median, and a
# centre parting filling a quarter of the window breaks the IQR (3.1 mm) but not the MAD
# (1.8 mm) or the median. About the line, not the median: hair swept to one side tilts a
# clean line across the window (10 mm from end to end, MAD about the median 2.8 mm).
SPREAD_MM = 2.0
# image-edge check of the midline point (edge_profile): snap only to a sharp edge <= 3 mm
# away whose left and right halves of the window agree; sharpness in ΔE per working px
# (measured: dense hair 10-24, sparse/stubble 5-7). Where the mask and a sharp image edge
# disagreed by 1-3 mm (three photos; lighter front hairs left out of the mask), the image
# edge was within 0.8 mm of the label in every case, mirrored and
# rescaled 0.7-1.5x too; the 7 mm jumps of analysis.md came from soft edges.
MAX_SNAP_MM, SHARP_EDGE = 3.0, 9.0
# two views of one line agree within this (the window's halves; a crossing and the forehead's top)
VIEWS_AGREE_MM = MAX_SNAP_MM / 2
# A sharp crossing above the mask edge says the mask took in pixels of the skin's side. Where
# the forehead's skin does not reach up to the crossing either (its top more than
# VIEWS_AGREE_MM below it), mask and forehead both place hair where the crossing places skin:
# the crossing is the upper edge of a band of a third colour, not the hairline (a copy with
# its whole mask painted white: the paint's edge, 2.5 mm above the fine brown hairs the mask
# and the skin agree on, `ok` 4.5 mm off). The lenient forehead errs towards skin, so
# when even it says "not skin" two views outvote one; the other way round (skin above a
# crossing under the mask) sparse hair passing the skin test is common on right answers.
# hair the mask leaves out between the clear forehead and the mask edge (blonde hair under
# a headband, stubble under the network's scalp cap): the clear forehead ends this far below
# the mask edge -> the trichion goes to the forehead's top, the band reaches the mask edge.
# (measured: 14-17 mm on those two photos, <= 2.9 mm on every other labelled hairline)
UNMASKED_GAP_MM = 5.0
# the other way round: the forehead's skin runs this far up into the mask (sparse or
# see-through hair over skin; on a sharp edge too: a sparse tuft mirrored, a sharp crossing
# under skin 8-10 mm into the mask, `ok` 5.2 mm low; the right sharp answers with as much
# skin were where the forehead's model takes the hair for skin, or 6.7-6.8 mm on light
# copies). On a soft edge the line is then anywhere between the two
# (measured on the soft edges, photos and mirrored copies: 1.7-3.0 mm where mask and
# crossing were within 2.6 mm of the label, 7.7-9.9 mm on a tuft and on slicked-back
# hair, the mask 2.4-5.4 mm low; 4.5-4.7 mm on one photo with the mask on the label).
SKIN_INTO_MASK_MM = 6.0
# a soft edge is trusted only if the forehead's skin also ends no further than this below
# the mask edge: non-skin left out of the mask there is baby hairs or stubble, where the
# label lies (measured: on no soft edge did the skin end below the mask; on sharp ones
# by up to 3.0 mm)
SKIN_BELOW_MASK_MM = 3.0
# a sharp crossing this close to the mask confirms it even when the window's halves split
# (a tilted line: the median of the window is still the midline's point)
AGREE_MM = 1.0
# hair close to skin colour: a trained network's mask (not colour models) and the image's
# crossing this close, the window's halves agreeing, are two independent views of one line
# (thin white hair: 0.2-1.5 mm apart on the photo and its mirrored and rescaled copies,
# the middle 0.1-1.2 mm from the label)
LOW_CONTRAST_AGREE_MM = 1.5
# ... and only a crossing the eye can see, about two just-noticeable differences: a faint
# strip of shine ending at a wrong mask edge makes a crossing there too (thin white hair:
# 8-11 on the photo and every copy; such a strip in a table test: 4)
MIN_LOW_CONTRAST_CROSSING_DE = 8.0
# ... whose skin-to-hair ramp is a line, not a gradient over the forehead: light hair
# painted over a dark head (a blonde robustness copy) ramped over 30.6 mm and its middle
# sat 5.5 mm below the label; thin white hair ramps over 12.5 mm
LOW_CONTRAST_MAX_RAMP_MM = 20.0
# shape thresholds, mm of temple recession (temples above the trichion level)
RECEDING_MM, M_SHAPE_MM, ROUNDED_MM, PEAK_MM = 20.0, 6.0, -6.0, 3.0

NOTE_FRINGE = "头发垂至前额（如刘海）：测得的是头发下缘，可能不是真实发际线"
NOTE_FRINGE_TO_BROWS = "刘海垂至眉毛，发际线被遮挡"
NOTE_FRINGE_COVERS = "刘海遮住前额，发际线被遮挡：请把刘海撩起后重拍"
NOTE_RATIO = "额头与面中部比例超出常见范围，结果需人工复核"
NOTE_SHORT = "额头高度低于 40 mm，可能是刘海或分割错误"
NOTE_FLOODED = "前额大面积被识别为头发，边缘不可靠"
NOTE_SNAP = "图像边缘与头发分割不一致（如稀疏或浅色的前额碎发），发际线位置不确定"
NOTE_SOFT = "发际线边缘模糊（稀疏、浅色或短茬头发），位置不确定"
NOTE_SPREAD = "发际线中段高低不一（如中分或稀疏发际），位置不确定"
NOTE_NO_IMAGE_EDGE = "图像中未见与头发分割相符的皮肤到头发的边缘，发际线位置不确定"
NOTE_SMALL_FACE = "照片中人脸过小（每像素超过 1.5 mm），发际线位置不确定：请靠近一些重拍"
NOTE_THIRD_COLOUR = "发际线处有一条颜色既不像头发也不像皮肤的带（如发根颜色不同、阴影或染发边缘），发际线位置不确定"
NOTE_UNMASKED = "前额皮肤上缘与头发边缘之间有一段未识别的区域（如发带下的浅色头发或短茬），发际线位置不确定"


def judge(
    trace: Trace,
    face: Face,
    hair: np.ndarray,
    lab: np.ndarray,
    crop: HeadCrop,
    calibration: Calibration,
    evidence: HairEvidence,
    mask_from_colour: bool,
    bald: Mapping[str, float],
) -> Candidate:
    """The traced answer and its evidence, for `decision.decide`. `trace` must show an edge
    on the midline (the caller checks coverage); `mask_from_colour`: the mask is the
    fallback's (colour models and GrabCut); `bald`: the bald model's evidence."""
    frame = trace.frame
    mm_per_work_px = calibration.mm_per_px / crop.scale
    found = trace.near(0.0, MIDLINE_HALF_WINDOW)
    found = found[~np.isnan(found)]
    trichion_v = float(np.median(found))
    mesh_top_v = float(frame.to_frame(face.points[LandmarkId.MESH_TOP])[0, 1])
    fringe = trichion_v < mesh_top_v + ABOVE_MESH_TOP * face_height_px(face)

    def settled(note: str) -> Candidate:
        return Candidate(Hairline(status="occluded", notes=(*evidence.notes, note)), Evidence(bald), settled=True)

    if fringe and (found - _brow_v(trace, face)).mean() * mm_per_work_px < FRINGE_TO_BROWS_MM:
        return settled(NOTE_FRINGE_TO_BROWS)
    if fringe and trichion_v * mm_per_work_px < MIN_FOREHEAD_MM:
        # the edge lies where no adult's hairline is (the < 40 mm gate): the forehead number
        # would be the fringe's, a claim about a forehead the photo does not show (a
        # fringe's edge read as a 19.8 mm forehead, "uncertain", before)
        return settled(NOTE_FRINGE_COVERS)

    gates = _gate_notes(trace, face, hair, trichion_v, mesh_top_v, mm_per_work_px, fringe)
    notes = list(evidence.notes) + gates
    if calibration.mm_per_px > MAX_OK_MM_PER_PX:
        notes.append(NOTE_SMALL_FACE)
    spread_px = midline_spread_px(trace)
    if spread_px * mm_per_work_px > SPREAD_MM:
        notes.append(NOTE_SPREAD)
    if fringe:
        reading = EdgeReading(0.0, 0.0, None)
    else:
        reading = _image_edge_check(trace, lab, face, mm_per_work_px, evidence.low_contrast, mask_from_colour)
    trichion_v -= reading.shift_px  # rows grow downwards, v upwards
    if evidence.low_contrast and (fringe or reading.note is not None):  # not confirmed by two views
        notes.append(NOTE_LOW_CONTRAST)
    notes += [reading.note] if reading.note else []

    forehead_mm = trichion_v * mm_per_work_px
    position_mm = math.hypot(spread_px, QUANTISATION_PX, reading.disagreement_px) * mm_per_work_px
    base_band_mm = math.hypot(position_mm, calibration.relative_uncertainty * forehead_mm)
    trust = {
        **reading.features(mm_per_work_px),
        "views_agree": float(not fringe and reading.note is None),
        "log_mm_per_px": math.log(calibration.mm_per_px),
        "spread_mm": spread_px * mm_per_work_px,
        "low_contrast": float(evidence.low_contrast),
        "disagreement_mm": reading.disagreement_px * mm_per_work_px,
        "gate_notes": float(len(gates) - fringe + (calibration.mm_per_px > MAX_OK_MM_PER_PX)),
        "fringe": float(fringe),
        "top_cut": bald.get("top_cut", 0.0),
    }

    left_v, right_v = (_temple_v(trace, face, index) for index in LandmarkId.OUTER_EYE_CORNERS)

    def to_image(uv: list[float]) -> tuple[float, float]:
        x, y = crop.to_image(frame.to_image(np.asarray(uv)))[0]
        return float(x), float(y)

    traced = Hairline(
        status="uncertain",  # until `decision.decide` weighs the evidence
        points=crop.to_image(trace.points[~np.isnan(trace.v)]),
        trichion=to_image([0.0, trichion_v]),
        shape=_shape(trace, trichion_v, left_v, right_v, mm_per_work_px),
        uncertainty_mm=round(base_band_mm, 1),
        left_temple=None if left_v is None else to_image([_canthal_u(trace, face, 0), left_v]),
        right_temple=None if right_v is None else to_image([_canthal_u(trace, face, 1), right_v]),
        notes=tuple(notes),
    )
    return Candidate(traced, Evidence(bald, trust), base_band_mm)


@dataclass(frozen=True)
class EdgeReading:
    """What the image's own edge says of the mask edge at the midline: the point's shift
    and the views' disagreement (rows), the note when they do not agree, and the numbers
    behind it (None where no crossing was found)."""

    shift_px: float
    disagreement_px: float
    note: str | None
    whole: EdgeProfile | None = None
    offset_px: float = math.nan
    split_px: float = math.nan
    skin_into_px: float = math.nan

    def features(self, mm_per_px: float) -> dict[str, float]:
        whole = self.whole
        return {
            "offset_mm": abs(self.offset_px) * mm_per_px,
            "no_crossing": float(whole is None),
            "sharpness": math.nan if whole is None else whole.sharpness,
            "contrast": math.nan if whole is None else whole.contrast,
            "ramp_mm": math.nan if whole is None else whole.width_px * mm_per_px,
            "split_mm": self.split_px * mm_per_px,
            "skin_into_mm": abs(self.skin_into_px) * mm_per_px,
            "third_colour": float(whole is not None and whole.third_colour_px is not None),
        }


def _gate_notes(
    trace: Trace, face: Face, hair: np.ndarray, trichion_v: float, mesh_top_v: float, mm_per_px: float, fringe: bool
) -> list[str]:
    """The plausibility gates; a fringe explains a short forehead and a haired band."""
    forehead_mm = trichion_v * mm_per_px
    middle_mm = -float(trace.frame.to_frame(face.points[LandmarkId.SUBNASALE])[0, 1]) * mm_per_px
    notes = [NOTE_FRINGE] if fringe else []
    if not RATIO_RANGE[0] <= forehead_mm / max(middle_mm, 1e-6) <= RATIO_RANGE[1]:
        notes.append(NOTE_RATIO)
    if not fringe and forehead_mm < MIN_FOREHEAD_MM:
        notes.append(NOTE_SHORT)
    if not fringe and _forehead_band_hair(trace, face, hair, mesh_top_v) > MAX_BAND_HAIR:
        notes.append(NOTE_FLOODED)
    return notes


def _image_edge_check(
    trace: Trace, lab: np.ndarray, face: Face, mm_per_px: float, low_contrast: bool, mask_from_colour: bool
) -> EdgeReading:
    """(shift of the trichion in rows, disagreement in rows, note): the mask edge weighed
    against the image's own edge (`edge_profile`) and the top of the clear forehead."""
    window = trace.in_window(0.0, MIDLINE_HALF_WINDOW)
    columns = trace.points[window, 0].astype(int)
    edge_row = float(np.median(trace.points[window, 1]))
    brow_row = float(np.min(trace.brow_rows[window]))

    def profile(selection: np.ndarray) -> EdgeProfile | None:
        return midline_edge_profile(lab, trace.points[selection, 0].astype(int), edge_row, brow_row, face)

    forehead = ClearForehead.scan(lab, columns, brow_row, face)

    def forehead_top(share: float) -> float | None:
        top = forehead.top(share)
        # skin that "ends" below landmark 10 (which sits on the forehead, under any hairline
        # the gates accept) is a crease, a shadow or JPEG blocks, not the hairline seen from
        # below: the third view is lost (a JPEG q40 copy: 35 mm below the line)
        return None if top is None or top > face.points[LandmarkId.MESH_TOP][1] else top

    clear_top = forehead_top(FOREHEAD_SHARE)
    whole = profile(window)
    offset_px = math.nan if whole is None else whole.crossing_row - edge_row
    if clear_top is not None and (clear_top - edge_row) * mm_per_px > UNMASKED_GAP_MM:
        gap_px = clear_top - edge_row
        return EdgeReading(gap_px, gap_px, NOTE_UNMASKED, whole, offset_px, skin_into_px=edge_row - clear_top)
    if low_contrast:
        clear_top = forehead_top(LIGHT_HAIR_FOREHEAD_SHARE)
    sides = (window & (trace.u < 0), window & (trace.u > 0))
    halves = (profile(sides[0]), profile(sides[1]))
    mask_halves = (
        None
        if not (sides[0].any() and sides[1].any())
        else (float(np.median(trace.points[sides[0], 1])), float(np.median(trace.points[sides[1], 1])))
    )
    sees_hair = not forehead.takes_hair_for_skin(lab, edge_row, face)
    shift_px, disagreement_px, note = weigh_edges(
        edge_row, whole, halves, clear_top, mm_per_px, low_contrast, mask_from_colour, mask_halves, sees_hair
    )
    left, right = halves
    mask_left, mask_right = mask_halves or (edge_row, edge_row)
    split_px = (
        math.nan
        if left is None or right is None
        else abs((left.crossing_row - mask_left) - (right.crossing_row - mask_right)) / 2
    )
    skin_into_px = math.nan if clear_top is None else edge_row - clear_top
    return EdgeReading(shift_px, disagreement_px, note, whole, offset_px, split_px, skin_into_px)


def weigh_edges(
    mask_row: float,
    whole: EdgeProfile | None,
    halves: tuple[EdgeProfile | None, EdgeProfile | None],
    forehead_top: float | None,
    mm_per_px: float,
    low_contrast: bool,
    mask_from_colour: bool,
    mask_halves: tuple[float, float] | None = None,
    forehead_sees_hair: bool = True,
) -> tuple[float, float, str | None]:
    """(shift in rows, disagreement in rows, note or None when the answer can be trusted)
    from three views of one midline hairline: the mask edge (`mask_row`), the image's
    skin-to-hair crossing over the whole window and each half of it, and the top of the
    clear forehead (rows grow downwards). The halves agree when each half's crossing sits
    as far from that half's mask edge (`mask_halves`; default: a level edge at `mask_row`):
    a tilted line moves both together.

    - Sharp crossing <= MAX_SNAP_MM from the mask: snapped to when its halves agree, or
      when it is within AGREE_MM of the mask anyway (a tilted line, not doubt); but not
      under forehead skin running more than SKIN_INTO_MASK_MM up into the mask (a tuft's
      lower edge: the line lies anywhere between, as on a soft edge) unless
      `forehead_sees_hair` is False (the forehead's skin model takes the hair for skin);
      nor, above the mask, when the forehead's skin starts more than VIEWS_AGREE_MM below
      it (mask and forehead outvote it: the point stays on the mask, the band reaches it).
    - Soft crossing: trusted only when all three views agree (`forehead_top` None: that
      view is lost, nothing is trusted; crossing and mask within
      MAX_SNAP_MM, halves within VIEWS_AGREE_MM, the forehead's skin ending at the mask
      edge); the point is the middle of crossing and mask. Where the forehead's skin runs
      on into the mask (sparse or see-through hair over skin: a tuft, slicked-back hair)
      the line lies anywhere between the two: the point is their middle, the band reaches
      both. Skin ending well below the mask edge (baby hairs, stubble) is not trusted.
    - No crossing near the mask edge at all: nothing confirms it.
    - Hair close to skin colour (white, grey), weighed first, sharp or soft: the clear
      forehead (here `forehead_top` counts only rows skin across LIGHT_HAIR_FOREHEAD_SHARE
      of the window) cannot see where the hair starts, but it sees skin: where it runs more
      than MAX_SNAP_MM up into the mask, the mask has taken in forehead and the line lies
      anywhere between the two: their middle, the band reaching both and the crossing's
      ramp. Otherwise a network's mask (not colour models) and a visible crossing
      (MIN_LOW_CONTRAST_CROSSING_DE) within LOW_CONTRAST_AGREE_MM, halves agreeing, are the
      two views left: their middle, trusted. Otherwise the point is the middle of mask and
      crossing, or the crossing itself when the mask came from colour models too (the
      fallback's GrabCut stops where dense white hair stops; the hair network does not: on
      the labelled white/light hair, mirrored and rescaled 0.7-1.5x, its edge was 0.1-2.4 mm
      from the label, the crossing 0.5-2.8 mm); the band spans a soft crossing's ramp or
      reaches the mask from a sharp one.
    - A sharp crossing that disagrees otherwise (> MAX_SNAP_MM away, split halves): the
      crossing, the band reaching back to the mask. A parting or a gap in the mask pulls
      the mask's median up; the image's own sharp edge was the nearer of the two on every
      such photo (a middle parting: 3.1 mm against the mask's 6.5 mm).
    - Any answer trusted above, when a band of a third colour lies on the hair side of the
      crossing (`EdgeProfile.third_colour_px`): not trusted, the band reaching the band's
      top, the point unchanged (`_trusted`)."""
    if whole is None:  # e.g. the network's scalp cap over stubble
        return 0.0, 0.0, NOTE_NO_IMAGE_EDGE
    offset_px = whole.crossing_row - mask_row
    near = abs(offset_px) * mm_per_px <= MAX_SNAP_MM
    left, right = halves
    mask_left, mask_right = mask_halves or (mask_row, mask_row)
    split_px = (
        None
        if left is None or right is None
        else abs((left.crossing_row - mask_left) - (right.crossing_row - mask_right)) / 2
    )
    halves_agree = split_px is not None and split_px * mm_per_px <= VIEWS_AGREE_MM
    skin_into_px = 0.0 if forehead_top is None else mask_row - forehead_top
    if low_contrast:
        if skin_into_px * mm_per_px > MAX_SNAP_MM:
            return (*_between_mask_and_skin(skin_into_px, offset_px, whole), NOTE_SOFT)
        if (
            not mask_from_colour
            and abs(offset_px) * mm_per_px <= LOW_CONTRAST_AGREE_MM
            and halves_agree
            and whole.contrast >= MIN_LOW_CONTRAST_CROSSING_DE
            and whole.width_px * mm_per_px <= LOW_CONTRAST_MAX_RAMP_MM
        ):
            return _trusted(offset_px / 2, max(abs(offset_px) / 2, split_px or 0.0), offset_px, whole)
        follow = 1.0 if mask_from_colour else 0.5  # how far towards the crossing
        if whole.sharpness < SHARP_EDGE:
            return follow * offset_px, _to_ramp_end(offset_px, follow * offset_px, whole), NOTE_SOFT
        return follow * offset_px, abs(offset_px), NOTE_SNAP
    if whole.sharpness < SHARP_EDGE:
        if skin_into_px * mm_per_px > SKIN_INTO_MASK_MM:
            return (*_between_mask_and_skin(skin_into_px, offset_px, whole), NOTE_SOFT)
        if (
            near
            and halves_agree
            and forehead_top is not None
            and -SKIN_BELOW_MASK_MM <= skin_into_px * mm_per_px <= SKIN_INTO_MASK_MM
        ):
            return _trusted(offset_px / 2, max(abs(offset_px) / 2, split_px or 0.0), offset_px, whole)
        return 0.0, _to_ramp_end(offset_px, 0.0, whole), NOTE_SOFT
    if forehead_sees_hair and skin_into_px * mm_per_px > SKIN_INTO_MASK_MM:
        return (*_between_mask_and_skin(skin_into_px, offset_px, whole), NOTE_SNAP)
    skin_below_crossing_px = 0.0 if forehead_top is None else forehead_top - whole.crossing_row
    if offset_px < 0 and skin_below_crossing_px * mm_per_px > VIEWS_AGREE_MM:  # outvoted: see VIEWS_AGREE_MM
        return 0.0, max(-offset_px, abs(skin_into_px)), NOTE_SNAP
    tilted = split_px is not None and split_px * mm_per_px <= MAX_SNAP_MM and abs(offset_px) * mm_per_px <= AGREE_MM
    if near and (halves_agree or tilted):
        return _trusted(offset_px, split_px or 0.0, offset_px, whole)
    return offset_px, abs(offset_px), NOTE_SNAP


def _trusted(
    shift_px: float, disagreement_px: float, offset_px: float, whole: EdgeProfile
) -> tuple[float, float, str | None]:
    """An answer the views agree on, unless a band of a third colour lies above the crossing
    (`EdgeProfile.third_colour_px`): its upper edge may be the hairline as well as its lower
    one, so the band reaches from the point to the band's top."""
    if whole.third_colour_px is None:
        return shift_px, disagreement_px, None
    to_band_top_px = abs(shift_px - offset_px + whole.third_colour_px)
    return shift_px, max(disagreement_px, to_band_top_px), NOTE_THIRD_COLOUR


def midline_spread_px(trace: Trace) -> float:
    """How ragged the midline edge is: the MAD of its rows about their Theil-Sen line, or
    how far their median (the trichion) lies off that line at the midline when the window
    is traced on one side more than the other (a tilted line, partly traced)."""
    window = trace.in_window(0.0, MIDLINE_HALF_WINDOW)
    u, v = trace.u[window], trace.v[window]
    if len(v) < 3 or np.ptp(u) == 0:
        return float(np.median(np.abs(v - np.median(v)))) if len(v) else 0.0
    slope, intercept, _, _ = theilslopes(v, u)
    residual = v - (intercept + slope * u)
    return max(float(np.median(np.abs(residual - np.median(residual)))), abs(float(np.median(v)) - intercept))


def _between_mask_and_skin(skin_into_px: float, offset_px: float, whole: EdgeProfile) -> tuple[float, float]:
    """(shift, band) where the forehead's skin runs `skin_into_px` up into the mask: the line
    lies anywhere between the two, so the point is their middle and the band reaches both
    and the far end of the crossing's ramp."""
    shift_px = -skin_into_px / 2
    return shift_px, max(skin_into_px / 2, _to_ramp_end(offset_px, shift_px, whole))


def _to_ramp_end(offset_px: float, shift_px: float, whole: EdgeProfile) -> float:
    """Rows from the moved point to the far end of a soft edge's skin-to-hair ramp (centred
    on its crossing): the band of a soft edge, which has no one row."""
    return abs(offset_px - shift_px) + whole.width_px / 2


def _brow_v(trace: Trace, face: Face) -> float:
    brows = face.points[list(LandmarkId.LEFT_BROW_UPPER + LandmarkId.RIGHT_BROW_UPPER)]
    return float(np.max(trace.frame.to_frame(brows)[:, 1]))


def _forehead_band_hair(trace: Trace, face: Face, hair: np.ndarray, mesh_top_v: float) -> float:
    """Share of hair between the brows and the mesh top, over the midline window."""
    height, width = hair.shape
    ys, xs = np.mgrid[0:height, 0:width]
    uv = trace.frame.to_frame(np.stack([xs.ravel(), ys.ravel()], axis=1))
    band = (
        (np.abs(uv[:, 0]) <= MIDLINE_HALF_WINDOW * 2 * trace.face_width)
        & (uv[:, 1] > _brow_v(trace, face))
        & (uv[:, 1] < mesh_top_v)
    )
    return float((hair.ravel()[band] >= 0.5).mean()) if band.any() else 0.0


def _canthal_u(trace: Trace, face: Face, side: int) -> float:
    return float(trace.frame.to_frame(face.points[LandmarkId.OUTER_EYE_CORNERS[side]])[0, 0])


def _temple_v(trace: Trace, face: Face, index: int) -> float | None:
    """Hairline height on the lateral canthal line through landmark 33 or 263."""
    u = float(trace.frame.to_frame(face.points[index])[0, 0])
    near = trace.near(u, TEMPLE_HALF_WINDOW)
    near = near[~np.isnan(near)]
    return float(np.median(near)) if len(near) else None


def _shape(
    trace: Trace, trichion_v: float, left_v: float | None, right_v: float | None, mm_per_px: float
) -> HairlineShape:
    sides = [v for v in (left_v, right_v) if v is not None]
    recession = (np.mean(sides) - trichion_v) * mm_per_px if sides else 0.0
    if recession >= RECEDING_MM:
        return "receding"
    # a widow's peak is a V at the midline: most of the rise happens right beside it
    flank = np.concatenate([trace.near(u, 0.05) for u in (-0.15 * trace.face_width, 0.15 * trace.face_width)])
    flank = flank[~np.isnan(flank)]
    rise = (np.median(flank) - trichion_v) * mm_per_px if len(flank) else 0.0
    if rise >= PEAK_MM and rise >= 0.5 * recession:
        return "widows_peak"
    if recession >= M_SHAPE_MM:
        return "m_shape"
    if recession <= ROUNDED_MM:
        return "rounded"
    return "straight"
