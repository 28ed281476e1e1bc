"""The square the hair network sees: face-centred, upright, ~3 face heights wide, 512 px.

analysis.md § Hair segmentation: a face-centred square ~3x the face height, shifted up
~0.25 face heights, works best. The square follows the facial midline (mesh top -> menton),
so a rolled head reaches the network upright. One affine map (`to_square`) takes image px
to square px; masks come back through its inverse into any other frame (`warp_into`).
"""

from __future__ import annotations

from dataclasses import dataclass

import cv2
import numpy as np

from ..types import Face, LandmarkId

SQUARE_FACE_HEIGHTS = 3.0
SHIFT_UP_FACE_HEIGHTS = 0.25


@dataclass(frozen=True)
class NetworkCrop:
    """`to_square` (2x3): image px -> square px; `size`: the square's side."""

    to_square: np.ndarray
    size: int

    @classmethod
    def around(cls, face: Face, size: int) -> NetworkCrop:
        top, chin = face.points[LandmarkId.MESH_TOP], face.points[LandmarkId.MENTON]
        height = float(np.linalg.norm(top - chin))
        up = (top - chin) / max(height, 1e-6)
        centre = 0.5 * (top + chin) + SHIFT_UP_FACE_HEIGHTS * height * up
        scale = size / (SQUARE_FACE_HEIGHTS * max(height, 1e-6))
        # rows of the rotation: image-right across the face, then down the face
        across, down = np.array([-up[1], up[0]]), -up
        rotation = scale * np.stack([across, down])
        offset = np.array([size / 2, size / 2]) - rotation @ centre
        return cls(np.concatenate([rotation, offset[:, None]], axis=1), size)

    @property
    def scale(self) -> float:
        """Square px per image px."""
        return float(np.linalg.norm(self.to_square[0, :2]))

    def cut(self, rgb: np.ndarray) -> np.ndarray:
        """The square (size x size RGB); outside the photo its edge pixels are repeated.

        A large photo is first cut to the square's bounding box and shrunk with area
        averaging (warpAffine alone would alias a 12 MP photo's hair into noise)."""
        x0, y0, x1, y1 = self._image_box(rgb.shape[1], rgb.shape[0])
        region = np.ascontiguousarray(rgb[y0:y1, x0:x1])
        shrink = min(1.0, self.scale)
        if shrink < 1.0:
            size = (max(1, round((x1 - x0) * shrink)), max(1, round((y1 - y0) * shrink)))
            region = cv2.resize(region, size, interpolation=cv2.INTER_AREA)
        # region px -> image px: p / shrink + origin
        region_to_image = np.array([[1 / shrink, 0, x0], [0, 1 / shrink, y0], [0, 0, 1]], np.float64)
        matrix = self.to_square @ region_to_image
        return cv2.warpAffine(
            region, matrix, (self.size, self.size), flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE
        )

    def face_in_square(self, face: Face) -> Face:
        """The face's landmarks in square px (z scaled like x)."""
        xy = face.points @ self.to_square[:, :2].T + self.to_square[:, 2]
        z = face.landmarks[:, 2:] * self.scale
        return Face(landmarks=np.concatenate([xy, z], axis=1), image_width=self.size, image_height=self.size)

    def paste(self, square_mask: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        """A square boolean mask as one of the image's `shape` (H, W); False outside the square.
        Only the square's bounding box is warped (a 12 MP photo's rest stays untouched)."""
        height, width = shape
        x0, y0, x1, y1 = self._image_box(width, height)
        full = np.zeros(shape, bool)
        box_to_image = np.array([[1.0, 0.0, x0], [0.0, 1.0, y0]])
        values = self.warp_into(square_mask.astype(np.float32), box_to_image, (y1 - y0, x1 - x0))
        full[y0:y1, x0:x1] = values >= 0.5
        return full

    def _image_box(self, width: int, height: int) -> tuple[int, int, int, int]:
        """x0, y0, x1, y1 of the square's bounding box in the image, clipped, 2 px margin."""
        corners = (
            cv2.invertAffineTransform(self.to_square)
            @ np.array([[0, 0, 1], [self.size, 0, 1], [0, self.size, 1], [self.size, self.size, 1]], np.float64).T
        )
        x0, y0 = np.clip(np.floor(corners.min(axis=1)) - 2, 0, [width - 1, height - 1]).astype(int)
        x1, y1 = np.clip(np.ceil(corners.max(axis=1)) + 2, [x0 + 1, y0 + 1], [width, height]).astype(int)
        return int(x0), int(y0), int(x1), int(y1)

    def warp_into(self, square_values: np.ndarray, from_frame: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        """Square values (float32) in another frame of `shape` (H, W), given that frame's
        affine map to image px (`from_frame`, 2x3); 0 outside the square."""
        frame_to_image = np.vstack([from_frame, [0.0, 0.0, 1.0]])
        frame_to_square = self.to_square @ frame_to_image
        return cv2.warpAffine(
            square_values.astype(np.float32),
            frame_to_square,
            (shape[1], shape[0]),
            flags=cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP,
            borderMode=cv2.BORDER_CONSTANT,
            borderValue=(0.0,),
        )
