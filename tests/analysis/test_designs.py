"""Designs on a real face (the astronaut's MediaPipe landmarks) with hairlines placed at known heights."""

from __future__ import annotations

import numpy as np
import pytest

from analysis.drawing import designs
from analysis.frame import FaceFrame
from analysis.types import PLANS, STYLES, Calibration, Face, Hairline, LandmarkId

pytestmark = pytest.mark.filterwarnings("error")


@pytest.fixture(scope="module")
def frame(face: Face) -> FaceFrame:
    return FaceFrame.from_face(face)


def hairline_at(
    face: Face, frame: FaceFrame, calibration: Calibration, height_mm: float, status: str = "ok", shape: str = "rounded"
) -> Hairline:
    """A gently curved hairline whose midline point is `height_mm` above the glabella."""
    left, right = designs.canthal_u(face, frame)
    u = np.linspace(1.3 * left, 1.3 * right, 40)
    v = height_mm / calibration.mm_per_px + 0.15 * (u / right) ** 2 * abs(right)
    points = frame.to_image(np.stack([u, v], axis=1))
    trichion = frame.to_image(np.array([[0.0, height_mm / calibration.mm_per_px]]))[0]
    return Hairline(
        status=status, points=points, trichion=(float(trichion[0]), float(trichion[1])), shape=shape, uncertainty_mm=2.0
    )  # type: ignore[arg-type]


def midline_height_mm(design: designs.Design, frame: FaceFrame, calibration: Calibration) -> float:
    uv = frame.to_frame(design.points)
    order = np.argsort(uv[:, 0])
    return float(np.interp(0.0, uv[order, 0], uv[order, 1]) * calibration.mm_per_px)


NO_HAIRLINE = Hairline(status="no_hairline")


def test_frame_is_the_facial_midline(face: Face, frame: FaceFrame) -> None:
    uv = frame.to_frame(face.points[[LandmarkId.MESH_TOP, LandmarkId.GLABELLA, LandmarkId.MENTON]])
    assert uv[1] == pytest.approx([0.0, 0.0])
    assert uv[0, 1] > 0 > uv[2, 1]  # up is towards the forehead
    assert abs(uv[0, 0]) < 3 and abs(uv[2, 0]) < 3  # both ends of the face on the midline
    assert np.allclose(frame.to_image(frame.to_frame(face.points[:5])), face.points[:5])


@pytest.mark.parametrize("gender, targets", [("male", (85, 80, 75)), ("female", (65, 60, 55))])
def test_plans_reach_their_target_heights(face, frame, calibration, gender, targets) -> None:
    receded = hairline_at(face, frame, calibration, 100.0)
    for plan, target in zip(PLANS, targets, strict=True):
        design = designs.plan_design(plan, face, receded, calibration, gender)
        assert midline_height_mm(design, frame, calibration) == pytest.approx(target, abs=0.05)
        assert design.drop_mm == pytest.approx(100.0 - target, abs=0.05)


def test_unknown_gender_follows_the_middle_third(face, frame, calibration) -> None:
    middle = designs.middle_third_mm(face, frame, calibration)
    standard = min(max(middle, 60.0), 80.0)
    receded = hairline_at(face, frame, calibration, 100.0)
    heights = [
        midline_height_mm(designs.plan_design(plan, face, receded, calibration, "unknown"), frame, calibration)
        for plan in PLANS
    ]
    assert heights == pytest.approx([standard + 5, standard, standard - 5], abs=0.05)


@pytest.mark.parametrize("current_mm", [40.0, 57.0, 62.0, 77.0, 90.0])
@pytest.mark.parametrize("gender", ["male", "female", "unknown"])
def test_plans_never_above_the_current_hairline(face, frame, calibration, current_mm, gender) -> None:
    current = hairline_at(face, frame, calibration, current_mm)
    for design in designs.plan_designs(list(PLANS), face, current, calibration, gender):
        assert design.drop_mm is not None and design.drop_mm >= 0
        uv = frame.to_frame(design.points)
        assert np.all(uv[:, 1] <= designs.current_heights(current, frame, uv[:, 0]) + 1e-9)
        if design.drop_mm == 0:
            assert midline_height_mm(design, frame, calibration) == pytest.approx(current_mm, abs=0.05)


def test_without_a_hairline_plans_use_the_face_and_report_no_drop(face, frame, calibration) -> None:
    for status in ("no_hairline", "occluded"):
        design = designs.plan_design("standard", face, Hairline(status=status), calibration, "male")  # type: ignore[arg-type]
        assert design.drop_mm is None
        assert midline_height_mm(design, frame, calibration) == pytest.approx(80.0, abs=0.05)


