"""Head pose: synthetic rotations of the canonical face recovered, real faces, the 1008 rule."""

from __future__ import annotations

import math

import numpy as np
import pytest
from PIL import Image

from analysis.endpoints import frontal_face
from analysis.errors import AnalysisError
from analysis.face.landmarks import LANDMARK_COUNT
from analysis.face.pose import (
    FRONTAL_PITCH_DEGREES,
    NEAR_LIMIT_DEGREES,
    canonical_face_model,
    canonical_pose,
    check_pose,
    estimate_pose,
    orthographic_pose,
    pose_is_stable,
    procrustes_weights,
    turned_over,
    weighted_similarity,
)
from analysis.image_input import decode_image
from analysis.types import Face, Pose
from shared.contract import RefusalKind
from shared.settings import AnalysisSettings

from .images import encode, load_photo, mirrored, rotated

EXIF_ORIENTATION = 0x0112


def rotation(yaw: float, pitch: float, roll: float) -> np.ndarray:
    """Rz(roll) · Rx(pitch) · Ry(yaw), angles in degrees: turned, nodded, then tilted in the image."""
    a, b, c = (math.radians(angle) for angle in (pitch, yaw, roll))
    rx = np.array([[1, 0, 0], [0, math.cos(a), -math.sin(a)], [0, math.sin(a), math.cos(a)]])
    ry = np.array([[math.cos(b), 0, math.sin(b)], [0, 1, 0], [-math.sin(b), 0, math.cos(b)]])
    rz = np.array([[math.cos(c), -math.sin(c), 0], [math.sin(c), math.cos(c), 0], [0, 0, 1]])
    return rz @ rx @ ry


def photographed(
    yaw: float, pitch: float, roll: float, noise_px: float = 0.0, seed: int = 0, looking: bool = False
) -> Face:
    """The canonical face turned by the angles, then seen the way MediaPipe reports it:
    pixels with y down, z growing away from the camera, ~25 px per cm, centred at (320, 240).
    With `looking`, the angles count from a face looking at the camera (the model's own
    frontal pitch applied first)."""
    turn = rotation(yaw, pitch, roll) @ (rotation(0, FRONTAL_PITCH_DEGREES, 0) if looking else np.eye(3))
    turned = canonical_face_model() @ turn.T * 25.0
    pixels = turned * np.array([1.0, -1.0, -1.0]) + np.array([320.0, 240.0, 0.0])
    pixels += np.random.default_rng(seed).normal(0.0, noise_px, pixels.shape)
    iris = np.repeat(pixels[[33]], LANDMARK_COUNT - len(pixels), axis=0)  # unused by the pose
    return Face(landmarks=np.vstack([pixels, iris]), image_width=640, image_height=480)


def angles(pose: Pose) -> np.ndarray:
    return np.array([pose.yaw_degrees, pose.pitch_degrees, pose.roll_degrees])


def test_model_data_loads():
    model = canonical_face_model()
    assert model.shape == (468, 3)
    np.testing.assert_allclose(model[1], [0, -1.126865, 7.475604])  # the nose tip, towards the camera
    ids, weights = procrustes_weights()
    assert len(ids) == len(weights) == 33
    assert (ids < 468).all() and (weights > 0).all()


@pytest.mark.parametrize(
    "yaw, pitch, roll",
    [
        (0, 0, 0),
        (12, 0, 0),
        (-25, 0, 0),
        (0, 18, 0),
        (0, -15, 0),
        (0, 0, 30),
        (0, 0, -40),
        (10, -12, 7),
        (-20, 15, -25),
    ],
)
def test_synthetic_rotations_are_recovered(yaw, pitch, roll):
    recovered = angles(canonical_pose(photographed(yaw, pitch, roll, noise_px=0.5)))
    np.testing.assert_allclose(recovered, [yaw, pitch, roll], atol=1.0)


