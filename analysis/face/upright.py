"""Roll undone: the head turned so the face's midline is vertical, and the results turned back.

The hair analysis scans image columns (the hairline trace, the head outline), so a tilted
head is turned upright first (analysis.md § Pose: roll costs nothing to undo) and every
result is mapped back into the photo's own pixels: the hairline's points, trichion and
temples, and the masks. The upright canvas is a square around the head only
(`CANVAS_FACE_HEIGHTS` face heights, the face a quarter of a face height below its centre:
more than the segmenters' own framings), at most `CANVAS_FACE_PX` per face height: every
model works at its own, smaller face scale, so a 12 MP photo costs what a small one does.
Outside the canvas the masks are empty. Its corners beyond the photo repeat the photo's
edge pixels. Distances are unchanged by a rotation, so calibration and measurements come
from the photo's own landmarks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import cv2
import numpy as np

from ..frame import FaceFrame
from ..types import Face, Hairline, HairSegmentation, LandmarkId

# Below this roll the photo is analysed as it is: the column scans tolerate a few degrees,
# and a turn resamples the photo.
UNDO_ROLL_DEGREES = 5.0
CANVAS_FACE_HEIGHTS = 4.0
CANVAS_FACE_PX = 320.0  # twice what the models use: the hairline works at 160 px per face, the hair network at ~170


@dataclass(frozen=True)
class Upright:
    """The similarity from the photo to its upright canvas: upright = matrix · (x, y, 1).
    Without a matrix (a roll too small to matter) every method hands its input back."""

    matrix: np.ndarray | None  # (2, 3): rotation and scale, then translation
    size: tuple[int, int]  # (width, height) of the upright canvas
    shape: tuple[int, int]  # (height, width) of the photo

    @classmethod
    def of(cls, face: Face, roll_degrees: float) -> Upright:
        """The turn that makes `face` upright (none when its roll is under UNDO_ROLL_DEGREES)."""
        width, height = face.image_width, face.image_height
        if abs(roll_degrees) < UNDO_ROLL_DEGREES:
            return cls(matrix=None, size=(width, height), shape=(height, width))
        a, b = FaceFrame.from_face(face).up  # turned onto (0, -1): the forehead straight up
        top, chin = face.points[LandmarkId.MESH_TOP], face.points[LandmarkId.MENTON]
        face_height = max(1.0, float(np.linalg.norm(top - chin)))
        scale = min(1.0, CANVAS_FACE_PX / face_height)
        side = math.ceil(CANVAS_FACE_HEIGHTS * face_height * scale)
        linear = scale * np.array([[-b, a], [-a, -b]])
        centre = (top + chin) / 2
        offset = np.array([side / 2, side / 2 + 0.25 * face_height * scale]) - linear @ centre
        return cls(matrix=np.hstack([linear, offset[:, None]]), size=(side, side), shape=(height, width))

    def image(self, rgb: np.ndarray) -> np.ndarray:
        if self.matrix is None:
            return rgb
        return cv2.warpAffine(rgb, self.matrix, self.size, flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE)

    def face(self, face: Face) -> Face:
        """The landmarks on the upright canvas (depth is unchanged by a turn in the image plane)."""
        if self.matrix is None:
            return face
        landmarks = face.landmarks.copy()
        landmarks[:, :2] = self._apply(self.matrix, face.landmarks[:, :2])
        landmarks[:, 2] *= float(np.sqrt(abs(np.linalg.det(self.matrix[:, :2]))))  # z scales like x
        return Face(landmarks=landmarks, image_width=self.size[0], image_height=self.size[1])

    def points_back(self, points: np.ndarray) -> np.ndarray:
        """(N, 2) upright px -> photo px."""
        if self.matrix is None:
            return np.asarray(points, dtype=np.float64).reshape(-1, 2)
        return self._apply(cv2.invertAffineTransform(self.matrix), points)

    def hairline_back(self, hairline: Hairline) -> Hairline:
        if self.matrix is None:
            return hairline

        def point(value: tuple[float, float] | None) -> tuple[float, float] | None:
            if value is None:
                return None
            x, y = self.points_back(np.asarray(value, dtype=np.float64))[0]
            return (float(x), float(y))

        points = None if hairline.points is None else self.points_back(hairline.points)
        return replace(
            hairline,
            points=points,
            trichion=point(hairline.trichion),
            left_temple=point(hairline.left_temple),
            right_temple=point(hairline.right_temple),
        )

    def mask_back(self, mask: np.ndarray) -> np.ndarray:
        """A boolean mask of the upright canvas as one of the photo (False beyond the canvas).
        Turned back at the canvas's own scale over the mask's extent only, then enlarged:
        a 12 MP photo's masks cost a few milliseconds, not a full-size warp each."""
        if self.matrix is None:
            return mask
        height, width = self.shape
        full = np.zeros((height, width), dtype=bool)
        rows, columns = np.nonzero(mask.any(axis=1))[0], np.nonzero(mask.any(axis=0))[0]
        if len(rows) == 0:
            return full
        extent = np.array(
            [
                [columns[0], rows[0]],
                [columns[-1] + 1, rows[0]],
                [columns[0], rows[-1] + 1],
                [columns[-1] + 1, rows[-1] + 1],
            ],
            dtype=np.float64,
        )
        corners = self.points_back(extent)
        x0, y0 = np.clip(np.floor(corners.min(axis=0)).astype(int) - 1, 0, [width, height])
        x1, y1 = np.clip(np.ceil(corners.max(axis=0)).astype(int) + 1, 0, [width, height])
        if x1 <= x0 or y1 <= y0:
            return full
        scale = float(np.sqrt(abs(np.linalg.det(self.matrix[:, :2]))))  # canvas px per photo px
        small = (max(1, round((x1 - x0) * scale)), max(1, round((y1 - y0) * scale)))
        # small grid px -> photo px (x0 + x / scale, ...) -> canvas px
        to_photo = np.array([[1 / scale, 0, x0], [0, 1 / scale, y0], [0, 0, 1]])
        to_canvas = np.vstack([self.matrix, [0, 0, 1]]) @ to_photo
        coverage = cv2.warpAffine(
            mask.astype(np.uint8) * np.uint8(255),
            to_canvas[:2],
            small,
            flags=cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP,
            borderValue=(0,),
        )
        if small != (x1 - x0, y1 - y0):
            coverage = cv2.resize(coverage, (int(x1 - x0), int(y1 - y0)), interpolation=cv2.INTER_LINEAR)
        full[y0:y1, x0:x1] = coverage >= 128
        return full

    def segmentation_back(self, segmentation: HairSegmentation) -> HairSegmentation:
        if self.matrix is None:
            return segmentation
        hat = None if segmentation.hat is None else self.mask_back(segmentation.hat)
        return replace(
            segmentation,
            hair=self.mask_back(segmentation.hair),
            person=self.mask_back(segmentation.person),
            hat=hat,
            work=None,
        )

    @staticmethod
    def _apply(matrix: np.ndarray, points: np.ndarray) -> np.ndarray:
        xy = np.asarray(points, dtype=np.float64).reshape(-1, 2)
        return xy @ matrix[:, :2].T + matrix[:, 2]
