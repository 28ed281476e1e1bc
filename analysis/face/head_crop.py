"""The working frame of the hair analysis: the head cropped and resized to a fixed face scale.

Working at a fixed face-oval height (`WORK_FACE_HEIGHT_PX`) makes a 12 MP photo cost what a
512 px one does, and lets every threshold be stated in working pixels once.
"""

from __future__ import annotations

from dataclasses import dataclass

import cv2
import numpy as np

from ..types import CropKey, Face, HairSegmentation, LandmarkId
from .head_samples import face_height_px

WORK_FACE_HEIGHT_PX = 160.0
# crop around the head, in face-oval heights from the mesh top / menton / face centre
CROP_ABOVE, CROP_BELOW, CROP_HALF_WIDTH = 0.9, 0.2, 1.0


@dataclass(frozen=True)
class HeadCrop:
    """Where the working image came from: original = work / scale + origin."""

    x0: int
    y0: int
    x1: int
    y1: int
    scale: float

    @classmethod
    def around(cls, face: Face) -> HeadCrop:
        height = face_height_px(face)
        top = face.points[LandmarkId.MESH_TOP]
        chin = face.points[LandmarkId.MENTON]
        centre_x = 0.5 * (top[0] + chin[0])
        x0 = int(max(0, np.floor(centre_x - CROP_HALF_WIDTH * height)))
        x1 = int(min(face.image_width, np.ceil(centre_x + CROP_HALF_WIDTH * height)))
        y0 = int(max(0, np.floor(top[1] - CROP_ABOVE * height)))
        y1 = int(min(face.image_height, np.ceil(chin[1] + CROP_BELOW * height)))
        return cls(x0, y0, x1, y1, WORK_FACE_HEIGHT_PX / height)

    @property
    def work_size(self) -> tuple[int, int]:
        """(width, height) of the working image."""
        return max(1, round((self.x1 - self.x0) * self.scale)), max(1, round((self.y1 - self.y0) * self.scale))

    @property
    def key(self) -> CropKey:
        return (self.x0, self.y0, self.x1, self.y1, self.scale)

    def cut_reusing(self, segmentation: HairSegmentation, rgb: np.ndarray) -> np.ndarray:
        """`cut(rgb)`, reusing the segmenter's own cut of the same crop."""
        if segmentation.work is not None and segmentation.work[0] == self.key:
            return segmentation.work[1]
        return self.cut(rgb)

    def cut(self, rgb: np.ndarray) -> np.ndarray:
        region = rgb[self.y0 : self.y1, self.x0 : self.x1]
        interpolation = cv2.INTER_AREA if self.scale < 1 else cv2.INTER_LINEAR
        return cv2.resize(region, self.work_size, interpolation=interpolation)

    def face_in_work(self, face: Face) -> Face:
        shifted = (face.landmarks - np.array([self.x0, self.y0, 0.0])) * self.scale
        width, height = self.work_size
        return Face(landmarks=shifted, image_width=width, image_height=height)

    def paste(self, work_mask: np.ndarray, image_shape: tuple[int, ...]) -> np.ndarray:
        """A working-scale boolean mask as a full-size one (False outside the crop)."""
        size = (self.x1 - self.x0, self.y1 - self.y0)
        resized = cv2.resize(work_mask.astype(np.float32), size, interpolation=cv2.INTER_LINEAR)
        full = np.zeros(image_shape, bool)
        full[self.y0 : self.y1, self.x0 : self.x1] = resized >= 0.5
        return full

    def mask_in_work(self, mask: np.ndarray) -> np.ndarray:
        """A full-size boolean mask as working-scale coverage in [0, 1] (area-averaged, so
        the 0.5 crossing keeps sub-pixel edge positions)."""
        region = mask[self.y0 : self.y1, self.x0 : self.x1].astype(np.float32)
        interpolation = cv2.INTER_AREA if self.scale < 1 else cv2.INTER_LINEAR
        return cv2.resize(region, self.work_size, interpolation=interpolation)

    @property
    def to_image_matrix(self) -> np.ndarray:
        """(2, 3) affine map of working px to original image px (`to_image`)."""
        return np.array([[1 / self.scale, 0.0, self.x0], [0.0, 1 / self.scale, self.y0]])

    @property
    def at_photo_top(self) -> bool:
        """The working frame's first row is the photo's top edge (nothing above it)."""
        return self.y0 == 0

    def to_image(self, points: np.ndarray) -> np.ndarray:
        """(N, 2) working px -> original image px."""
        return np.asarray(points, dtype=np.float64) / self.scale + np.array([self.x0, self.y0])
