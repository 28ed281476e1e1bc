"""Hairline tracing and status on real faces and on a synthetic receding hairline."""

from __future__ import annotations

from dataclasses import replace

import cv2
import numpy as np
import pytest

from analysis.face.calibration import calibrate
from analysis.face.head_crop import HeadCrop
from analysis.face.head_samples import brow_strip_mask, to_lab
from analysis.face.landmarks import FaceMeshDetector
from analysis.frame import FaceFrame
from analysis.hairline.checks import (
    NOTE_FRINGE,
    NOTE_FRINGE_COVERS,
    NOTE_NO_IMAGE_EDGE,
    NOTE_SMALL_FACE,
    NOTE_SNAP,
    NOTE_SOFT,
    NOTE_THIRD_COLOUR,
    midline_spread_px,
    weigh_edges,
)
from analysis.hairline.decision import NOTE_BALD, fitted
from analysis.hairline.edge_profile import FOREHEAD_STRIP, ClearForehead, EdgeProfile, midline_edge_profile
from analysis.hairline.frontal import NOTE_NOT_FOUND, midline_edge, trace_hairline
from analysis.hairline.hair_evidence import NOTE_HAT
from analysis.hairline.measurements import measure_face
from analysis.hairline.trace import MIDLINE_HALF_WINDOW, Trace, bridge_parting
from analysis.segmentation.fallback import FallbackSegmenter
from analysis.segmentation.hairnet import HairNetSegmenter
from analysis.types import Calibration, Face, Hairline, HairSegmentation
from shared.settings import AnalysisSettings

from .images import encode, mirrored, rotated

# Her fringe edge on the midline, read by eye in the 512 px original.
ASTRONAUT_FRINGE_ROW = 81.6


def analyse(rgb: np.ndarray, detector: FaceMeshDetector, segmenter: FallbackSegmenter) -> Hairline:
    face = detector.detect(rgb)
    return trace_hairline(rgb, face, segmenter.segment(rgb, face), calibrate(face))


def fringe_edge(rgb: np.ndarray, detector: FaceMeshDetector, segmenter: FallbackSegmenter) -> tuple[float, float]:
    """The astronaut's answer (her fringe covers her forehead: `occluded`, no number) and
    the fringe's traced edge on the midline, which the segmenter must still find."""
    face = detector.detect(rgb)
    segmentation = segmenter.segment(rgb, face)
    hairline = trace_hairline(rgb, face, segmentation, calibrate(face))
    assert (hairline.status, hairline.trichion, hairline.notes) == ("occluded", None, (NOTE_FRINGE_COVERS,))
    edge = midline_edge(rgb, face, segmentation)
    assert edge is not None
    return edge


def test_the_segmenters_head_crop_is_reused_only_for_the_same_crop(
    astronaut: np.ndarray, face: Face, segmenter: FallbackSegmenter, calibration: Calibration
) -> None:
    segmentation = segmenter.segment(astronaut, face)
    assert segmentation.work is not None
    key, work = segmentation.work
    crop = HeadCrop.around(face)
    assert key == crop.key and crop.cut_reusing(segmentation, astronaut) is work
    other = replace(crop, x0=crop.x0 + 8)
    np.testing.assert_array_equal(other.cut_reusing(segmentation, astronaut), other.cut(astronaut))
    reused = trace_hairline(astronaut, face, segmentation, calibration)
    recut = trace_hairline(astronaut, face, replace(segmentation, work=None), calibration)
    assert (reused.status, reused.notes) == (recut.status, recut.notes)
    edge = midline_edge(astronaut, face, segmentation)  # her fringe's: `occluded`, no points
    assert edge is not None and edge == midline_edge(astronaut, face, replace(segmentation, work=None))


@pytest.mark.parametrize("size", [512, 256, 1024, 2048])
def test_astronaut_fringe_edge_is_reported_at_every_scale(
    astronaut: np.ndarray, detector: FaceMeshDetector, segmenter: FallbackSegmenter, size: int
) -> None:
    interpolation = cv2.INTER_AREA if size < 512 else cv2.INTER_CUBIC
    rgb = astronaut if size == 512 else cv2.resize(astronaut, (size, size), interpolation=interpolation)
    edge = fringe_edge(rgb, detector, segmenter)
    # the tolerance is 2 px in the 512 px original's coordinates
    assert abs(edge[1] * 512 / size - ASTRONAUT_FRINGE_ROW) <= 2.0


