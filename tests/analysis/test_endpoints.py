"""run_endpoint on real photos with the real models (the default: the hair network): contract fields,
check order, and plain-JSON output."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest

from analysis.drawing import designs, render
from analysis.endpoints import (
    INPAINT_MASK_KEY,
    INPAINT_MASK_OPTION,
    FrontalFace,
    _widened_for_pose,
    analyse,
    check_answer_size,
    run_endpoint,
    special_points,
)
from analysis.errors import AnalysisError
from analysis.face.calibration import calibrate
from analysis.hairline.checks import NOTE_FRINGE_COVERS
from analysis.hairline.hair_evidence import NOTE_HAT
from analysis.models import Models, load_models
from analysis.types import Face, Hairline, LandmarkId, Pose
from shared.contract import RefusalKind
from shared.contract.bodies import parse_options
from shared.settings import AnalysisSettings

from .conftest import ASTRONAUT_LIFTED_ROW, SPECIAL_POINT_NAMES
from .images import encode, load_photo, rotated
from .test_render import visible_share

LIMITS = AnalysisSettings()
NULL_WITHOUT_HAIRLINE = (
    "forehead_height_mm",
    "upper_third_mm",
    "thirds_ratio",
    "hairline_width_mm",
    "temple_recession_mm",
)


@pytest.fixture(scope="module")
def models() -> Iterator[Models]:
    loaded = load_models("", "cpu")
    yield loaded
    loaded.close()


@pytest.fixture(scope="module")
def astronaut_png(astronaut: np.ndarray) -> bytes:
    return encode(astronaut, "PNG")


@pytest.fixture(scope="module")
def lifted_png(astronaut_lifted: np.ndarray) -> bytes:
    """The astronaut with her fringe brushed back: a face with a hairline to measure and grow."""
    return encode(astronaut_lifted, "PNG")


@pytest.fixture(scope="module")
def measured(lifted_png: bytes, models: Models) -> dict[str, Any]:
    return run_endpoint("measure", lifted_png, parse_options("measure", {"gender": "female"}), models, LIMITS)


def assert_plain_json(value: Any) -> None:
    """Only plain Python JSON types (json.dumps would let numpy floats through) and no NaN."""
    if isinstance(value, dict):
        assert all(type(key) is str for key in value)
        for item in value.values():
            assert_plain_json(item)
    elif isinstance(value, list):
        for item in value:
            assert_plain_json(item)
    else:
        assert type(value) in (str, int, float, bool, type(None)), f"{type(value)}: {value!r}"
    json.dumps(value, allow_nan=False)


def call(endpoint: str, image: bytes, models: Models, **fields: Any) -> dict[str, Any]:
    data = run_endpoint(endpoint, image, parse_options(endpoint, fields), models, LIMITS)
    assert_plain_json(data)
    return data


def refused(endpoint: str, image: bytes, models: Models, **fields: Any) -> AnalysisError:
    with pytest.raises(AnalysisError) as caught:
        call(endpoint, image, models, **fields)
    return caught.value


def png(encoded: str, flags: int = cv2.IMREAD_UNCHANGED) -> np.ndarray:
    image = cv2.imdecode(np.frombuffer(base64.b64decode(encoded, validate=True), dtype=np.uint8), flags)
    assert image is not None
    return image


def assert_rounded(points: Any) -> None:
    values = np.asarray(points, dtype=np.float64).ravel()
    assert np.allclose(values, np.round(values, 1))


def test_measure_returns_the_contract_fields(measured: dict[str, Any]) -> None:
    assert_plain_json(measured)
    assert set(measured) == {
        "image",
        "face",
        "calibration",
        "hairline",
        "measurements",
        "assessment",
        "segmenter",
        "annotated_image_base64",
    }
    assert measured["image"] == {"width": 512, "height": 512}
    x, y, w, h = measured["face"]["bbox"]
    assert all(isinstance(value, int) for value in (x, y, w, h)) and 50 < w < 200 and 50 < h < 250
    pose = measured["face"]["pose"]
    assert set(pose) == {"yaw", "pitch", "roll"} and abs(pose["yaw"]) < 15
    assert measured["calibration"]["method"] == "iris" and 6 < measured["calibration"]["iris_diameter_px"] < 11
    assert measured["calibration"]["mm_per_px"] == pytest.approx(
        11.7 / measured["calibration"]["iris_diameter_px"], rel=0.01
    )
    assert measured["segmenter"] == "hairnet"  # the default install (issue 17)
    hairline = measured["hairline"]
    assert set(hairline) == {"status", "points", "trichion", "shape", "uncertainty_mm"}
    assert hairline["status"] in ("ok", "uncertain", "no_hairline", "occluded")
    assert set(measured["measurements"]) >= {
        "forehead_height_mm",
        "middle_third_mm",
        "lower_third_mm",
        *NULL_WITHOUT_HAIRLINE,
    }
    assert set(measured["assessment"]) == {"forehead", "notes"}
    if hairline["status"] in ("no_hairline", "occluded"):
        assert hairline["points"] is None and hairline["trichion"] is None and hairline["shape"] is None
        assert all(measured["measurements"][key] is None for key in NULL_WITHOUT_HAIRLINE)
    else:
        assert_rounded(hairline["points"])
        assert_rounded(hairline["trichion"])
    assert measured["measurements"]["middle_third_mm"] > 30
    assert png(measured["annotated_image_base64"]).shape == (512, 512, 3)


def test_the_lifted_fringes_line_is_measured(measured: dict[str, Any]) -> None:
    hairline = measured["hairline"]
    assert hairline["status"] in ("ok", "uncertain") and hairline["uncertainty_mm"] is not None
    assert abs(hairline["trichion"][1] - ASTRONAUT_LIFTED_ROW) <= 2.0  # px: the painted line
    assert measured["measurements"]["forehead_height_mm"] > 40


def test_a_fringe_over_the_forehead_is_occluded(models: Models, astronaut_png: bytes) -> None:
    """The astronaut's fringe covers her forehead: its edge lies 20 mm above her glabella,
    where no hairline is. A forehead number would be the fringe's, so none is given; it was
    `uncertain`, forehead 19.8 mm (contract.md endpoint 1: a fringe that hides the hairline
    is `occluded`)."""
    data = call("measure", astronaut_png, models)
    assert data["hairline"]["status"] == "occluded" and data["hairline"]["trichion"] is None
    assert NOTE_FRINGE_COVERS in data["assessment"]["notes"]
    assert all(data["measurements"][key] is None for key in NULL_WITHOUT_HAIRLINE)
    assert data["measurements"]["middle_third_mm"] > 30


def test_a_gif_is_1002(models: Models, astronaut: np.ndarray) -> None:
    assert refused("measure", encode(astronaut, "GIF"), models).kind is RefusalKind.UNSUPPORTED_IMAGE


def test_a_small_photo_is_1004_before_any_face_check(models: Models, astronaut: np.ndarray) -> None:
    assert refused("measure", encode(astronaut[:320, :320], "PNG"), models).kind is RefusalKind.BAD_RESOLUTION


class _Untouched:
    """Models that fail any test which reaches them: the refusal must come first."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the models were used ({name}) before the answer's size was checked")