@pytest.mark.parametrize("style", STYLES)
def test_styles_pass_through_the_frontotemporal_points(face, frame, calibration, style) -> None:
    design = designs.style_design(style, face, NO_HAIRLINE, calibration, "female")
    left, right = designs.canthal_u(face, frame)
    ends = frame.to_frame(design.points[[0, -1]])
    assert ends[:, 0] == pytest.approx([left, right])  # on the lateral canthal lines through 33 / 263
    corners = frame.to_frame(face.points[list(LandmarkId.OUTER_EYE_CORNERS)])[:, 0]
    assert sorted(corners) == pytest.approx(ends[:, 0])
    trichion_v = 60.0 / calibration.mm_per_px
    expected = designs.frontotemporal_points(frame, (left, right), trichion_v)
    assert np.allclose(design.points[[0, -1]], expected)
    assert midline_height_mm(design, frame, calibration) == pytest.approx(60.0, abs=0.05)


def test_styles_have_their_own_shapes(face, frame, calibration) -> None:
    heights = {
        style: frame.to_frame(designs.style_design(style, face, NO_HAIRLINE, calibration, "male").points)[:, 1]
        for style in STYLES
    }
    temple = heights["rounded"][0]
    assert heights["m_shape"].max() > temple + 1  # recessions rise above the frontotemporal points
    assert heights["rounded"].max() == pytest.approx(temple)
    quarter = len(heights["rounded"]) // 4
    # straight stays flatter than rounded across the forehead; the widow's peak dips at the midline only
    assert heights["straight"][quarter] < heights["rounded"][quarter]
    middle = len(heights["rounded"]) // 2
    assert heights["widows_peak"][middle] == heights["widows_peak"].min()
    assert heights["widows_peak"][middle - 3] > heights["rounded"][middle - 3]
    for curve in heights.values():  # smooth: no kinks between neighbouring samples
        assert np.abs(np.diff(curve, 2)).max() < 0.2 * (temple - curve.min() + 1)


def test_styles_stay_at_or_below_a_low_current_hairline(face, frame, calibration) -> None:
    current = hairline_at(face, frame, calibration, 45.0)
    design = designs.style_design("rounded", face, current, calibration, "male")
    assert midline_height_mm(design, frame, calibration) == pytest.approx(45.0, abs=0.05)
    assert design.drop_mm == 0


@pytest.mark.parametrize("drop_mm", [0.0, 7.5, 40.0])
def test_mark_by_drop_moves_the_hairline_down_the_midline(face, frame, calibration, drop_mm) -> None:
    current = hairline_at(face, frame, calibration, 70.0)
    design = designs.lowered_hairline(face, current, calibration, drop_mm)
    shift = design.points - current.points
    assert np.linalg.norm(shift, axis=1) == pytest.approx(np.full(len(shift), drop_mm / calibration.mm_per_px))
    assert np.allclose(
        frame.to_frame(design.points)[:, 1], frame.to_frame(current.points)[:, 1] - drop_mm / calibration.mm_per_px
    )
    if drop_mm:
        assert np.all(shift[:, 1] > 0)  # down in the image


def test_mark_by_drop_needs_a_detected_hairline(face, calibration) -> None:
    with pytest.raises(ValueError):
        designs.lowered_hairline(face, NO_HAIRLINE, calibration, 5.0)


def test_inpainting_mask_covers_the_band_between_design_and_current(face, frame, calibration) -> None:
    current = hairline_at(face, frame, calibration, 90.0)
    design = designs.plan_design("aggressive", face, current, calibration, "female")  # 55 mm: a 35 mm band
    mask = designs.inpainting_mask(face, design, current, calibration)
    assert mask.shape == (face.image_height, face.image_width) and set(np.unique(mask)) == {0, 255}

    def at(height_mm: float) -> int:
        x, y = np.round(frame.to_image(np.array([[0.0, height_mm / calibration.mm_per_px]]))[0]).astype(int)
        return int(mask[y, x])

    assert at(72.0) == 255  # inside the band
    assert at(110.0) == 0 and at(35.0) == 0  # well above the current hairline / below the design
    assert at(53.0) == 255  # the dilation reaches ~3 mm past the design


def test_inpainting_mask_is_empty_when_nothing_grows(face, frame, calibration) -> None:
    current = hairline_at(face, frame, calibration, 50.0)
    design = designs.plan_design("conservative", face, current, calibration, "male")
    assert design.drop_mm == 0
    assert not designs.inpainting_mask(face, design, current, calibration).any()


def test_inpainting_mask_without_a_hairline_stays_inside_the_person(face, calibration) -> None:
    design = designs.plan_design("standard", face, NO_HAIRLINE, calibration, "female")
    person = np.zeros((face.image_height, face.image_width), dtype=bool)
    person[40:, :] = True  # pretend the head ends at row 40
    mask = designs.inpainting_mask(face, design, NO_HAIRLINE, calibration, person)
    assert mask.any()
    radius = round(designs.MASK_DILATION_MM / calibration.mm_per_px)
    assert not mask[: 40 - radius - 1].any()