def test_astronaut_mirrored(astronaut: np.ndarray, detector: FaceMeshDetector, segmenter: FallbackSegmenter) -> None:
    edge = fringe_edge(mirrored(astronaut), detector, segmenter)
    assert abs(edge[1] - ASTRONAUT_FRINGE_ROW) <= 2.0
    assert abs(edge[0] - (511 - 226.0)) <= 6.0  # on her midline, mirrored


def _jpeg_q30(rgb: np.ndarray) -> np.ndarray:
    return cv2.cvtColor(
        cv2.imdecode(np.frombuffer(encode(rgb, "JPEG", quality=30), np.uint8), cv2.IMREAD_COLOR), cv2.COLOR_BGR2RGB
    )


def _rotated_point(x: float, y: float, degrees: float, centre: float = 255.5) -> tuple[float, float]:
    """Where (x, y) goes when the 512 px image turns counter-clockwise (as `rotated` does)."""
    c, s = np.cos(np.radians(degrees)), np.sin(np.radians(degrees))
    dx, dy = x - centre, y - centre
    return centre + c * dx + s * dy, centre - s * dx + c * dy


@pytest.mark.parametrize(
    ("edit", "degrees"),
    [("jpeg_q30", 0.0), ("brighter", 0.0), ("darker", 0.0), ("rotated", 10.0), ("rotated", -10.0)],
)
def test_astronaut_fringe_survives_everyday_edits(
    astronaut: np.ndarray, detector: FaceMeshDetector, segmenter: FallbackSegmenter, edit: str, degrees: float
) -> None:
    shifted = {"brighter": 30, "darker": -30}.get(edit, 0)
    rgb = {
        "jpeg_q30": lambda: _jpeg_q30(astronaut),
        "rotated": lambda: rotated(astronaut, degrees),
    }.get(edit, lambda: np.clip(astronaut.astype(int) + shifted, 0, 255).astype(np.uint8))()
    edge = fringe_edge(rgb, detector, segmenter)
    # her midline column (226) at the fringe row, carried through the edit
    expected = _rotated_point(226.0, ASTRONAUT_FRINGE_ROW, degrees)
    assert np.hypot(*np.subtract(edge, expected)) <= 2.5


def test_grace_hopper_runs_and_says_something_allowed(
    grace_hopper: np.ndarray, detector: FaceMeshDetector, segmenter: FallbackSegmenter
) -> None:
    # Known limit of the fallback: her cap is taken for hair (no hat label without BiSeNet).
    face = detector.detect(grace_hopper)
    segmentation = segmenter.segment(grace_hopper, face)
    hairline = trace_hairline(grace_hopper, face, segmentation, calibrate(face))
    assert segmentation.segmenter == "fallback"
    assert hairline.status in ("ok", "uncertain", "no_hairline", "occluded")


@pytest.mark.parametrize("edit", ["as is", "mirrored", "half size", "jpeg q30"])
def test_a_caps_band_taken_for_hair_is_occluded(
    edit: str, grace_hopper: np.ndarray, detector: FaceMeshDetector, hairnet: HairNetSegmenter
) -> None:
    """The hair network takes Grace Hopper's black cap band for hair; traced, it was a fringe
    on the cap's edge (`uncertain`) and the preview grew the cap down her forehead."""
    rgb = {
        "as is": grace_hopper,
        "mirrored": mirrored(grace_hopper),
        "half size": cv2.resize(grace_hopper, (256, 300), interpolation=cv2.INTER_AREA),
        "jpeg q30": cv2.cvtColor(
            cv2.imdecode(np.frombuffer(encode(grace_hopper, "JPEG", quality=30), np.uint8), cv2.IMREAD_COLOR),
            cv2.COLOR_BGR2RGB,
        ),
    }[edit]
    face = detector.detect(rgb)
    hairline = trace_hairline(rgb, face, hairnet.segment(rgb, face), calibrate(face))
    assert hairline.status == "occluded" and hairline.notes == (NOTE_HAT,)
    assert hairline.trichion is None and hairline.points is None