@pytest.mark.parametrize(
    ("endpoint", "fields", "pictures"),
    [
        ("grow", {}, 6),
        ("grow", {"plans": '["standard"]'}, 2),
        ("hairline", {}, 4),
        ("mark", {"drop_mm": "5"}, 2),
        ("measure", {}, 1),
        ("mask", {}, 1),
    ],
)
def test_an_answer_too_large_to_draw_is_1004_before_anything_runs(
    endpoint: str, fields: dict[str, Any], pictures: int, astronaut: np.ndarray
) -> None:
    """Issue 39: one legal 7200x7200 /grow drew six ~73 MB PNGs, an answer past the gateway's
    512 MiB that ejected two hosts in turn. The pictures an answer draws are bounded
    (`analysis.max_answer_megapixels`) and counted before the photo reaches a model."""
    drawn_mp = pictures * 512 * 512 / 1e6  # the astronaut: 512 x 512
    options = parse_options(endpoint, fields)
    below = AnalysisSettings(max_answer_megapixels=round(drawn_mp - 0.01, 2))
    with pytest.raises(AnalysisError) as caught:
        run_endpoint(endpoint, encode(astronaut, "PNG"), options, _Untouched(), below)  # type: ignore[arg-type]
    assert caught.value.kind is RefusalKind.BAD_RESOLUTION
    assert f"{pictures} 张 512×512" in caught.value.message
    assert (
        f"共 {drawn_mp:.1f} 百万像素" in caught.value.message
        and f"上限 {below.max_answer_megapixels:g}" in caught.value.message
    )
    check_answer_size(endpoint, options, 512, 512, AnalysisSettings(max_answer_megapixels=drawn_mp))  # drawn


