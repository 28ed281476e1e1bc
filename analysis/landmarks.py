"""Face landmarks: the MediaPipe face mesh (0.10.21, with iris) behind a small wrapper.

The face mesh finds faces with MediaPipe's short-range detector, which misses faces that
fill less than about a fifth of the picture (a half-body shot, two people side by side).
When the mesh sees nothing, the full-range face detector looks again: no face there is
1005, two or more are 1006, and one is cropped out and meshed on its own.

One `FaceMeshDetector` per process: MediaPipe graphs are not thread-safe, and building
them costs ~100 ms, so the model process builds it once and reuses it.
"""

from __future__ import annotations

import numpy as np

from shared.contract import Code, ContractError

from .types import Face

LANDMARK_COUNT = 478
# Side of the square cut around a face found by the full-range detector, in face-box sizes:
# enough context for the mesh's own detector to find it again at a comfortable size.
_CROP_FACE_BOXES = 2.5
_MIN_CROP_PX = 32

_MSG_NO_FACE = "未检测到人脸：请上传一张清晰的正脸照片，脸部完整、无遮挡且光线充足"
_MSG_MULTIPLE_FACES = "检测到多张人脸：请上传只有一个人、正对镜头的单人照片"


class FaceMeshDetector:
    """Finds exactly one face; 0 faces -> 1005, 2+ faces -> 1006."""

    def __init__(self) -> None:
        import mediapipe as mp  # heavy: imported only where a detector is built

        self._mesh = mp.solutions.face_mesh.FaceMesh(
            static_image_mode=True, refine_landmarks=True, max_num_faces=2, min_detection_confidence=0.5
        )
        self._full_range = mp.solutions.face_detection.FaceDetection(model_selection=1, min_detection_confidence=0.5)

    def detect(self, rgb: np.ndarray) -> Face:
        """The one face in an RGB uint8 (H, W, 3) image, landmarks in pixels."""
        if rgb.dtype != np.uint8 or rgb.ndim != 3 or rgb.shape[2] != 3:
            raise ValueError(f"expected an RGB uint8 (H, W, 3) array, got {rgb.dtype} {rgb.shape}")
        rgb = np.ascontiguousarray(rgb)
        height, width = rgb.shape[:2]
        landmarks = self._mesh_landmarks(rgb)
        if landmarks is None:
            landmarks = self._mesh_small_face(rgb)
        return Face(landmarks=landmarks, image_width=width, image_height=height)

    def close(self) -> None:
        """Release the MediaPipe graphs; the detector cannot be used afterwards."""
        self._mesh.close()
        self._full_range.close()

    def _mesh_landmarks(self, rgb: np.ndarray) -> np.ndarray | None:
        """(478, 3) pixel landmarks of the one face the mesh finds, None when it finds none."""
        faces = self._mesh.process(rgb).multi_face_landmarks or []
        if len(faces) > 1:  # max_num_faces=2: the mesh stops looking after the second face
            raise ContractError(Code.MULTIPLE_FACES, _MSG_MULTIPLE_FACES)
        if not faces:
            return None
        height, width = rgb.shape[:2]
        normalised = np.array([(p.x, p.y, p.z) for p in faces[0].landmark], dtype=np.float64)
        return normalised * np.array([width, height, width], dtype=np.float64)

    def _mesh_small_face(self, rgb: np.ndarray) -> np.ndarray:
        detections = self._full_range.process(rgb).detections or []
        if not detections:
            raise ContractError(Code.NO_FACE, _MSG_NO_FACE)
        if len(detections) > 1:
            raise ContractError(Code.MULTIPLE_FACES, _MSG_MULTIPLE_FACES)
        left, top, right, bottom = _crop_around(detections[0].location_data.relative_bounding_box, rgb.shape)
        if right - left < _MIN_CROP_PX or bottom - top < _MIN_CROP_PX:  # a box at or over the edge
            raise ContractError(Code.NO_FACE, _MSG_NO_FACE)
        landmarks = self._mesh_landmarks(np.ascontiguousarray(rgb[top:bottom, left:right]))
        if landmarks is None:
            raise ContractError(Code.NO_FACE, _MSG_NO_FACE)
        # z is scaled like x in both frames, so only x and y move with the crop
        return landmarks + np.array([left, top, 0.0])


def _crop_around(box: object, shape: tuple[int, ...]) -> tuple[int, int, int, int]:
    """left, top, right, bottom of a square around a relative bounding box, clipped to the image."""
    height, width = shape[:2]
    box_width, box_height = box.width * width, box.height * height  # type: ignore[attr-defined]
    centre_x = box.xmin * width + box_width / 2  # type: ignore[attr-defined]
    centre_y = box.ymin * height + box_height / 2  # type: ignore[attr-defined]
    half = _CROP_FACE_BOXES * max(box_width, box_height) / 2
    left, top = max(0, int(centre_x - half)), max(0, int(centre_y - half))
    right, bottom = min(width, int(np.ceil(centre_x + half))), min(height, int(np.ceil(centre_y + half)))
    return left, top, right, bottom