def m_shaped_edge(
    columns: np.ndarray, centre_x: float, centre_row: float, temple_rise: float, half_width: float
) -> np.ndarray:
    """Lower edge of a receding hairline: lowest on the midline, rising to both temples."""
    t = np.clip(np.abs(columns - centre_x) / half_width, 0, 1)
    return centre_row - temple_rise * np.sin(0.5 * np.pi * t) ** 2


def test_painted_receding_hairline_is_traced(
    astronaut: np.ndarray, detector: FaceMeshDetector, segmenter: FallbackSegmenter
) -> None:
    """A clean synthetic hair mask (real photo, landmarks and person mask) with a known M-shaped
    lower edge: the trace follows it and both temples read as receded."""
    rgb = cv2.resize(astronaut, (1024, 1024), interpolation=cv2.INTER_CUBIC)
    face = detector.detect(rgb)
    real = segmenter.segment(rgb, face)
    centre_x = face.points[8][0]
    columns = np.arange(rgb.shape[1])
    # 34 mm-ish forehead would be a fringe; put the edge 70 px above the mesh top instead
    edge = m_shaped_edge(
        columns, centre_x, face.points[10][1] - 20, 35.0, 0.55 * (face.points[454][0] - face.points[234][0])
    )
    rows = np.arange(rgb.shape[0])[:, None]
    hair = real.person & (rows <= edge[None, :])
    calibration = calibrate(face)
    hairline = trace_hairline(rgb, face, HairSegmentation("fallback", hair, real.person), calibration)
    assert hairline.status in ("ok", "uncertain") and hairline.points is not None
    traced = hairline.points
    error = np.abs(traced[:, 1] - np.interp(traced[:, 0], columns, edge))
    assert error.mean() <= 2.0
    assert hairline.shape in ("m_shape", "receding")
    recession = measure_face(face, hairline, calibration, "female", AnalysisSettings())["measurements"][
        "temple_recession_mm"
    ]
    assert recession["left"] > 0 and recession["right"] > 0


def test_painted_bald_head_has_no_hairline(
    astronaut: np.ndarray, detector: FaceMeshDetector, segmenter: FallbackSegmenter
) -> None:
    """Her hair repainted with her own forehead skin (shaded, noisy): the bald check must fire
    before any mask is trusted, and no forehead number may come out."""
    face = detector.detect(astronaut)
    hair = cv2.dilate(segmenter.segment(astronaut, face).hair.astype(np.uint8), np.ones((5, 5), np.uint8)).astype(bool)
    x, y = face.points[151].round().astype(int)
    skin = np.median(astronaut[y + 2 : y + 6, x - 10 : x + 10].reshape(-1, 3), axis=0)
    rows = np.arange(astronaut.shape[0])[:, None, None]
    shading = 1.0 + 0.1 * (rows - 60) / 60.0  # a scalp is lit from above
    noise = np.random.default_rng(0).normal(0, 4, astronaut.shape)
    painted = np.clip(skin[None, None, :] * shading + noise, 0, 255).astype(np.uint8)
    bald = np.where(hair[..., None], painted, astronaut)
    hairline = analyse(bald, detector, segmenter)
    assert hairline.status == "no_hairline" and NOTE_BALD in hairline.notes
    assert hairline.trichion is None and hairline.points is None
    result = measure_face(detector.detect(bald), hairline, calibrate(face), "male", AnalysisSettings())
    assert result["measurements"]["forehead_height_mm"] is None


def test_hat_label_means_occluded(
    astronaut: np.ndarray, detector: FaceMeshDetector, segmenter: FallbackSegmenter
) -> None:
    """A segmenter that can tell hats (BiSeNet) marks the top of the head as hat."""
    face = detector.detect(astronaut)
    real = segmenter.segment(astronaut, face)
    rows = np.arange(astronaut.shape[0])[:, None]
    hat = real.person & (rows < face.points[10][1] - 5)
    segmentation = HairSegmentation("bisenet", real.hair & ~hat, real.person, hat=hat)
    hairline = trace_hairline(astronaut, face, segmentation, calibrate(face))
    assert hairline.status == "occluded" and hairline.trichion is None
    assert NOTE_HAT in hairline.notes


