"""The MediaPipe face mesh on real faces: one face found, none, two, and small faces."""

from __future__ import annotations

import numpy as np
import pytest

from analysis.errors import AnalysisError
from analysis.face.landmarks import LANDMARK_COUNT
from analysis.types import LandmarkId
from shared.contract import RefusalKind

from .images import gradient, load_photo, mirrored, pasted_on_canvas, side_by_side


def detection_error(detector, rgb: np.ndarray) -> AnalysisError:
    with pytest.raises(AnalysisError) as caught:
        detector.detect(rgb)
    return caught.value


def test_astronaut_has_478_landmarks_inside_the_image(detector, astronaut):
    face = detector.detect(astronaut)
    assert face.landmarks.shape == (LANDMARK_COUNT, 3)
    assert (face.image_width, face.image_height) == (512, 512)
    assert (face.points >= 0).all() and (face.points < 512).all()


@pytest.mark.parametrize("photo", ["astronaut", "grace_hopper"])
def test_midline_landmarks_run_top_to_bottom(detector, request, photo):
    face = detector.detect(request.getfixturevalue(photo))
    rows = face.points[list(LandmarkId.MIDLINE), 1]
    assert (np.diff(rows) > 0).all(), rows


def test_image_left_and_right_landmarks(detector, astronaut):
    points = detector.detect(astronaut).points
    left_iris, right_iris = points[list(LandmarkId.IRIS_CENTERS)]
    assert left_iris[0] < right_iris[0]
    outer_left, outer_right = points[list(LandmarkId.OUTER_EYE_CORNERS)]
    assert outer_left[0] < left_iris[0] < right_iris[0] < outer_right[0]
    # the mesh top sits above the glabella, which sits above the menton
    assert points[LandmarkId.MESH_TOP, 1] < points[LandmarkId.GLABELLA, 1] < points[LandmarkId.MENTON, 1]


def test_grace_hopper_is_one_face(detector, grace_hopper):
    face = detector.detect(grace_hopper)
    _x, _y, w, h = face.bbox
    assert (face.image_width, face.image_height) == (512, 600)
    assert 150 < w < 350 and 200 < h < 400  # her face, not the whole picture


def test_mirrored_face_mirrors_the_landmarks(detector, astronaut):
    direct = detector.detect(astronaut).points
    flipped = detector.detect(mirrored(astronaut)).points
    # image-left and image-right swap: the iris centres trade places
    swapped_irises = flipped[list(reversed(LandmarkId.IRIS_CENTERS))]
    mirrored_back = np.column_stack([511 - swapped_irises[:, 0], swapped_irises[:, 1]])
    np.testing.assert_allclose(mirrored_back, direct[list(LandmarkId.IRIS_CENTERS)], atol=2.0)


def test_two_large_faces_are_1006(detector, two_faces):
    error = detection_error(detector, two_faces)
    assert error.kind is RefusalKind.MULTIPLE_FACES
    assert "单人" in error.message


def test_two_small_faces_are_1006(detector, astronaut):
    # Each face is ~10 % of the width: the mesh's short-range detector misses both, the
    # full-range one must still count two.
    assert detection_error(detector, side_by_side(astronaut, mirrored(astronaut))).kind is RefusalKind.MULTIPLE_FACES


def test_photo_without_a_face_is_1005(detector, no_face):
    error = detection_error(detector, no_face)
    assert error.kind is RefusalKind.NO_FACE
    assert "未检测到人脸" in error.message


def test_plain_gradient_is_1005(detector):
    assert detection_error(detector, gradient()).kind is RefusalKind.NO_FACE


def test_small_face_in_a_large_picture_is_found(detector, astronaut):
    direct = detector.detect(astronaut).points
    canvas = pasted_on_canvas(astronaut, size=2048, top=700, left=900)
    far = detector.detect(canvas)
    assert (far.image_width, far.image_height) == (2048, 2048)
    # same face, moved by the paste offset; a few px of jitter from the different crop
    offset_error = np.abs(far.points - direct - (900, 700))
    assert np.median(offset_error) < 1.5 and offset_error.max() < 5


def test_rejects_arrays_that_are_not_rgb8(detector, astronaut):
    with pytest.raises(ValueError, match="RGB uint8"):
        detector.detect(astronaut.astype(np.float32))
    with pytest.raises(ValueError, match="RGB uint8"):
        detector.detect(astronaut[..., 0])


def test_every_labelled_photo_has_one_face(detector, photos_dir, first_set_labels):
    for label in first_set_labels:
        rgb = load_photo(photos_dir, label["file"])
        face = detector.detect(rgb)
        assert face.landmarks.shape == (LANDMARK_COUNT, 3), label["file"]
