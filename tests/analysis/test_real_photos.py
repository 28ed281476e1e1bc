"""The labelled real photos (../shared/photos, labels.json): what the segmenters and the
trace do on named photos (masks, scalp evidence, painted hairlines). The statuses and
numbers of the whole set are judged held out in test_heldout.py, not pinned here. Several
photos are below the endpoints' 480 px limit, so the analysis is called directly. Skipped
loudly when the photos are absent."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest

from analysis.endpoints import analyse
from analysis.face.calibration import calibrate
from analysis.face.head_crop import HeadCrop
from analysis.face.head_samples import HeadColours, to_lab
from analysis.face.landmarks import FaceMeshDetector
from analysis.frame import FaceFrame
from analysis.hairline.frontal import trace_hairline
from analysis.hairline.measurements import measure_face
from analysis.hairline.scalp import top_of_head
from analysis.models import Models
from analysis.segmentation.fallback import FallbackSegmenter
from analysis.segmentation.hairnet import HairNetSegmenter
from analysis.types import Calibration, Face, Hairline, HairSegmenter
from shared.settings import AnalysisSettings

from .conftest import PHOTOS_DIR
from .images import load_photo

OK_WITHIN_MM = 3.0  # an `ok` trichion is within max(3 mm, the label's tolerance)
BALD_MASK_SHARE = 0.005  # a bald or shaved head's mask: at most a stubble rim


def _labels() -> list[dict[str, Any]]:
    # Read at collection time (parametrize); the photos_dir fixture skips when they are absent.
    path = PHOTOS_DIR / "labels.json"
    return json.loads(path.read_text()) if path.is_file() else [{"file": "(photos absent)", "kind": "absent"}]


def _hairline(photos_dir: Path, name: str, detector: FaceMeshDetector, segmenter: HairSegmenter):
    rgb = load_photo(photos_dir, name)
    face = detector.detect(rgb)
    calibration = calibrate(face)
    return face, calibration, trace_hairline(rgb, face, segmenter.segment(rgb, face), calibration)


_ANSWERS: dict[str, tuple[Face, Calibration, Hairline]] = {}


def _answer(photos_dir: Path, name: str, detector: FaceMeshDetector, hairnet: HairNetSegmenter):
    """The hair network's answer for one photo, computed once per session."""
    if name not in _ANSWERS:
        _ANSWERS[name] = _hairline(photos_dir, name, detector, hairnet)
    return _ANSWERS[name]


# The bald heads of the first labelled set, whose masks the segmentation tests were written
# for; the later bald heads (a crown cut by the frame, shaved heads) are judged by the
# held-out report (test_heldout.py), which does not need an empty mask to call them bald.
FIRST_BALD_HEADS = ("willis_white.png", "diesel_dark.png", "deepface_img21.jpg")


@pytest.mark.parametrize("segmenter_name", ["hairnet", "segmenter"])
def test_bald_heads_have_an_empty_hair_mask(
    segmenter_name: str,
    request: pytest.FixtureRequest,
    photos_dir: Path,
    photo_labels: list[dict[str, Any]],
    detector: FaceMeshDetector,
) -> None:
    """The network marks a ring or cap of scalp skin as hair on bald heads; the skin
    evidence must empty it (a stubble rim may count)."""
    segmenter = request.getfixturevalue(segmenter_name)
    for name in FIRST_BALD_HEADS:
        rgb = load_photo(photos_dir, name)
        hair = segmenter.segment(rgb, detector.detect(rgb)).hair
        assert np.count_nonzero(hair) / hair.size <= BALD_MASK_SHARE, name