def test_hair_down_to_the_brows_is_occluded(
    grace_hopper: np.ndarray, detector: FaceMeshDetector, segmenter: FallbackSegmenter
) -> None:
    face = detector.detect(grace_hopper)
    real = segmenter.segment(grace_hopper, face)
    brow_top = face.points[[70, 63, 105, 66, 107, 300, 293, 334, 296, 336], 1].max()
    rows = np.arange(grace_hopper.shape[0])[:, None]
    fringe = real.person & (rows <= brow_top)
    hairline = trace_hairline(grace_hopper, face, HairSegmentation("fallback", fringe, real.person), calibrate(face))
    assert hairline.status == "occluded"
    assert hairline.trichion is None


def test_a_fringe_is_occluded_only_where_no_hairline_can_be(
    astronaut: np.ndarray, detector: FaceMeshDetector, segmenter: FallbackSegmenter
) -> None:
    """A hair edge just under landmark 10 is a fringe's. Under 40 mm above the glabella no
    hairline can be there: the fringe hides it, `occluded`, no number (the astronaut's own,
    20 mm, was `uncertain` with a forehead of 19.8 mm). The same edge on a head 1.5x as large
    (47 mm) may be a low hairline: `uncertain`, the fringe note, the number given."""
    face = detector.detect(astronaut)
    real = segmenter.segment(astronaut, face)
    rows = np.arange(astronaut.shape[0])[:, None]
    segmentation = HairSegmentation("fallback", real.person & (rows <= face.points[10][1] + 2), real.person)
    own = calibrate(face)
    hidden = trace_hairline(astronaut, face, segmentation, own)
    assert (hidden.status, hidden.trichion, hidden.notes) == ("occluded", None, (NOTE_FRINGE_COVERS,))
    low = trace_hairline(astronaut, face, segmentation, replace(own, mm_per_px=1.5 * own.mm_per_px))
    assert low.status == "uncertain" and NOTE_FRINGE in low.notes and low.trichion is not None


def test_an_empty_mask_is_a_status_not_a_crash(
    astronaut: np.ndarray, detector: FaceMeshDetector, segmenter: FallbackSegmenter
) -> None:
    face = detector.detect(astronaut)
    real = segmenter.segment(astronaut, face)
    empty = HairSegmentation("bisenet", np.zeros_like(real.hair), real.person)
    hairline = trace_hairline(astronaut, face, empty, calibrate(face))
    # issue 27: a mask that shows nothing is no evidence of a bare scalp (her hair is dark)
    assert hairline.status == "uncertain" and hairline.trichion is None and NOTE_NOT_FOUND in hairline.notes
    # nor is the segmenter's word that it emptied a scalp: the bald model reads the top of
    # the head itself (issue 38), and hers is dark hair
    ringed = trace_hairline(astronaut, face, replace(empty, scalp_seen=True), calibrate(face))
    assert ringed.status == "uncertain" and ringed.trichion is None


def _edge(row: float, sharpness: float, width_px: float = 4.0, third_colour_px: float | None = None) -> EdgeProfile:
    return EdgeProfile(crossing_row=row, sharpness=sharpness, width_px=width_px, third_colour_px=third_colour_px)