@pytest.mark.parametrize("yaw, pitch", [(0, 15), (10, 12), (-12, -10)])
@pytest.mark.parametrize("roll", [-28, -16, 16, 28])
def test_a_tilt_in_the_image_changes_roll_alone(yaw, pitch, roll):
    # issue 17: frontal-looking photos read 19° yaw. Tilting a nodding head mixed its nod
    # (and the model's own 6° frontal pitch) into yaw: 16° of tilt, 15° of nod, ~6° of yaw.
    pose = estimate_pose(photographed(yaw, pitch, roll, noise_px=0.3, looking=True))
    np.testing.assert_allclose(angles(pose), [yaw, pitch, roll], atol=1.0)


def test_a_tilted_photo_reads_the_yaw_and_pitch_of_its_upright_copy(detector, astronaut):
    upright = angles(estimate_pose(detector.detect(astronaut)))
    for degrees in (-30, -15, 15, 30):
        tilted = angles(estimate_pose(detector.detect(rotated(astronaut, degrees))))
        np.testing.assert_allclose(tilted[:2], upright[:2], atol=2.0, err_msg=f"{degrees}°")


def test_pitch_counts_from_looking_at_the_camera():
    # A face turned from the canonical pose by exactly the frontal offset looks at the camera.
    assert estimate_pose(photographed(0, FRONTAL_PITCH_DEGREES, 0)).pitch_degrees == pytest.approx(0.0, abs=1e-6)
    assert estimate_pose(photographed(0, 0, 0)).pitch_degrees == pytest.approx(-FRONTAL_PITCH_DEGREES, abs=1e-6)


def test_similarity_recovers_scale_rotation_translation():
    source = canonical_face_model()
    truth = rotation(14, -9, 21)
    target = 3.5 * source @ truth.T + np.array([10.0, -4.0, 2.0])
    scale, found, translation = weighted_similarity(source, target, np.ones(len(source)))
    assert scale == pytest.approx(3.5)
    np.testing.assert_allclose(found, truth, atol=1e-9)
    np.testing.assert_allclose(translation, [10.0, -4.0, 2.0], atol=1e-9)


def test_astronaut_is_near_frontal(detector, astronaut, limits):
    pose = estimate_pose(detector.detect(astronaut))
    np.testing.assert_allclose(angles(pose), [-1.0, 8.0 - FRONTAL_PITCH_DEGREES, -3.0], atol=3.0)
    check_pose(pose, limits)


def test_grace_hopper_is_near_frontal(detector, grace_hopper, limits):
    pose = estimate_pose(detector.detect(grace_hopper))
    assert np.abs(angles(pose)).max() < 10
    check_pose(pose, limits)


def test_mirror_flips_yaw_and_roll_keeps_pitch(detector, astronaut):
    # A 3° face read as −1/2/−3 mirrors to about +1/2/+3; pitch must not change sign.
    direct = angles(estimate_pose(detector.detect(astronaut)))
    flipped = angles(estimate_pose(detector.detect(mirrored(astronaut))))
    np.testing.assert_allclose(flipped, direct * [-1, 1, -1], atol=3.0)


def test_in_plane_rotation_reads_as_roll_within_the_limit(detector, astronaut, astronaut_rolled_30, limits):
    before = estimate_pose(detector.detect(astronaut))
    after = estimate_pose(detector.detect(astronaut_rolled_30))
    assert after.roll_degrees - before.roll_degrees == pytest.approx(30, abs=4)
    assert abs(after.yaw_degrees - before.yaw_degrees) < 6
    assert check_pose(after, limits) == 0.0  # roll is undone by the analysis, not refused


def test_roll_past_its_limit_is_1008(detector, astronaut, limits):
    pose = estimate_pose(detector.detect(rotated(astronaut, 40)))
    with pytest.raises(AnalysisError) as caught:
        check_pose(pose, limits, stable=True)  # no tolerance for roll
    assert caught.value.kind is RefusalKind.NOT_FRONTAL
    assert f"歪头（头部倾斜） {abs(pose.roll_degrees):.0f}°，允许 ±30°" in caught.value.message
    assert "左右转头" not in caught.value.message