def test_two_faces_are_1006(models: Models, two_faces: np.ndarray) -> None:
    assert refused("mask", encode(two_faces, "JPEG", quality=92), models).kind is RefusalKind.MULTIPLE_FACES


def test_no_face_is_1005(models: Models, no_face: np.ndarray) -> None:
    larger = cv2.resize(no_face, (900, 600), interpolation=cv2.INTER_CUBIC)
    assert refused("hairline", encode(larger, "JPEG"), models).kind is RefusalKind.NO_FACE


def turned_point(point: Any, degrees: float, shape: tuple[int, ...]) -> np.ndarray:
    """Where `images.rotated(..., degrees)` takes a pixel of the photo (x, y)."""
    centre = (np.array([shape[1], shape[0]], dtype=np.float64) - 1) / 2
    x, y = np.asarray(point, dtype=np.float64) - centre
    angle = np.radians(degrees)
    return centre + np.array([x * np.cos(angle) + y * np.sin(angle), -x * np.sin(angle) + y * np.cos(angle)])


@pytest.mark.parametrize("degrees", [20, -24])  # her own roll is about -3°: -27° near the 30° limit
def test_a_tilted_head_is_measured_upright_in_the_photos_pixels(
    models: Models, astronaut_lifted: np.ndarray, degrees: float
) -> None:
    # issue 17: a 16° tilt was refused with 1008. Roll up to 30° is undone, not refused.
    # (The astronaut at 2x, a 16 px iris, her fringe brushed back: her own fringe and
    # grace_hopper's cap hide their hairlines, occluded.)
    photo = cv2.resize(astronaut_lifted, (1024, 1024), interpolation=cv2.INTER_CUBIC)
    upright = call("measure", encode(photo, "PNG"), models)
    tilted = call("measure", encode(rotated(photo, degrees), "PNG"), models)
    assert abs(tilted["face"]["pose"]["roll"]) > 15
    assert tilted["hairline"]["status"] == upright["hairline"]["status"]
    expected = turned_point(upright["hairline"]["trichion"], degrees, photo.shape)
    assert np.linalg.norm(np.array(tilted["hairline"]["trichion"]) - expected) < 4.0  # px, on a 16 px iris
    for key in ("forehead_height_mm", "middle_third_mm"):
        # the iris is resampled by the turn: ~1 px of 16 changes the scale by up to ~7 %
        assert tilted["measurements"][key] == pytest.approx(upright["measurements"][key], rel=0.1)
    points = np.array(tilted["hairline"]["points"])
    assert (points >= 0).all() and (points[:, 0] < photo.shape[1]).all()


def test_a_tilted_heads_mask_is_in_the_photos_pixels(models: Models, astronaut: np.ndarray) -> None:
    upright = png(call("mask", encode(astronaut, "PNG"), models)["mask_image_base64"]) > 0
    tilted = rotated(astronaut, 25)
    mask = png(call("mask", encode(tilted, "PNG"), models)["mask_image_base64"]) > 0
    assert mask.shape == tilted.shape[:2]
    expected = rotated(np.repeat(upright[:, :, None] * np.uint8(255), 3, axis=2), 25)[:, :, 0] > 127
    assert np.count_nonzero(mask & expected) / np.count_nonzero(mask | expected) > 0.8