SHARP, SOFT = 15.0, 6.0
NETWORK, COLOUR = False, True  # where the mask came from: the hair network, or colour models (fallback)
# mask edge at row 100, 1 mm per px: (image crossing, left/right halves, top of the clear
# forehead (counted strictly on hair close to skin colour), low contrast, mask from colour)
# -> (shift of the point in rows, band's disagreement, note)
EDGE_CASES = {
    "sharp, near, halves agree: snap": (_edge(101.5, SHARP), (101.0, 102.0), 100.0, False, NETWORK, (1.5, 0.5, None)),
    "sharp, near, halves agree, a band of a third colour 4 rows above the crossing: band to its top": (
        _edge(101.5, SHARP, third_colour_px=4.0),
        (101.0, 102.0),
        100.0,
        False,
        NETWORK,
        (1.5, 4.0, NOTE_THIRD_COLOUR),
    ),
    "sharp, too far: the crossing, band back to the mask": (
        _edge(104.0, SHARP),
        (104.0, 104.0),
        100.0,
        False,
        NETWORK,
        (4.0, 4.0, NOTE_SNAP),
    ),
    "sharp, halves split but the crossing is on the mask: tilted line": (
        _edge(100.5, SHARP),
        (98.5, 102.0),
        100.0,
        False,
        NETWORK,
        (0.5, 1.75, None),
    ),
    "sharp, halves split and the crossing off the mask": (
        _edge(102.0, SHARP),
        (100.0, 104.0),
        100.0,
        False,
        NETWORK,
        (2.0, 2.0, NOTE_SNAP),
    ),
    "sharp, above the mask, the forehead's skin reaching up to it: snap": (
        _edge(98.0, SHARP),
        (97.5, 98.5),
        98.5,
        False,
        NETWORK,
        (-2.0, 0.5, None),
    ),
    "sharp, above the mask, the forehead's skin starting 2 mm below it: mask and forehead outvote it": (
        _edge(97.5, SHARP),
        (97.0, 98.0),
        99.5,
        False,
        NETWORK,
        (0.0, 2.5, NOTE_SNAP),
    ),
    "soft, all three views agree: middle of mask and crossing": (
        _edge(101.0, SOFT),
        (100.8, 101.2),
        98.0,
        False,
        NETWORK,
        (0.5, 0.5, None),
    ),
    "soft, forehead skin runs 8 mm into the mask: middle of skin top and mask, band to the ramp's end": (
        _edge(100.0, SOFT),
        (100.0, 100.0),
        92.0,
        False,
        NETWORK,
        (-4.0, 6.0, NOTE_SOFT),
    ),
    "soft, skin ends 4 mm below the mask (baby hairs): band to the far end of the ramp": (
        _edge(101.0, SOFT),
        (101.0, 101.0),
        104.0,
        False,
        NETWORK,
        (0.0, 3.0, NOTE_SOFT),
    ),
    "soft, halves split": (_edge(101.0, SOFT), (99.0, 104.0), 100.0, False, NETWORK, (0.0, 3.0, NOTE_SOFT)),
    "soft, hair close to skin colour, the network's mask and the crossing agree: their middle, trusted": (
        _edge(101.4, SOFT, width_px=6.0),
        (101.0, 102.0),
        99.0,
        True,
        NETWORK,
        (0.7, 0.7, None),
    ),
    "soft, hair close to skin colour, agreeing, a band of a third colour above the crossing: band to its top": (
        _edge(101.4, SOFT, width_px=6.0, third_colour_px=3.0),
        (101.0, 102.0),
        99.0,
        True,
        NETWORK,
        (0.7, 2.3, NOTE_THIRD_COLOUR),  # the point 0.7 rows below the mask, the band's top 2.6 above it
    ),
    "soft, hair close to skin colour, agreeing but the halves split": (
        _edge(101.4, SOFT, width_px=6.0),
        (99.0, 104.0),
        99.0,
        True,
        NETWORK,
        (0.7, 3.7, NOTE_SOFT),
    ),
    "soft, hair close to skin colour: middle of mask and crossing, band over the ramp": (
        _edge(102.0, SOFT, width_px=6.0),
        (102.0, 102.0),
        99.0,
        True,
        NETWORK,
        (1.0, 4.0, NOTE_SOFT),
    ),
    "soft, hair close to skin colour, GrabCut's mask agreeing: not a second view": (
        _edge(101.4, SOFT, width_px=6.0),
        (101.0, 102.0),
        99.0,
        True,
        COLOUR,
        (1.4, 3.0, NOTE_SOFT),
    ),
    "sharp, hair close to skin colour, the network's mask and the crossing agree: their middle, trusted": (
        _edge(101.0, SHARP),
        (101.0, 101.0),
        99.0,
        True,
        NETWORK,
        (0.5, 0.5, None),
    ),
    "soft, hair close to skin colour, agreeing but too faint to see (a strip of shine at the mask edge)": (
        _edge(101.0, 1.0, width_px=4.0),
        (101.0, 101.0),
        99.0,
        True,
        NETWORK,
        (0.5, 2.5, NOTE_SOFT),
    ),
    "sharp, hair close to skin colour, 2 mm apart: their middle, not snapped": (
        _edge(102.0, SHARP),
        (102.0, 102.0),
        99.0,
        True,
        NETWORK,
        (1.0, 2.0, NOTE_SNAP),
    ),
    "sharp, hair close to skin colour, agreeing, but the forehead's skin runs 5 mm up into the mask": (
        _edge(101.0, SHARP),
        (101.0, 101.0),
        95.0,
        True,
        NETWORK,
        (-2.5, 5.5, NOTE_SOFT),  # middle of mask and skin, band to the crossing's ramp end
    ),
    "soft, hair close to skin colour, the forehead's skin 8 mm into the mask: the band reaches it": (
        _edge(100.0, SOFT, width_px=2.0),
        (100.0, 100.0),
        92.0,
        True,
        NETWORK,
        (-4.0, 5.0, NOTE_SOFT),
    ),
    "soft, hair close to skin colour, GrabCut's mask: the crossing": (
        _edge(102.0, SOFT, width_px=6.0),
        (102.0, 102.0),
        99.0,
        True,
        COLOUR,
        (2.0, 3.0, NOTE_SOFT),
    ),
}


