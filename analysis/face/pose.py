"""Head pose from the landmarks, and the frontal-enough rule (1008).

The landmarks are fitted to MediaPipe's canonical face model by weighted Procrustes
(Umeyama's similarity transform, with scale), using the 33 landmark weights MediaPipe's own
geometry pipeline uses; the rotation gives yaw, pitch and roll. Numpy only: ~1 ms per face.

Pitch is measured from "looking at the camera", not from the canonical model's own zero:
frontal photos read the model's pitch +3…+8° (docs/analysis_science.md § Pose), so that
offset is removed (as a turn of the model, before the head's own) and the 1008 limit means
what it says. Roll is the outermost angle (`rotation_to_pose`), so a tilted photo reads
the same yaw and pitch as its upright copy, which the analysis measures (`upright`).

Near a yaw or pitch limit the reading is checked against a second, independent one: the
same model fitted to the landmarks' x and y only (scaled orthographic projection; the
mesh's depth, a network's guess, left out). When both agree (`STABLE_DEGREES`), a photo up
to `NEAR_LIMIT_DEGREES` past a limit is measured with a wider band instead of refused
(analysis.md § Pose); roll is never refused up to its limit: the analysis undoes it
(`upright`).
"""

from __future__ import annotations

import math
from functools import cache
from pathlib import Path

import numpy as np

from shared.contract import RefusalKind
from shared.settings import AnalysisSettings

from ..errors import AnalysisError
from ..types import Face, Pose

_DATA = Path(__file__).parent.parent / "data"  # analysis/data
CANONICAL_VERTEX_COUNT = 468
# The canonical model's pitch of a face looking at the camera: the median over nine
# frontal real photos (a visibly bowed head left out) was +5.7° as taken and +5.9°
# mirrored, range −0.9…+7.8°; a
# fit of x and y only (the mesh's depth ignored) also reads positive (median +7.1°), so it
# is the model's frame, not the mesh's depth estimate. Rounded: the photos' spread is ±4°.
FRONTAL_PITCH_DEGREES = 6.0
# A photo this far past a yaw/pitch limit is measured when the two pose readings agree
# within STABLE_DEGREES (on the 29 labelled photos they agree within 2.6° yaw, 5.8° pitch)
NEAR_LIMIT_DEGREES = 5.0
STABLE_DEGREES = 6.0
_ORTHOGRAPHIC_ITERATIONS = 30
UPSIDE_DOWN_DEGREES = 135.0  # a roll past this is a photo the wrong way up, not a tilted head


@cache
def canonical_face_model() -> np.ndarray:
    """(468, 3) vertices in cm, y up, z towards the camera, in landmark order."""
    vertices = [
        [float(value) for value in line.split()[1:4]]
        for line in (_DATA / "canonical_face_model_vertices.obj").read_text().splitlines()
        if line.startswith("v ")
    ]
    model = np.array(vertices, dtype=np.float64)
    if model.shape != (CANONICAL_VERTEX_COUNT, 3):
        raise ValueError(f"canonical face model has shape {model.shape}, expected (468, 3)")
    model.setflags(write=False)
    return model


@cache
def procrustes_weights() -> tuple[np.ndarray, np.ndarray]:
    """The landmark ids and weights of MediaPipe's procrustes_landmark_basis."""
    text = (_DATA / "procrustes_landmark_weights.txt").read_text()
    rows = [line.split() for line in text.splitlines() if line.strip()]
    ids = np.array([int(row[0]) for row in rows], dtype=np.intp)
    weights = np.array([float(row[1]) for row in rows], dtype=np.float64)
    ids.setflags(write=False)
    weights.setflags(write=False)
    return ids, weights


def weighted_similarity(
    source: np.ndarray, target: np.ndarray, weights: np.ndarray
) -> tuple[float, np.ndarray, np.ndarray]:
    """Umeyama: scale s, rotation R, translation t minimising sum w·|s·R·source + t − target|²."""
    w = weights / weights.sum()
    source_mean = w @ source
    target_mean = w @ target
    source_centred = source - source_mean
    target_centred = target - target_mean
    covariance = (target_centred * w[:, None]).T @ source_centred
    u, singular, vt = np.linalg.svd(covariance)
    reflection = np.eye(3)
    reflection[2, 2] = np.sign(np.linalg.det(u) * np.linalg.det(vt)) or 1.0
    rotation = u @ reflection @ vt
    variance = float(w @ (source_centred**2).sum(axis=1))
    scale = float((singular * np.diag(reflection)).sum() / variance)
    translation = target_mean - scale * rotation @ source_mean
    return scale, rotation, translation


