"""Face landmarks: the MediaPipe face mesh (0.10.21, with iris) behind a small wrapper.

One `FaceMeshDetector` per process: MediaPipe graphs are not thread-safe, and building
one costs ~100 ms, so the model process builds it once and reuses it.
"""

from __future__ import annotations

import numpy as np

from shared.contract import Code, ContractError

from .types import Face

LANDMARK_COUNT = 478


class FaceMeshDetector:
    """Finds exactly one face; 0 faces -> 1005, 2+ faces -> 1006."""

    def __init__(self) -> None:
        import mediapipe as mp  # heavy: imported only where a detector is built

        self._mesh = mp.solutions.face_mesh.FaceMesh(
            static_image_mode=True, refine_landmarks=True, max_num_faces=2, min_detection_confidence=0.5
        )

    def detect(self, rgb: np.ndarray) -> Face:
        height, width = rgb.shape[:2]
        result = self._mesh.process(np.ascontiguousarray(rgb))
        faces = result.multi_face_landmarks or []
        if not faces:
            raise ContractError(Code.NO_FACE, "未检测到人脸：请上传一张清晰的正脸照片，脸部完整且光线充足")
        if len(faces) > 1:
            raise ContractError(Code.MULTIPLE_FACES, f"检测到 {len(faces)} 张人脸：请上传只有一个人的照片")
        raw = np.array([(p.x, p.y, p.z) for p in faces[0].landmark], dtype=np.float64)
        landmarks = raw * np.array([width, height, width], dtype=np.float64)
        return Face(landmarks=landmarks, image_width=width, image_height=height)

    def close(self) -> None:
        self._mesh.close()