def test_check_pose_names_each_angle_over_its_limit(limits):
    with pytest.raises(AnalysisError) as caught:
        check_pose(Pose(yaw_degrees=-23.4, pitch_degrees=25.0, roll_degrees=3.0), limits)
    message = caught.value.message
    assert caught.value.kind is RefusalKind.NOT_FRONTAL
    assert "左右转头 23°，允许 ±15°" in message
    assert "低头 25°，允许 ±20°" in message
    assert "歪头" not in message


def test_pitch_message_says_up_or_down(limits):
    # Positive pitch = forehead towards the camera (a bowed head, like tom_cruise.jpg's +18°).
    with pytest.raises(AnalysisError) as caught:
        check_pose(Pose(yaw_degrees=0.0, pitch_degrees=-31.0, roll_degrees=0.0), limits)
    assert "抬头 31°" in caught.value.message and "低头" not in caught.value.message


def test_check_pose_limits_come_from_settings():
    pose = Pose(yaw_degrees=9.0, pitch_degrees=0.0, roll_degrees=0.0)
    check_pose(pose, AnalysisSettings())
    with pytest.raises(AnalysisError):
        check_pose(pose, AnalysisSettings(max_yaw_degrees=8))


def test_check_pose_accepts_exactly_the_limit(limits):
    assert check_pose(Pose(yaw_degrees=15.0, pitch_degrees=-20.0, roll_degrees=30.0), limits) == 0.0


@pytest.mark.parametrize("yaw, pitch, past", [(19.0, 0.0, 4.0), (0.0, 21.0, 1.0), (-18.0, -24.0, 4.0)])
def test_a_stable_pose_just_past_a_limit_is_measured(limits, yaw, pitch, past):
    pose = Pose(yaw_degrees=yaw, pitch_degrees=pitch, roll_degrees=0.0)
    assert check_pose(pose, limits, stable=True) == pytest.approx(past)
    with pytest.raises(AnalysisError):
        check_pose(pose, limits)  # an unstable reading gets no benefit of the doubt


def test_far_past_a_limit_is_1008_even_when_stable(limits):
    with pytest.raises(AnalysisError) as caught:
        check_pose(
            Pose(yaw_degrees=15.0 + NEAR_LIMIT_DEGREES + 1.2, pitch_degrees=0.0, roll_degrees=0.0), limits, stable=True
        )
    assert "左右转头 21°，允许 ±15°" in caught.value.message


@pytest.mark.parametrize("yaw, pitch", [(0, 0), (18, 0), (0, 21), (-19, 8), (10, -22)])
def test_the_two_pose_readings_agree_on_a_rigid_face(yaw, pitch):
    face = photographed(yaw, pitch, 5, noise_px=0.5, looking=True)
    pose = estimate_pose(face)
    flat = orthographic_pose(face)
    assert flat.yaw_degrees == pytest.approx(yaw, abs=1.5) and flat.pitch_degrees == pytest.approx(pitch, abs=1.5)
    assert pose_is_stable(face, pose)


def test_a_mesh_whose_depth_contradicts_its_layout_is_unstable():
    # the same 2-D layout with the depth of a face turned 20° further: the readings disagree
    face = photographed(18, 0, 0)
    other = photographed(38, 0, 0)
    landmarks = face.landmarks.copy()
    landmarks[:, 2] = other.landmarks[:, 2]
    odd = Face(landmarks=landmarks, image_width=640, image_height=480)
    assert not pose_is_stable(odd, estimate_pose(odd))


# measured, not wished away: the two readings' pitch 6.6° apart (-3.9° / +2.7°), frontal
# either way: a photo near a limit like it is refused rather than measured
READ_APART = {"openface_adams.jpg"}


def test_the_labelled_photos_read_alike_both_ways(detector, photos_dir, first_set_labels):
    apart = set()
    for label in first_set_labels:
        face = detector.detect(load_photo(photos_dir, label["file"]))
        apart |= set() if pose_is_stable(face, estimate_pose(face)) else {label["file"]}
    assert apart == READ_APART