def rotation_to_pose(rotation: np.ndarray) -> Pose:
    """Angles of R = Rz(roll) · Rx(pitch) · Ry(yaw), in degrees: the head turned (yaw) and
    nodded (pitch) in its own upright frame, then tilted in the image plane (roll, about the
    camera's axis). Tilting the photo then changes roll alone. (The order Rx · Ry · Rz, with
    roll innermost, reads a tilted head's nod partly as yaw: a frontal photo turned 30° in
    the image read yaw −1° → +3.9°, a frontal head tilted 16° with a 15° nod ~6° of false yaw.)"""
    pitch = math.asin(float(np.clip(rotation[2, 1], -1.0, 1.0)))
    yaw = math.atan2(-rotation[2, 0], rotation[2, 2])
    roll = math.atan2(-rotation[0, 1], rotation[1, 1])
    return Pose(yaw_degrees=math.degrees(yaw), pitch_degrees=math.degrees(pitch), roll_degrees=math.degrees(roll))


def _about_x(degrees: float) -> np.ndarray:
    angle = math.radians(degrees)
    return np.array(
        [[1.0, 0.0, 0.0], [0.0, math.cos(angle), -math.sin(angle)], [0.0, math.sin(angle), math.cos(angle)]]
    )


def _looking_at_the_camera(rotation: np.ndarray) -> Pose:
    """The pose counted from a face looking at the camera: the model's own frontal pitch is a
    turn of the model (applied first, in its frame), not of the head."""
    return rotation_to_pose(rotation @ _about_x(FRONTAL_PITCH_DEGREES).T)


def estimate_pose(face: Face) -> Pose:
    """Yaw, pitch and roll of the face relative to the camera (0, 0, 0 = frontal)."""
    return _looking_at_the_camera(canonical_rotation(face))


def canonical_rotation(face: Face) -> np.ndarray:
    """The rotation from the canonical face model's frame to the camera's."""
    ids, weights = procrustes_weights()
    # Pixels have y down and MediaPipe's z grows away from the camera; the model has y up
    # and z towards the camera.
    landmarks = face.landmarks[ids] * np.array([1.0, -1.0, -1.0])
    _, rotation, _ = weighted_similarity(canonical_face_model()[ids], landmarks, weights)
    return rotation


def canonical_pose(face: Face) -> Pose:
    """The rotation from the canonical face model's frame, as angles (pitch not corrected)."""
    return rotation_to_pose(canonical_rotation(face))


def orthographic_pose(face: Face) -> Pose:
    """The pose from the landmarks' x and y only (pitch corrected as in `estimate_pose`):
    the weighted fit of the model under scaled orthographic projection, by alternating
    between the depths the current rotation gives the landmarks and a 3-D Procrustes fit to
    them (each step lowers the 2-D residual), started from the mesh's own depths."""
    ids, weights = procrustes_weights()
    model = canonical_face_model()[ids]
    target = face.landmarks[ids] * np.array([1.0, -1.0, -1.0])
    for _ in range(_ORTHOGRAPHIC_ITERATIONS):
        scale, rotation, translation = weighted_similarity(model, target, weights)
        target = target.copy()
        target[:, 2] = (scale * model @ rotation.T + translation)[:, 2]
    return _looking_at_the_camera(rotation)


def pose_is_stable(face: Face, pose: Pose) -> bool:
    """Whether the mesh-depth reading `pose` and the 2-D-only reading agree on yaw and pitch."""
    flat = orthographic_pose(face)
    return (
        abs(flat.yaw_degrees - pose.yaw_degrees) <= STABLE_DEGREES
        and abs(flat.pitch_degrees - pose.pitch_degrees) <= STABLE_DEGREES
    )


def turned_over(roll_degrees: float) -> float:
    """The roll of a face found upside down (`FaceMeshDetector.upside_down`) whose landmarks
    were fitted the right way up, in (-180, 180]."""
    return (roll_degrees + 360.0) % 360.0 - 180.0 or 180.0


def check_pose(pose: Pose, limits: AnalysisSettings, stable: bool = False) -> float:
    """1008 naming each angle beyond its limit, by how much, and what to do. With `stable`
    (`pose_is_stable`), yaw and pitch up to NEAR_LIMIT_DEGREES past their limits pass; the
    result is how far past the limits the photo is measured (degrees, 0 within them)."""
    tolerance = NEAR_LIMIT_DEGREES if stable else 0.0
    angles = (
        ("左右转头", pose.yaw_degrees, limits.max_yaw_degrees, tolerance),
        # positive pitch brings the forehead towards the camera: the head is bowed
        ("低头" if pose.pitch_degrees > 0 else "抬头", pose.pitch_degrees, limits.max_pitch_degrees, tolerance),
        (
            "人脸倒置（照片上下颠倒）" if abs(pose.roll_degrees) > UPSIDE_DOWN_DEGREES else "歪头（头部倾斜）",
            pose.roll_degrees,
            limits.max_roll_degrees,
            0.0,
        ),
    )
    excesses = [
        f"{what} {abs(angle):.0f}°，允许 ±{limit:g}°"
        for what, angle, limit, allowed in angles
        if abs(angle) > limit + allowed
    ]
    if excesses:
        advice = "请正对镜头、保持头部端正后重拍"
        raise AnalysisError(RefusalKind.NOT_FRONTAL, f"人脸偏转过大：{'；'.join(excesses)}。{advice}")
    return max(0.0, *(abs(angle) - limit for _, angle, limit, _ in angles[:2]))