@pytest.mark.parametrize("name", ["willis_white.png", "diesel_dark.png", "deepface_img21.jpg", "statham_big.png"])
def test_the_networks_scalp_ring_alone_marks_a_bald_head(
    name: str,
    photos_dir: Path,
    photo_labels: list[dict[str, Any]],
    detector: FaceMeshDetector,
    hairnet: HairNetSegmenter,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two independent bald cues: with the colour test switched off, the ring geometry (a thin
    band under the outline, the forehead's skin running into it) still empties a bald head's
    mask, and leaves the receded stubble head (non-skin between forehead and band) its hair."""
    monkeypatch.setattr(HeadColours, "skin_coloured", property(lambda colours: False))
    rgb = load_photo(photos_dir, name)
    hair = hairnet.segment(rgb, detector.detect(rgb)).hair
    bald = next(entry for entry in photo_labels if entry["file"] == name)["kind"] == "no_hairline"
    assert (np.count_nonzero(hair) / hair.size <= BALD_MASK_SHARE) == bald


def test_a_haired_heads_mask_holds_its_hair_and_nothing_else(
    photos_dir: Path, detector: FaceMeshDetector, hairnet: HairNetSegmenter
) -> None:
    """tom_cruise (issue 17): the fallback missed the hair on the image-left side and spilled
    over the person behind him and his suit."""
    rgb = load_photo(photos_dir, "tom_cruise.jpg")
    face = detector.detect(rgb)
    hair = hairnet.segment(rgb, face).hair
    points = face.points
    face_height = points[152, 1] - points[10, 1]
    rows, columns = np.nonzero(hair)
    # nothing on the collar or the suit (a shadow beside the jaw reaches 10 px below the chin)
    assert rows.max() <= points[152, 1] + 0.1 * face_height
    face_width = points[454, 0] - points[234, 0]
    assert columns.min() >= points[234, 0] - 0.5 * face_width and columns.max() <= points[454, 0] + 0.5 * face_width
    for side in (234, 454):  # both sides of the head, beside the temples
        x = int(points[side, 0] + (-0.04 if side == 234 else 0.04) * face_width)
        y = int(points[10, 1] + 0.1 * face_height)
        assert hair[y - 3 : y + 4, x - 3 : x + 4].any(), side
    crown = int(points[10, 1] - 0.3 * face_height), int(points[10, 0])
    assert hair[crown]


def test_same_photo_same_numbers(photos_dir: Path, detector: FaceMeshDetector, hairnet: HairNetSegmenter) -> None:
    first = _hairline(photos_dir, "tom_cruise.jpg", detector, hairnet)[2]
    again = _hairline(photos_dir, "tom_cruise.jpg", detector, hairnet)[2]
    assert (first.status, first.trichion, first.uncertainty_mm, first.notes) == (
        again.status,
        again.trichion,
        again.uncertainty_mm,
        again.notes,
    )
    np.testing.assert_array_equal(first.points, again.points)


def paint_receding_hair(rgb: np.ndarray, face: Face, person: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Dark-brown hair (noisy, like hair texture) over the scalp above an M-shaped edge built in
    the face's own midline frame: lowest on the midline, rising 0.1 face heights towards the
    temples. Returns the painted photo and the edge as an image polyline."""
    frame = FaceFrame.from_face(face)
    height = face.points[152][1] - face.points[10][1]
    width = face.points[454][0] - face.points[234][0]
    mesh_top_v = frame.to_frame(face.points[10])[0, 1]
    u = np.linspace(-1.5 * width, 1.5 * width, 400)
    rise = 0.10 * height
    v = mesh_top_v + 0.04 * height + rise * np.sin(0.5 * np.pi * np.clip(np.abs(u) / (0.55 * width), 0, 1)) ** 2
    edge = frame.to_image(np.stack([u, v], axis=1))
    above = np.zeros(rgb.shape[:2], np.uint8)
    polygon = np.concatenate([edge, [[edge[-1, 0], -10.0], [edge[0, 0], -10.0]]])
    cv2.fillPoly(above, [np.round(polygon).astype(np.int32)], (1,))
    texture = 1.0 + 0.25 * np.random.default_rng(1).standard_normal(rgb.shape[:2])
    hair = np.clip(np.array([60.0, 45.0, 35.0]) * texture[..., None], 0, 255)
    painted = np.where((above.astype(bool) & person)[..., None], hair, rgb).astype(np.uint8)
    return painted, edge


PAINTED_KNOWN_MISSES = {
    "diesel_dark.png": "right canthal line meets the side of the dome: shadowed skin on a dark background "
    "passes for hair, right temple reads 0 mm",
    "deepface_img21.jpg": "the last columns on the image-right side are traced ~25 px off the painted edge "
    "(the hair network: ~56 px); the other side within 1 px",
}


@pytest.mark.parametrize(
    "label",
    [
        pytest.param(
            entry,
            id=entry["file"],
            marks=[pytest.mark.xfail(strict=True, reason=PAINTED_KNOWN_MISSES[entry["file"]])]
            if entry["file"] in PAINTED_KNOWN_MISSES
            else [],
        )
        for entry in _labels()
        if entry["file"] in (*FIRST_BALD_HEADS, "(photos absent)")
    ],
)
def test_painted_receding_hairline_on_a_bald_head(
    label: dict[str, Any], photos_dir: Path, detector: FaceMeshDetector, segmenter: FallbackSegmenter
) -> None:
    """Hair painted onto a labelled bald head with a known M-shaped edge: the whole pipeline
    (segmenter included) must trace it within 2 px and find both temples receded."""
    rgb = load_photo(photos_dir, label["file"])
    face = detector.detect(rgb)
    painted, edge = paint_receding_hair(rgb, face, segmenter.segment(rgb, face).person)
    face = detector.detect(painted)
    calibration = calibrate(face)
    hairline = trace_hairline(painted, face, segmenter.segment(painted, face), calibration)
    assert hairline.status in ("ok", "uncertain") and hairline.points is not None, hairline
    expected = np.interp(hairline.points[:, 0], edge[:, 0], edge[:, 1])
    assert np.abs(hairline.points[:, 1] - expected).mean() <= 2.0
    recession = measure_face(face, hairline, calibration, "male", AnalysisSettings())["measurements"][
        "temple_recession_mm"
    ]
    assert recession["left"] > 0 and recession["right"] > 0, recession


def test_a_painted_receding_hairline_is_not_taken_for_the_networks_scalp_ring(
    photos_dir: Path, detector: FaceMeshDetector, segmenter: FallbackSegmenter, hairnet: HairNetSegmenter
) -> None:
    """A thin band of dark hair on a bald head (the ring rule's closest case): the hair
    network keeps it and traces it within 2 px."""
    rgb = load_photo(photos_dir, "willis_white.png")
    face = detector.detect(rgb)
    painted, edge = paint_receding_hair(rgb, face, segmenter.segment(rgb, face).person)
    face = detector.detect(painted)
    hairline = trace_hairline(painted, face, hairnet.segment(painted, face), calibrate(face))
    assert hairline.status in ("ok", "uncertain") and hairline.points is not None, hairline
    expected = np.interp(hairline.points[:, 0], edge[:, 0], edge[:, 1])
    assert np.abs(hairline.points[:, 1] - expected).mean() <= 2.0


@pytest.mark.slow
def test_a_rolled_large_photo_is_judged_at_the_photos_scale(
    photos_dir: Path, detector: FaceMeshDetector, hairnet: HairNetSegmenter
) -> None:
    """deepface_img40 (4600 px, roll 7.8 degrees): the endpoints analyse it upright on a smaller
    canvas with the photo's calibration; it read its 58 mm forehead as < 40 mm (`uncertain`)
    there while the direct call said `ok`. Both must agree."""
    name = "deepface_img40.jpg"
    direct = _answer(photos_dir, name, detector, hairnet)[2]
    via_endpoint = analyse(load_photo(photos_dir, name), Models(detector, hairnet, "cpu"), AnalysisSettings()).hairline
    assert (via_endpoint.status, via_endpoint.notes) == (direct.status, direct.notes)
    assert via_endpoint.trichion is not None and direct.trichion is not None
    assert abs(via_endpoint.trichion[1] - direct.trichion[1]) <= 10  # photo px: 1 mm


SCALP_DEFAULT_RUN = {
    "openface_adams.jpg",
    "openface_lennon-1.jpg",
    "willis_white.png",
    "deepface_img21.jpg",
    "biden2.jpg",
}


@pytest.mark.parametrize(
    "label",
    [
        pytest.param(entry, id=entry["file"])
        for entry in _labels()
        if entry["file"] in (*SCALP_DEFAULT_RUN, "(photos absent)")
    ],
)
def test_bare_scalp_is_claimed_on_evidence_of_skin_only(
    label: dict[str, Any], photos_dir: Path, detector: FaceMeshDetector, hairnet: HairNetSegmenter
) -> None:
    """Issue 27: swept-back red hair (openface_adams) and curls cut by the photo's top edge
    (openface_lennon-1) were "bald": colour alone called their tops skin. The segmenter now
    sees bare scalp exactly on the bald heads, and the evidence says why."""
    rgb = load_photo(photos_dir, label["file"])
    face = detector.detect(rgb)
    segmentation = hairnet.segment(rgb, face)
    assert segmentation.scalp_seen == (label["kind"] == "no_hairline")
    crop = HeadCrop.around(face)
    assert segmentation.probability is not None and segmentation.probability[0] == crop.key
    top = top_of_head(
        to_lab(crop.cut(rgb)),
        crop.mask_in_work(segmentation.person) >= 0.5,
        crop.face_in_work(face),
        crop.at_photo_top,
        segmentation.probability[1],
    )
    if label["file"] == "openface_adams.jpg":  # skin-coloured, but strands and a sure network
        assert top.colours.skin_coloured and top.light_hair and not top.smooth and top.network_sees_hair
    if label["file"] == "openface_lennon-1.jpg":  # the frame's edge runs through the curls
        assert top.cut_off and not top.bare_scalp