@pytest.mark.parametrize("case", list(EDGE_CASES), ids=list(EDGE_CASES))
def test_the_image_edge_is_weighed_against_the_mask_and_the_forehead(case: str) -> None:
    whole, (left, right), forehead_top, low_contrast, from_colour, expected = EDGE_CASES[case]
    halves = (_edge(left, whole.sharpness), _edge(right, whole.sharpness))
    shift, disagreement, note = weigh_edges(100.0, whole, halves, forehead_top, 1.0, low_contrast, from_colour)
    assert (shift, disagreement) == pytest.approx(expected[:2])
    assert note == expected[2]


def test_a_tilted_line_is_weighed_half_by_half() -> None:
    """Hair swept to one side tilts the line: the halves' crossings lie 8 rows apart, but each
    sits 1 row below its own half of the mask (deepface_img22)."""
    tilted = weigh_edges(
        100.0,
        _edge(101.0, SHARP),
        (_edge(97.0, SHARP), _edge(105.0, SHARP)),
        100.0,
        1.0,
        False,
        NETWORK,
        mask_halves=(96.0, 104.0),
    )
    assert tilted == (pytest.approx(1.0), pytest.approx(0.0), None)
    level_mask = weigh_edges(
        100.0, _edge(101.0, SHARP), (_edge(97.0, SHARP), _edge(105.0, SHARP)), 100.0, 1.0, False, NETWORK
    )
    assert level_mask[2] == NOTE_SNAP  # the same crossings against a level mask edge: split


def test_a_sharp_crossing_over_skin_that_runs_on_up_into_the_mask_is_not_snapped_to() -> None:
    """deepface_img33 mirrored: a tuft on a buzz cut, the crossing sharp (10 ΔE/px) at the
    mask's edge and the forehead's skin 10 mm up into the mask, was `ok` 5.2 mm low. Unless
    the forehead's skin model takes the hair for skin too (deepface_img43's grey photo)."""
    crossing, halves = _edge(100.5, SHARP), (_edge(100.5, SHARP), _edge(100.5, SHARP))
    assert weigh_edges(100.0, crossing, halves, 90.0, 1.0, False, NETWORK) == (
        pytest.approx(-5.0),
        pytest.approx(7.5),  # to the crossing's ramp end: 5.5 rows below the point, then half of 4
        NOTE_SNAP,
    )
    assert weigh_edges(100.0, crossing, halves, 90.0, 1.0, False, NETWORK, forehead_sees_hair=False) == (
        pytest.approx(0.5),
        pytest.approx(0.0),
        None,
    )