def test_a_photo_measured_just_past_a_pose_limit_gets_a_wider_band_and_a_note(face: Face) -> None:
    hairline = Hairline(
        status="ok",
        points=np.array([[200.0, 70.0], [250.0, 70.0]]),
        trichion=(226.0, 70.0),
        shape="straight",
        uncertainty_mm=1.5,
    )
    calibration = calibrate(face)
    limits = AnalysisSettings()  # yaw ±15°, pitch ±20°
    within = _widened_for_pose(hairline, FrontalFace(face, Pose(14.0, 0.0, 0.0), 0.0), calibration, limits)
    assert within == hairline
    past = _widened_for_pose(hairline, FrontalFace(face, Pose(18.0, 5.0, 0.0), 3.0), calibration, limits)
    height_mm = (face.points[LandmarkId.GLABELLA][1] - 70.0) * calibration.mm_per_px  # about: the face is upright
    extra = height_mm * (np.cos(np.radians(15)) - np.cos(np.radians(18)))
    assert past.uncertainty_mm == pytest.approx(1.5 + extra, rel=0.05)
    assert past.status == "ok" and "头部偏转略超出建议范围" in past.notes[-1]
    # yaw 2° past its limit, pitch 19° within its own: the yaw's turn widens it, not the pitch's
    mixed = _widened_for_pose(hairline, FrontalFace(face, Pose(17.0, 19.0, 0.0), 2.0), calibration, limits)
    yaw_alone = _widened_for_pose(hairline, FrontalFace(face, Pose(17.0, 0.0, 0.0), 2.0), calibration, limits)
    assert mixed.uncertainty_mm == pytest.approx(yaw_alone.uncertainty_mm)


def test_a_face_rolled_past_the_limit_is_1008(models: Models, astronaut: np.ndarray) -> None:
    assert refused("grow", encode(rotated(astronaut, 40), "PNG"), models).kind is RefusalKind.NOT_FRONTAL


def test_a_phone_sized_photo_is_measured_in_its_own_pixels(models: Models, astronaut: np.ndarray) -> None:
    # issue 17: 4352-4600 px phone photos were refused with 1004 ("分辨率过高")
    small = call("measure", encode(astronaut, "PNG"), models)
    large = cv2.copyMakeBorder(
        cv2.resize(astronaut, (2560, 2560), interpolation=cv2.INTER_CUBIC), 0, 0, 1020, 1020, cv2.BORDER_REPLICATE
    )  # 4600 x 2560
    data = call("measure", encode(large, "JPEG", quality=92), models)
    assert data["image"] == {"width": 4600, "height": 2560}
    assert png(data["annotated_image_base64"]).shape == (2560, 4600, 3)
    expected = np.array(small["face"]["bbox"][:2]) * 5 + [1020, 0]
    assert np.abs(np.array(data["face"]["bbox"][:2]) - expected).max() < 15  # px of the 4600 px photo
    assert data["calibration"]["mm_per_px"] == pytest.approx(small["calibration"]["mm_per_px"] / 5, rel=0.1)


def test_mask_is_a_binary_png_of_input_size(models: Models, astronaut: np.ndarray) -> None:
    data = call("mask", encode(astronaut, "JPEG", quality=95), models)
    assert set(data) == {"mask_image_base64", "hair_area_ratio"}
    mask = png(data["mask_image_base64"])
    assert mask.shape == astronaut.shape[:2] and mask.dtype == np.uint8
    assert set(np.unique(mask)) <= {0, 255} and (mask == 255).any()
    assert data["hair_area_ratio"] == pytest.approx((mask == 255).mean(), abs=1e-4)
    assert 0.01 < data["hair_area_ratio"] < 0.5


def test_a_caps_band_is_no_hair_in_the_mask(models: Models, grace_hopper: np.ndarray, astronaut: np.ndarray) -> None:
    """issue 17: masks hold the subject's hair only. grace_hopper's cap band, which the hair
    network takes for hair (3.7 % of the photo; the hairline is `occluded` for it), is taken
    out, her grey hair at the temples stays; a head without headwear keeps its whole mask."""
    for photo, expect_band in ((grace_hopper, True), (astronaut, False)):
        face = models.detector.detect(photo)
        network = models.segmenter.segment(photo, face).hair  # both heads upright: no turn
        mask = png(call("mask", encode(photo, "PNG"), models)["mask_image_base64"]) > 0
        assert not (mask & ~network).any()
        if not expect_band:
            assert np.array_equal(mask, network)
            continue
        assert np.count_nonzero(mask) < 0.1 * np.count_nonzero(network)
        lightness = cv2.cvtColor(photo, cv2.COLOR_RGB2LAB)[..., 0]
        below_cap = np.arange(photo.shape[0])[:, None] > face.points[LandmarkId.MESH_TOP][1]
        dark, grey = network & (lightness < 60), network & (lightness >= 100) & below_cap
        assert np.count_nonzero(mask & dark) < 0.02 * np.count_nonzero(dark)  # the cap's cloth
        # her hair at the temples (the band's 1 px rim, blended with it, goes with the band)
        assert np.count_nonzero(mask & grey) > 0.6 * np.count_nonzero(grey)


