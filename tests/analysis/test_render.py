"""Rendering: every PNG decodes to the input size; hostile coordinates never raise or resize."""

from __future__ import annotations

import base64

import cv2
import numpy as np
import pytest

from analysis.drawing import designs, render
from analysis.face.calibration import calibrate
from analysis.types import Hairline

pytestmark = pytest.mark.filterwarnings("error")

MEASURE_DATA = {
    "measurements": {
        "forehead_height_mm": 61.5,
        "upper_third_mm": 61.5,
        "middle_third_mm": 63.0,
        "lower_third_mm": 64.2,
    },
    "assessment": {"forehead": "normal", "notes": ["虹膜较小"]},  # non-ASCII must not reach putText as such
    "segmenter": "fallback",
}


@pytest.fixture(scope="module")
def hairline() -> Hairline:
    """A rounded hairline across the astronaut's forehead, trichion at (226, 60)."""
    x = np.linspace(190, 262, 25)
    points = np.stack([x, 60 + 0.01 * (x - 226) ** 2], axis=1)
    return Hairline(
        status="ok",
        points=points,
        trichion=(226.0, 60.0),
        shape="rounded",
        uncertainty_mm=2.1,
        left_temple=(195.0, 73.0),
        right_temple=(256.0, 75.0),
    )


def decoded(png: bytes, flags: int = cv2.IMREAD_UNCHANGED) -> np.ndarray:
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    image = cv2.imdecode(np.frombuffer(png, dtype=np.uint8), flags)
    assert image is not None
    return image


def test_png_round_trip_is_lossless_and_keeps_rgb_order(astronaut: np.ndarray) -> None:
    back = decoded(render.encode_png(astronaut))
    assert np.array_equal(cv2.cvtColor(back, cv2.COLOR_BGR2RGB), astronaut)
    assert base64.b64decode(render.png_base64(astronaut)) == render.encode_png(astronaut)


def test_measurement_annotation_at_input_size(astronaut, face, hairline, calibration) -> None:
    annotated = render.annotate_measurement(astronaut.copy(), face, hairline, calibration, MEASURE_DATA)
    assert decoded(render.encode_png(annotated)).shape == astronaut.shape
    changed = np.any(annotated != astronaut, axis=2)
    assert changed.mean() > 0.01  # something was drawn...
    x, y = 226, 60
    assert changed[y - 2 : y + 3, x - 2 : x + 3].any()  # ...including the trichion marker
    assert not changed[500:, :100].any()  # ...and not everywhere


def test_annotation_of_a_face_without_hairline(astronaut, face, calibration) -> None:
    data = {
        "measurements": {"middle_third_mm": 63.0, "lower_third_mm": 64.2, "forehead_height_mm": None},
        "assessment": {"forehead": None},
        "segmenter": "bisenet",
    }
    annotated = render.annotate_measurement(astronaut.copy(), face, Hairline(status="no_hairline"), calibration, data)
    assert annotated.shape == astronaut.shape and np.any(annotated != astronaut)


@pytest.mark.parametrize("style", ["straight", "widows_peak"])
def test_design_images_at_input_size(grace_hopper, detector, style) -> None:
    face = detector.detect(grace_hopper)
    design = designs.style_design(style, face, Hairline(status="occluded"), calibrate(face), "female")
    image = render.draw_design(grace_hopper, Hairline(status="occluded"), design, f"style {style}")
    assert decoded(render.encode_png(image)).shape == grace_hopper.shape
    assert np.any(image != grace_hopper)


def test_mask_png_is_single_channel_zero_or_255() -> None:
    hair = np.zeros((480, 640), dtype=bool)
    hair[10:100, 200:400] = True
    mask = decoded(render.encode_png(render.mask_image(hair)))
    assert mask.shape == (480, 640) and mask.dtype == np.uint8
    assert set(np.unique(mask)) == {0, 255}
    assert np.array_equal(mask == 255, hair)


HOSTILE = np.array([[-1e9, -5.0], [1e12, 3e11], [np.nan, 20.0], [600.0, -40.0], [-30.0, 700.0], [np.inf, -np.inf]])


