"""The facial midline frame (`FaceFrame`): the coordinates every stage measures heights in.

`v` is the height above the glabella along the facial midline, `u` the signed distance
across it (image-right positive), both in pixels. The face stage turns a face upright with
it, the hairline stage traces and measures in it, the drawing stage designs in it; so it
lives here, above none of them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .types import Face, LandmarkId


@dataclass(frozen=True)
class FaceFrame:
    """The facial midline frame: origin at the glabella, `up` along the midline."""

    origin: np.ndarray  # (2,) glabella, px
    up: np.ndarray  # (2,) unit vector towards the forehead
    across: np.ndarray  # (2,) unit vector towards image-right

    @classmethod
    def from_face(cls, face: Face) -> FaceFrame:
        midline = face.points[list(LandmarkId.MIDLINE)]
        # total least squares: the midline is as uncertain across as along
        _, _, vt = np.linalg.svd(midline - midline.mean(axis=0))
        up = vt[0] / np.linalg.norm(vt[0])
        if np.dot(up, face.points[LandmarkId.MESH_TOP] - face.points[LandmarkId.MENTON]) < 0:
            up = -up
        return cls(origin=face.points[LandmarkId.GLABELLA].copy(), up=up, across=np.array([-up[1], up[0]]))

    def to_frame(self, points: np.ndarray) -> np.ndarray:
        """(N, 2) image px -> (N, 2) (u, v) px."""
        offset = np.asarray(points, dtype=np.float64).reshape(-1, 2) - self.origin
        return np.stack([offset @ self.across, offset @ self.up], axis=1)

    def to_image(self, uv: np.ndarray) -> np.ndarray:
        """(N, 2) (u, v) px -> (N, 2) image px."""
        uv = np.asarray(uv, dtype=np.float64).reshape(-1, 2)
        return self.origin + uv[:, :1] * self.across + uv[:, 1:] * self.up