def test_grow_draws_the_requested_plans(models: Models, lifted_png: bytes) -> None:
    data = call("grow", lifted_png, models, plans="aggressive,conservative", gender="male")
    assert [result["plan"] for result in data["results"]] == ["aggressive", "conservative"]
    for result in data["results"]:
        assert set(result) == {"plan", "hairline_drop_mm", "image_base64", "grown_image_base64", "generator"}
        assert result["generator"] == ("preview" if result["grown_image_base64"] else None)  # no ComfyUI here
        assert result["hairline_drop_mm"] is None or result["hairline_drop_mm"] >= 0
        assert png(result["image_base64"]).shape == (512, 512, 3)


def test_grow_returns_inpainting_masks_only_when_the_host_asks(
    models: Models, lifted_png: bytes, astronaut: np.ndarray
) -> None:
    options = {**parse_options("grow", {"plans": ["standard"]}), INPAINT_MASK_OPTION: True}
    data = run_endpoint("grow", lifted_png, options, models, LIMITS)
    mask = png(data["results"][0][INPAINT_MASK_KEY])
    assert data["results"][0]["grown_image_base64"] is None  # ComfyUI draws it, not the preview
    assert mask.shape == astronaut.shape[:2] and set(np.unique(mask)) <= {0, 255}
    assert not INPAINT_MASK_KEY.endswith("_base64")  # the gateway never publishes it


def test_a_caps_band_is_no_hairline_to_measure_or_grow(models: Models, grace_hopper: np.ndarray) -> None:
    """grace_hopper.jpg (issue 17): the hair network takes her cap's black band for hair;
    measured, it was a fringe on the cap's edge, and grown, the band was painted down her
    forehead. A covered hairline is `occluded`: no number, no drop, no grown picture."""
    photo = encode(grace_hopper, "PNG")
    data = call("measure", photo, models)
    assert data["hairline"]["status"] == "occluded" and data["hairline"]["trichion"] is None
    assert NOTE_HAT in data["assessment"]["notes"]
    assert all(data["measurements"][key] is None for key in NULL_WITHOUT_HAIRLINE)
    assert refused("mark", photo, models, drop_mm=4).kind is RefusalKind.INVALID_OPTION
    marked = call("mark", photo, models, hairline_points=[[200, 150], [264, 145], [330, 150]])
    assert marked["grown_image_base64"] is None and marked["generator"] is None
    for result in call("grow", photo, models, plans="standard,aggressive", gender="female")["results"]:
        assert result["hairline_drop_mm"] is None and result["grown_image_base64"] is None, result["plan"]


def test_mark_with_points(models: Models, astronaut_png: bytes, astronaut: np.ndarray) -> None:
    data = call("mark", astronaut_png, models, hairline_points=[[180, 75], [226, 66], [270, 77]])
    assert set(data) == {"marked_image_base64", "grown_image_base64", "generator"}
    marked = cv2.cvtColor(png(data["marked_image_base64"]), cv2.COLOR_BGR2RGB)
    assert marked.shape == astronaut.shape
    assert np.any(marked[66, 220:232] != astronaut[66, 220:232])  # the polyline is drawn where asked


def test_mark_points_outside_the_image_are_1001_before_the_face_check(models: Models, no_face: np.ndarray) -> None:
    larger = encode(cv2.resize(no_face, (900, 600)), "JPEG")
    error = refused("mark", larger, models, hairline_points=[[10, 10], [500, 20], [901, 30]])
    assert (
        error.kind is RefusalKind.INVALID_OPTION and "hairline_points" in error.message and "900×600" in error.message
    )


def test_hairline_styles_in_requested_order(models: Models, grace_hopper: np.ndarray) -> None:
    data = call("hairline", encode(grace_hopper, "PNG"), models, styles=["widows_peak", "straight"])
    assert [item["style"] for item in data["hairline_images"]] == ["widows_peak", "straight"]
    for item in data["hairline_images"]:
        assert set(item) == {"style", "image_base64"}
        assert png(item["image_base64"]).shape == grace_hopper.shape


