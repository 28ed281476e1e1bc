"""Face landmarks: the MediaPipe face mesh (0.10.21, with iris) behind a small wrapper.

Counting (1005/1006) uses the mesh and the full-range face detector together (`count`).
The one face's landmarks come from the mesh; a face only the full-range detector saw
(under about a fifth of the picture) is cropped out and meshed on its own.

One `FaceMeshDetector` per process: MediaPipe graphs are not thread-safe, and building
them costs ~100 ms, so the model process builds it once and reuses it.
"""

from __future__ import annotations

import numpy as np

from shared.contract import RefusalKind

from ..errors import AnalysisError
from ..native_logs import quiet_native_logs
from ..types import Face
from .count import SAME_FACE_OVERLAP, Box, CountedFace, detector_boxes, merge, mesh_box, people

LANDMARK_COUNT = 478
# Side of the square cut around a face found by the full-range detector, in face-box sizes:
# enough context for the mesh's own detector to find it again at a comfortable size.
_CROP_FACE_BOXES = 2.5
_MIN_CROP_PX = 32
_DETECTION_SIDE_PX = 1280
_MESH_SIDE_PX = 2048
# The orientation check: the short-range detector (trained on faces that fill its 128 px
# input) on a crop this many face boxes wide, the way it was trained to see a face.
_UPRIGHT_CROP_FACE_BOXES = 1.6
_UPRIGHT_CHECK_SIDE_PX = 512  # the detector works at 128 px: a larger crop only costs time
# How much more face-like (detector confidence) the turned crop must read, in both views, for
# the face to be called upside down: a refusal needs a clear preference, not a tie's noise.
UPSIDE_DOWN_MARGIN = 0.05

_MSG_NO_FACE = "未检测到人脸：请上传一张清晰的正脸照片，脸部完整、无遮挡且光线充足"
_MSG_MULTIPLE_FACES = "检测到多张人脸：请上传只有一个人、正对镜头的单人照片"


