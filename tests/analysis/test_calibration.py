"""Iris calibration: the horizontal diameter only, scale and uncertainty, real interpupillary distances."""

from __future__ import annotations

import numpy as np
import pytest

from analysis.face.calibration import POPULATION_RELATIVE_SPREAD, calibrate
from analysis.face.landmarks import LANDMARK_COUNT
from analysis.types import Face, LandmarkId

from .images import load_photo


def interpupillary_mm(face: Face) -> float:
    left, right = face.points[list(LandmarkId.IRIS_CENTERS)]
    return float(np.hypot(*(left - right))) * calibrate(face).mm_per_px


def eyes(left_diameter: float, right_diameter: float, vertical: float = 5.0, turn_degrees: float = 0.0) -> Face:
    """A face whose only meaningful landmarks are two iris rings (centre, then the ring
    469..472 = right, top, left, bottom in the eye's frame), turned in the image plane."""
    landmarks = np.zeros((LANDMARK_COUNT, 3))
    for centre_id, centre, diameter in ((468, (200.0, 300.0), left_diameter), (473, (330.0, 300.0), right_diameter)):
        offsets = np.array([[0, 0], [diameter / 2, 0], [0, -vertical / 2], [-diameter / 2, 0], [0, vertical / 2]])
        turn = np.radians(turn_degrees)
        spin = np.array([[np.cos(turn), -np.sin(turn)], [np.sin(turn), np.cos(turn)]])
        landmarks[centre_id : centre_id + 5, :2] = np.array(centre) + offsets @ spin.T
    return Face(landmarks=landmarks, image_width=640, image_height=480)


def test_scale_from_the_mean_horizontal_diameter():
    calibration = calibrate(eyes(20.0, 22.0), iris_diameter_mm=11.7)
    assert (calibration.left_iris_px, calibration.right_iris_px) == pytest.approx((20.0, 22.0))
    assert calibration.iris_diameter_px == pytest.approx(21.0)
    assert calibration.mm_per_px == pytest.approx(11.7 / 21.0)


def test_vertical_diameter_is_ignored():
    # Lids cover the top and bottom of the iris: the vertical pair must not matter.
    half_closed = calibrate(eyes(20.0, 20.0, vertical=6.0))
    open_wide = calibrate(eyes(20.0, 20.0, vertical=19.0))
    assert half_closed.mm_per_px == open_wide.mm_per_px


def test_head_roll_does_not_change_the_scale():
    assert calibrate(eyes(20.0, 22.0, turn_degrees=25.0)).mm_per_px == pytest.approx(
        calibrate(eyes(20.0, 22.0)).mm_per_px
    )


def test_uncertainty_shrinks_with_iris_size_and_grows_with_disagreement():
    small = calibrate(eyes(8.0, 8.0)).relative_uncertainty
    large = calibrate(eyes(40.0, 40.0)).relative_uncertainty
    lopsided = calibrate(eyes(36.0, 44.0)).relative_uncertainty
    assert small > 0.12  # ±1 px on 8 px alone is 12.5 %
    assert POPULATION_RELATIVE_SPREAD < large < 0.05
    assert lopsided > large + 0.05  # 10 % each way from the mean


def test_degenerate_irises_are_refused():
    with pytest.raises(ValueError, match="degenerate"):
        calibrate(eyes(0.0, 0.0))


@pytest.mark.parametrize("photo", ["astronaut", "grace_hopper"])
def test_interpupillary_distance_is_adult(detector, request, photo):
    assert 55.0 <= interpupillary_mm(detector.detect(request.getfixturevalue(photo))) <= 70.0


def test_astronaut_iris_is_small_and_says_so(detector, astronaut):
    calibration = calibrate(detector.detect(astronaut))
    assert 6.0 < calibration.iris_diameter_px < 11.0
    assert calibration.relative_uncertainty > 0.10


def test_labelled_photos_give_adult_interpupillary_distances(detector, photos_dir, first_set_labels):
    # Adult IPD is ~54-74 mm; a wrong iris pair or a vertical diameter would leave that range.
    for label in first_set_labels:
        distance = interpupillary_mm(detector.detect(load_photo(photos_dir, label["file"])))
        assert 50.0 <= distance <= 74.0, (label["file"], distance)