def test_special_points_are_rounded_landmarks(models: Models, astronaut_png: bytes, astronaut: np.ndarray) -> None:
    data = call("special-points", astronaut_png, models)
    assert data["image"] == {"width": 512, "height": 512}
    assert set(data["points"]) == SPECIAL_POINT_NAMES
    face = models.detector.detect(astronaut)
    assert data["points"]["trichion"] == pytest.approx(face.points[LandmarkId.MESH_TOP], abs=0.051)
    assert data["points"]["left_iris_center"][0] < data["points"]["right_iris_center"][0]
    assert_rounded(list(data["points"].values()))
    assert special_points(astronaut, models.detector) == data  # the gateway's entry: same answer


def test_special_points_pose_gate_applies_when_limits_are_given(models: Models, astronaut: np.ndarray) -> None:
    rolled = rotated(astronaut, 40)
    assert special_points(rolled, models.detector)["points"]["trichion"] is not None
    with pytest.raises(AnalysisError) as caught:
        special_points(rolled, models.detector, LIMITS)
    assert caught.value.kind is RefusalKind.NOT_FRONTAL


def labelled_photo(photos_dir: Path, name: str, scale: float = 1.0) -> bytes:
    rgb = load_photo(photos_dir, name)
    if scale != 1.0:  # several labelled photos are below the 480 px minimum
        rgb = cv2.resize(rgb, None, fx=scale, fy=scale, interpolation=cv2.INTER_CUBIC)
    return encode(rgb, "PNG")


@pytest.mark.parametrize("name", ["obama.jpg", "biden2.jpg", "tom_cruise.jpg", "astronaut", "grace_hopper"])
def test_the_drawn_lines_stay_visible_on_real_photos(
    models: Models, photos_dir: Path, astronaut: np.ndarray, grace_hopper: np.ndarray, name: str
) -> None:
    # issue 17: the legend covered a third of obama's drawn hairline (biden2: 34 %)
    rgb = {"astronaut": astronaut, "grace_hopper": grace_hopper}.get(name)
    if rgb is None:
        rgb = load_photo(photos_dir, name)
        rgb = rgb if min(rgb.shape[:2]) >= 480 else cv2.resize(rgb, None, fx=2, fy=2, interpolation=cv2.INTER_CUBIC)
    data = call("measure", encode(rgb, "PNG"), models)
    picture = cv2.cvtColor(png(data["annotated_image_base64"]), cv2.COLOR_BGR2RGB)
    if data["hairline"]["points"] is not None:
        assert visible_share(picture, np.array(data["hairline"]["points"]), render.HAIRLINE) >= 0.95
    found = analyse(rgb, models, LIMITS)
    for plan in designs.plan_designs(["standard", "aggressive"], found.face, found.hairline, found.calibration, "male"):
        drawn = render.draw_design(rgb, found.hairline, plan, f"plan {plan.name}: drop 12.3 mm")
        assert visible_share(drawn, plan.points, render.DESIGN) >= 0.95, plan.name


def test_mark_by_drop_on_a_detected_hairline(models: Models, photos_dir: Path) -> None:
    photo = labelled_photo(photos_dir, "obama.jpg")
    assert call("measure", photo, models)["hairline"]["status"] in ("ok", "uncertain")
    data = call("mark", photo, models, drop_mm="10")
    assert png(data["marked_image_base64"]).shape == (1137, 910, 3)


def test_bald_head_mark_by_drop_is_1001_and_grow_has_no_drop(models: Models, photos_dir: Path) -> None:
    photo = labelled_photo(photos_dir, "willis_white.png", scale=2.0)
    error = refused("mark", photo, models, drop_mm=5)
    assert (
        error.kind is RefusalKind.INVALID_OPTION and "drop_mm" in error.message and "hairline_points" in error.message
    )
    options = {**parse_options("grow", {"plans": "standard", "gender": "male"}), INPAINT_MASK_OPTION: True}
    result = run_endpoint("grow", photo, options, models, LIMITS)["results"][0]
    assert result["hairline_drop_mm"] is None  # no hairline: no honest drop
    assert result["grown_image_base64"] is None and result["generator"] is None  # no hair to grow from
    assert INPAINT_MASK_KEY not in result  # so nothing for ComfyUI to draw