class FaceMeshDetector:
    """Finds exactly one face; 0 faces -> 1005, 2+ faces -> 1006."""

    def __init__(self) -> None:
        quiet_native_logs()  # before mediapipe loads its native libraries
        import mediapipe as mp  # heavy: imported only where a detector is built

        self._mesh = mp.solutions.face_mesh.FaceMesh(
            static_image_mode=True, refine_landmarks=True, max_num_faces=2, min_detection_confidence=0.5
        )
        self._full_range = mp.solutions.face_detection.FaceDetection(model_selection=1, min_detection_confidence=0.5)
        # a confidence floor near 0, so that the orientation check compares two scores, not a
        # score with the 0 of "below the floor"
        self._short_range = mp.solutions.face_detection.FaceDetection(model_selection=0, min_detection_confidence=0.01)

    def detect(self, rgb: np.ndarray) -> Face:
        """The one face in an RGB uint8 (H, W, 3) image, landmarks in pixels."""
        if rgb.dtype != np.uint8 or rgb.ndim != 3 or rgb.shape[2] != 3:
            raise ValueError(f"expected an RGB uint8 (H, W, 3) array, got {rgb.dtype} {rgb.shape}")
        rgb = np.ascontiguousarray(rgb)
        height, width = rgb.shape[:2]
        # The mesh works on a 192 px crop of the face (iris: 64 px of each eye), so a face
        # the mesh can find at all (over ~1/5 of the picture) loses nothing in a copy
        # `_MESH_SIDE_PX` long, and a 12 MP photo is not copied whole into MediaPipe.
        scale = _shrink_scale(rgb, _MESH_SIDE_PX)
        view = _resized(rgb, scale)
        meshes = [landmarks / scale for landmarks in self._meshes(view)]
        boxes = [mesh_box(landmarks[:, :2], index) for index, landmarks in enumerate(meshes)]
        boxes += [
            box.scaled(1 / scale)
            for box in self._detector_boxes(view, scale * max((box.width for box in boxes), default=0.0))
        ]
        found, meshed_alone = self._people(rgb, merge(boxes))
        if not found:
            raise AnalysisError(RefusalKind.NO_FACE, _MSG_NO_FACE)
        if len(found) > 1:
            raise AnalysisError(RefusalKind.MULTIPLE_FACES, _MSG_MULTIPLE_FACES)
        one = found[0]
        landmarks = meshes[one.mesh] if one.mesh is not None else meshed_alone[one]
        return Face(landmarks=landmarks, image_width=width, image_height=height)

    def upside_down(self, rgb: np.ndarray, face: Face) -> bool:
        """Whether `face` is upside down in `rgb`. The mesh and the detectors both fit an
        upright face to an upside-down one (the forehead traced on the chin, roll read near
        0), so their landmarks cannot tell; a detector's confidence can: on a crop around the
        face, the face the right way up scores higher than the same crop turned 180°. The
        short-range detector on a tight crop reads this cleanly where the full-range one on a
        loose crop did not (an upright face with glasses and a slight roll read upside down
        by both its views); the crop and its mirror image are two views, and both must prefer
        the turned crop by UPSIDE_DOWN_MARGIN (docs/analysis_science.md § Upside down)."""
        left, top, right, bottom = _crop_around(mesh_box(face.points, 0), rgb.shape, _UPRIGHT_CROP_FACE_BOXES)
        crop = np.ascontiguousarray(rgb[top:bottom, left:right])
        crop = _resized(crop, _shrink_scale(crop, _UPRIGHT_CHECK_SIDE_PX))
        views = (crop, np.ascontiguousarray(crop[:, ::-1]))
        return all(self._turned_preference(view) > UPSIDE_DOWN_MARGIN for view in views)

    def _turned_preference(self, crop: np.ndarray) -> float:
        """The short-range detector's confidence on `crop` turned 180° minus on `crop` itself."""
        return self._short_range_score(np.ascontiguousarray(crop[::-1, ::-1])) - self._short_range_score(crop)

    def _short_range_score(self, rgb: np.ndarray) -> float:
        return max(
            (float(detection.score[0]) for detection in self._short_range.process(rgb).detections or []), default=0.0
        )

    def close(self) -> None:
        """Release the MediaPipe graphs; the detector cannot be used afterwards."""
        self._mesh.close()
        self._full_range.close()
        self._short_range.close()

    def _meshes(self, rgb: np.ndarray) -> list[np.ndarray]:
        """(478, 3) pixel landmarks of each face the mesh finds (at most 2)."""
        height, width = rgb.shape[:2]
        scale = np.array([width, height, width], dtype=np.float64)
        return [
            np.array([(p.x, p.y, p.z) for p in face.landmark], dtype=np.float64) * scale
            for face in self._mesh.process(rgb).multi_face_landmarks or []
        ]

    def _detector_boxes(self, rgb: np.ndarray, largest_width: float) -> list[Box]:
        """Full-range boxes in `rgb`'s pixels, found on a copy at most `_DETECTION_SIDE_PX`
        long: the detector works on 192 px anyway, and tiles of a large photo would cost."""
        scale = _shrink_scale(rgb, _DETECTION_SIDE_PX)
        boxes = detector_boxes(_resized(rgb, scale), self._full_range_boxes, largest_width * scale)
        return [box.scaled(1 / scale) for box in boxes]

    def _full_range_boxes(self, rgb: np.ndarray) -> list[Box]:
        height, width = rgb.shape[:2]
        boxes = []
        for detection in self._full_range.process(rgb).detections or []:
            box = detection.location_data.relative_bounding_box
            boxes.append(Box(box.xmin * width, box.ymin * height, box.width * width, box.height * height))
        return boxes

    def _people(
        self, rgb: np.ndarray, faces: list[CountedFace]
    ) -> tuple[list[CountedFace], dict[CountedFace, np.ndarray]]:
        """`people(faces)` after rule 4 of `count`: a face only one model saw is
        confirmed by the other on a crop around it, or dropped. Dropping one can let a
        smaller face pass the size rule, so this repeats until every counted face is
        confirmed. Returns the people and the landmarks of those only the detector saw."""
        meshed_alone: dict[CountedFace, np.ndarray] = {}
        meshed = [face for face in faces if face.mesh is not None]  # widest first (`merge`)
        # both models agree, or else the mesh is trusted for one face: its widest
        confirmed = {face for face in meshed if face.detected} or set(meshed[:1])
        candidates = list(faces)
        while True:
            found = people(candidates)
            unchecked = [face for face in found if face not in confirmed]
            if not unchecked:
                break
            for face in unchecked:
                if face.mesh is not None:
                    is_face = self._detected_in_box(rgb, face.box)
                else:
                    landmarks = self._mesh_in_box(rgb, face.box)
                    is_face = landmarks is not None
                    if landmarks is not None:
                        meshed_alone[face] = landmarks
                if is_face:
                    confirmed.add(face)
                else:
                    candidates.remove(face)
        return found, meshed_alone

    def _detected_in_box(self, rgb: np.ndarray, box: Box) -> bool:
        left, top, right, bottom = _crop_around(box, rgb.shape)
        boxes = self._full_range_boxes(np.ascontiguousarray(rgb[top:bottom, left:right]))
        return any(found.shifted(left, top).overlap(box) >= SAME_FACE_OVERLAP for found in boxes)

    def _mesh_in_box(self, rgb: np.ndarray, box: Box) -> np.ndarray | None:
        """Landmarks of a face the mesh missed in the whole picture, meshed in a crop around
        it; None when the crop shows no face the mesh can find."""
        left, top, right, bottom = _crop_around(box, rgb.shape)
        if right - left < _MIN_CROP_PX or bottom - top < _MIN_CROP_PX:  # a box at or over the edge
            return None
        # z is scaled like x in both frames, so only x and y move with the crop
        meshes = [
            landmarks + np.array([left, top, 0.0])
            for landmarks in self._meshes(np.ascontiguousarray(rgb[top:bottom, left:right]))
        ]
        # the crop can hold another face (the real one beside a badge taken for a face)
        inside = [landmarks for landmarks in meshes if mesh_box(landmarks[:, :2], 0).overlap(box) >= SAME_FACE_OVERLAP]
        return inside[0] if inside else None