def test_the_forehead_model_tells_dark_hair_from_skin_but_not_hair_of_the_foreheads_colour(
    astronaut: np.ndarray, face: Face
) -> None:
    """deepface_img43's grey-toned photo: its dark hair passes the forehead's skin model as
    often as the forehead does, and the clear forehead says nothing about where it starts."""
    lab = to_lab(astronaut)
    columns = np.arange(int(face.points[10][0]) - 10, int(face.points[10][0]) + 10)
    edge_row = float(face.points[10][1]) - 5.0
    forehead = np.median(lab[brow_strip_mask(lab.shape[:2], face, FOREHEAD_STRIP)], axis=0)
    dark, skin_toned = lab.copy(), lab.copy()
    dark[: round(edge_row)] = (40, 130, 135)  # every row above the edge
    skin_toned[: round(edge_row)] = forehead
    brow_row = float(face.points[9][1])
    assert not ClearForehead.scan(dark, columns, brow_row, face).takes_hair_for_skin(dark, edge_row, face)
    assert ClearForehead.scan(skin_toned, columns, brow_row, face).takes_hair_for_skin(skin_toned, edge_row, face)


@pytest.mark.parametrize("band", [None, "dye's rim", "shadow"])
def test_a_band_of_a_third_colour_between_hair_and_skin_is_seen(
    astronaut_lifted: np.ndarray, face: Face, band: str | None
) -> None:
    """Light hair, then 4 rows of the original's brown fade that a dye left below the mask
    (lacamoire's blonde copy) or of a grey shadow, then the forehead: a third colour, off
    the line from skin to hair. Without it the rows between are mixtures of hair and her
    skin (a blurred edge), on that line, and nothing is seen. The astronaut at 3x, the size
    of a face in the working frame, her fringe brushed back."""
    big = Face(face.landmarks * 3, face.image_width * 3, face.image_height * 3)
    rgb = cv2.resize(astronaut_lifted, None, fx=3, fy=3)
    columns = np.arange(int(big.points[10][0]) - 30, int(big.points[10][0]) + 30)
    edge = round(float(big.points[10][1]) - 15.0)

    def from_lab(colour: tuple[float, float, float]) -> np.ndarray:
        return cv2.cvtColor(np.array([[colour]], np.uint8), cv2.COLOR_Lab2RGB)[0, 0]

    rgb[:edge] = from_lab((160, 134, 165))  # blonde hair over her own forehead
    rgb = cv2.GaussianBlur(rgb, (0, 0), 1.5)  # the optics' own mixing of hair and skin
    if band is not None:
        rgb[edge - 4 : edge] = from_lab({"dye's rim": (135, 140, 140), "shadow": (150, 128, 128)}[band])
    lab = to_lab(rgb)
    profile = midline_edge_profile(lab, columns, float(edge), float(big.points[9][1]), big)
    assert profile is not None and abs(profile.crossing_row - edge) < 1.0
    if band is None:
        assert profile.third_colour_px is None
    else:
        assert profile.third_colour_px == pytest.approx(4.0, abs=1.0)


def test_a_tilted_line_is_not_ragged_but_a_wide_parting_is(face: Face) -> None:
    u = np.linspace(-30.0, 30.0, 61)
    partly_traced = np.where(u < -10.0, np.nan, 100.0 + 0.4 * u)  # a third of one side missing
    lines = {"tilted": 100.0 + 0.4 * u, "parting": 100.0 + 0.5 * np.abs(u), "tilted, partly traced": partly_traced}
    spreads = {}
    for name, v in lines.items():
        trace = Trace(FaceFrame.from_face(face), u, v, np.stack([u, v], axis=1), np.full_like(u, 150.0), 200.0)
        spreads[name] = midline_spread_px(trace)
    assert spreads["tilted"] < 0.1  # about the median: 2 px
    assert spreads["parting"] > 1.5
    assert spreads["tilted, partly traced"] == pytest.approx(2.0, abs=0.1)  # the median's offset off the line


def test_a_mask_edge_the_image_does_not_show_is_not_trusted() -> None:
    """statham_big mirrored at 0.7x: the network's scalp cap 10 mm above the stubble line,
    no skin-to-hair crossing near it, and was answered `ok`."""
    assert weigh_edges(100.0, None, (None, None), None, 1.0, False, False) == (0.0, 0.0, NOTE_NO_IMAGE_EDGE)