def test_points_outside_the_image_never_raise_nor_resize(astronaut, face, calibration) -> None:
    before = astronaut.copy()
    outside = Hairline(
        status="uncertain",
        points=HOSTILE,
        trichion=(-80.0, 9e9),
        shape="straight",
        uncertainty_mm=9.0,
        left_temple=(-1e6, 5.0),
        right_temple=(1e6, np.nan),
    )
    annotated = render.annotate_measurement(astronaut.copy(), face, outside, calibration, MEASURE_DATA)
    design = designs.Design("mark", HOSTILE.copy(), None)
    marked = render.draw_design(astronaut, outside, design, "x" * 500)  # a caption wider than the image
    for image in (annotated, marked):
        assert image.shape == astronaut.shape
        assert decoded(render.encode_png(image)).shape == astronaut.shape
    assert np.array_equal(astronaut, before)  # drawing happens on copies


def test_markers_and_labels_outside_are_moved_inside() -> None:
    canvas = np.zeros((100, 120, 3), dtype=np.uint8)
    pen = render.Pen(canvas)
    pen.marker((-50.0, -50.0), (255, 0, 0))
    assert canvas[0, 0, 0] == 255  # clamped to the corner, still visible
    pen.label("far right", (1e9, 1e9))
    bottom_right = canvas[60:, 40:]
    assert bottom_right.any()
    before = canvas.copy()
    pen.marker((np.nan, 3.0), (0, 255, 0))  # nowhere to place it: ignored
    pen.polyline(np.array([[np.nan, 1.0], [5.0, 5.0]]), (0, 255, 0))  # one finite point: no line
    assert np.array_equal(canvas, before)


def visible_share(image: np.ndarray, points: np.ndarray, colour: tuple[int, int, int]) -> float:
    """Share of a drawn line's own points (inside the image) where its colour shows."""
    points = np.asarray(points, dtype=np.float64).reshape(-1, 2)
    height, width = image.shape[:2]
    xy = np.round(points[np.isfinite(points).all(axis=1)]).astype(int)
    xy = xy[(xy[:, 0] >= 0) & (xy[:, 0] < width) & (xy[:, 1] >= 0) & (xy[:, 1] < height)]
    pixels = image[xy[:, 1], xy[:, 0]].astype(int)
    return float(np.mean(np.abs(pixels - np.array(colour)).max(axis=1) <= 40))


def test_the_legend_never_covers_the_hairline(astronaut, face, hairline, calibration) -> None:
    # the fixture's hairline runs through the top-left corner, where the legend used to sit
    annotated = render.annotate_measurement(astronaut.copy(), face, hairline, calibration, MEASURE_DATA)
    assert visible_share(annotated, hairline.points, render.HAIRLINE) >= 0.95


def test_a_legend_with_nowhere_free_covers_the_least() -> None:
    pen = render.Pen(np.zeros((200, 300, 3), np.uint8))
    pen.protect_hull(np.array([[0, 0], [300, 0], [300, 120], [0, 120]], dtype=np.float64))  # the top 60 %
    _x, y = pen.place(pen.text_size(["a legend"]), [(0, 0)])
    assert y >= 120  # below the subject, not over it


def test_plus_minus_is_drawn_as_itself() -> None:
    # issue 17: the band read "+-10.0 mm"; the font must have the glyph, not a box or "?"
    def drawn(text: str) -> np.ndarray:
        canvas = np.zeros((60, 200, 3), np.uint8)
        render.Pen(canvas).text_block([text])
        return canvas

    plus_minus = drawn("\u00b1")
    assert plus_minus.any()
    for other in ("+-", "?", "\u25a1", "+"):
        assert not np.array_equal(plus_minus, drawn(other)), other


def test_encoding_several_images_keeps_their_order(astronaut: np.ndarray) -> None:
    images = [astronaut, astronaut[::-1], np.zeros((480, 500), dtype=np.uint8)]
    assert render.png_base64_all(images) == [render.png_base64(image) for image in images]
    assert render.png_base64_all([]) == []