def _shrink_scale(rgb: np.ndarray, longest_px: int) -> float:
    """1/n for the smallest whole n that brings the long side to `longest_px` or under:
    OpenCV's area interpolation is ~10x faster for whole factors (37 ms -> 4 ms at 12 MP)."""
    return 1.0 / int(np.ceil(max(rgb.shape[:2]) / longest_px))


def _resized(rgb: np.ndarray, scale: float) -> np.ndarray:
    if scale == 1.0:
        return rgb
    import cv2  # the GPU host's web process imports this module and must not load OpenCV

    height, width = rgb.shape[:2]
    size = (int(width * scale), int(height * scale))
    factor = round(1 / scale)
    # whole blocks only: the area fast path needs the source to be size × factor exactly
    return cv2.resize(rgb[: size[1] * factor, : size[0] * factor], size, interpolation=cv2.INTER_AREA)


def _crop_around(box: Box, shape: tuple[int, ...], face_boxes: float = _CROP_FACE_BOXES) -> tuple[int, int, int, int]:
    """left, top, right, bottom of a square `face_boxes` face boxes wide around a face box,
    clipped to the image."""
    height, width = shape[:2]
    centre_x, centre_y = box.left + box.width / 2, box.top + box.height / 2
    half = face_boxes * max(box.width, box.height) / 2
    left, top = max(0, int(centre_x - half)), max(0, int(centre_y - half))
    right, bottom = min(width, int(np.ceil(centre_x + half))), min(height, int(np.ceil(centre_y + half)))
    return left, top, right, bottom