def test_a_face_too_small_for_a_confident_line_is_uncertain(
    astronaut_lifted: np.ndarray, detector: FaceMeshDetector, segmenter: FallbackSegmenter
) -> None:
    """A photo pixel over 1.5 mm is half the 3 mm an `ok` must hold (deepface_img37 at half
    size: an 8 px iris, a barely sharp edge snapped 3.2 mm off, answered `ok`)."""
    answers = {}
    for scale in (1.0, 0.5):  # the astronaut's iris: 8.2 px (1.42 mm/px), then 4.3 px
        photo = cv2.resize(astronaut_lifted, None, fx=scale, fy=scale, interpolation=cv2.INTER_AREA)
        face = detector.detect(photo)
        answers[scale] = trace_hairline(photo, face, segmenter.segment(photo, face), calibrate(face))
    assert NOTE_SMALL_FACE not in answers[1.0].notes
    assert answers[0.5].status == "uncertain" and NOTE_SMALL_FACE in answers[0.5].notes
    assert (answers[0.5].uncertainty_mm or 0.0) >= fitted().band_floor_mm["uncertain"]


def test_the_photos_calibration_holds_on_a_resized_copy(
    astronaut_lifted: np.ndarray, detector: FaceMeshDetector, segmenter: FallbackSegmenter
) -> None:
    """The endpoints turn a rolled head upright on a smaller canvas and pass the photo's own
    calibration: the millimetre gates and the band must not shrink with the canvas (a 4600 px
    photo read its 58 mm forehead as < 40 mm)."""
    photo_face = detector.detect(astronaut_lifted)
    half = cv2.resize(astronaut_lifted, None, fx=0.5, fy=0.5, interpolation=cv2.INTER_AREA)
    face = detector.detect(half)
    segmentation = segmenter.segment(half, face)
    own = trace_hairline(half, face, segmentation, calibrate(face))
    photos = trace_hairline(half, face, segmentation, calibrate(photo_face))
    assert (photos.status, photos.notes, photos.trichion) == (own.status, own.notes, own.trichion)
    # the band keeps its millimetres (the fitted floor, not half of it); the photo's own iris
    # (8 px, not 4) only narrows its scale term
    band, own_band = photos.uncertainty_mm, own.uncertainty_mm
    assert photos.status == "uncertain" and band is not None and own_band is not None
    assert fitted().band_floor_mm["uncertain"] <= band <= own_band


def test_a_partings_skin_wedge_is_bridged_and_nothing_else(face: Face) -> None:
    """Issue 27: at a parting the trichion is where the hair of both sides meets the forehead,
    not the wedge's apex. A rounded line, a widow's peak and a tilted line keep their trace;
    a notch over the midline is bridged by the line its two sides make."""
    width = 200.0
    u = np.linspace(-0.3 * width, 0.3 * width, 121)
    frame = FaceFrame.from_face(face)
    rounded = 100.0 - 0.004 * u**2
    notch = np.clip(8.0 - 0.8 * np.abs(u), 0.0, None)  # 8 px high, 20 px wide at its base

    def trace(v: np.ndarray) -> Trace:
        return Trace(frame, u, v, frame.to_image(np.stack([u, v], axis=1)), np.full_like(u, 150.0), width)

    for name, v in {"rounded": rounded, "widow's peak": rounded - notch, "tilted": 100.0 + 0.2 * u}.items():
        same, parting = bridge_parting(trace(v), 3.0)
        assert parting is None and same.v is not None and np.array_equal(same.v, v), name
    bridged, parting = bridge_parting(trace(rounded + notch), 3.0)
    assert parting is not None and 3.0 <= parting.rise_px <= 8.0  # its median height over the midline
    assert np.abs(bridged.v - rounded).max() < 1.5  # the bridge lies on the line of the two sides
    assert np.median(bridged.near(0.0, MIDLINE_HALF_WINDOW)) == pytest.approx(100.0, abs=1.0)
    np.testing.assert_allclose(frame.to_frame(bridged.points)[:, 1], bridged.v, atol=1e-6)  # drawn where measured