def test_labelled_photos_are_frontal_enough(detector, photos_dir, first_set_labels, limits):
    # All eight are meant to be measured, so none may be refused as 1008.
    pitches = {}
    for label in first_set_labels:
        pose = estimate_pose(detector.detect(load_photo(photos_dir, label["file"])))
        check_pose(pose, limits)
        pitches[label["file"]] = pose.pitch_degrees
    assert pitches["tom_cruise.jpg"] > 10  # visibly bowed head: the sign of pitch
    # the frontal ones now read about 0 (the canonical model's offset removed)
    frontal = [pitch for name, pitch in pitches.items() if name != "tom_cruise.jpg"]
    assert abs(float(np.median(frontal))) < 3.0, pitches  # people hold their heads ±4° apart


def _upside_down_photos(astronaut: np.ndarray, photos_dir) -> dict[str, np.ndarray]:
    """Issue 27: biden2 turned 180° in pixels, and the astronaut stored upright with EXIF
    orientation 3 (so that decoding applies a half turn that was never needed). Both read a
    roll near 0 from the landmarks (the mesh fits a face the right way up to them) and were
    measured `ok` with a forehead traced on the chin."""
    exif = Image.Exif()
    exif[EXIF_ORIENTATION] = 3
    wrongly_turned = decode_image(encode(astronaut, "JPEG", quality=95, exif=exif.tobytes()), AnalysisSettings())
    biden = load_photo(photos_dir, "biden2.jpg")
    return {
        "astronaut, EXIF 3 applied wrongly": wrongly_turned,
        "biden2 turned 180°": np.ascontiguousarray(biden[::-1, ::-1]),
    }


def test_an_upside_down_face_is_refused(detector, astronaut, photos_dir, limits):
    for name, rgb in _upside_down_photos(astronaut, photos_dir).items():
        face = detector.detect(rgb)
        assert detector.upside_down(rgb, face), name
        with pytest.raises(AnalysisError) as caught:
            frontal_face(rgb, detector, limits)
        assert caught.value.kind is RefusalKind.NOT_FRONTAL, name
        assert "人脸倒置" in caught.value.message, name


def test_an_upright_face_is_not_taken_for_an_upside_down_one(
    detector, astronaut, grace_hopper, photos_dir, first_set_labels
):
    photos = {"astronaut": astronaut, "grace_hopper": grace_hopper}
    photos |= {entry["file"]: load_photo(photos_dir, entry["file"]) for entry in first_set_labels}
    turned = [name for name, rgb in photos.items() if detector.upside_down(rgb, detector.detect(rgb))]
    assert turned == []


@pytest.mark.slow
def test_every_labelled_photo_turned_over_is_refused(detector, photos_dir, photo_labels):
    """Each photo the analysis measures, turned 180°: where the mesh still finds a face, it is
    read upside down (measured: 48 of 48; the mesh loses 11 turned faces: 1005, also a refusal)."""
    missed = []
    for label in photo_labels:
        if label["kind"] == "rejected":
            continue
        turned = np.ascontiguousarray(load_photo(photos_dir, label["file"])[::-1, ::-1])
        try:
            face = detector.detect(turned)
        except AnalysisError:
            continue
        missed += [] if detector.upside_down(turned, face) else [label["file"]]
    assert missed == []


@pytest.mark.slow
def test_a_tilted_upright_face_is_never_called_upside_down(detector, photos_dir, photo_labels):
    """Issue 38: an upright portrait with a slight tilt was refused as upside down (one view
    of the detector's confidence, near a tie). Every labelled photo the analysis measures,
    rolled 12 and 25 degrees either way (measured: none of 237 such copies the mesh finds)."""
    called = []
    for label in photo_labels:
        if label["kind"] == "rejected":
            continue
        photo = load_photo(photos_dir, label["file"])
        for degrees in (-25, -12, 12, 25):
            tilted = rotated(photo, degrees)
            try:
                face = detector.detect(tilted)
            except AnalysisError:  # a copy the mesh loses at the frame's corner: nothing to call
                continue
            called += [(label["file"], degrees)] if detector.upside_down(tilted, face) else []
    assert called == []


def test_a_roll_turned_over_lies_on_the_full_circle():
    assert turned_over(-5.7) == pytest.approx(174.3)
    assert turned_over(2.6) == pytest.approx(-177.4)
    assert turned_over(180.0) == 180.0
