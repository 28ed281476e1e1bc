"""How many people are in the photo: the face mesh and the full-range detector together.

Neither model counts on its own (analysis.md § Landmarks). The mesh's short-range
detector misses faces under about a fifth of the frame and, with `max_num_faces=2`, can
return two overlapping meshes of one face or a "face" on a drawing in the backdrop. The
full-range detector sees small faces, but only down to about a tenth of the side of the
picture it is given (it works on a 192 px copy): a second person half the size of a
first who fills 15 % of a wide photo is missed. So:

1. boxes come from the mesh (landmark extent) and from the full-range detector, run on the
   whole picture and, when the largest face is small in it, on overlapping tiles about
   `TILE_FACE_WIDTHS` face widths wide (there a face a third as wide is ~1/10 of the tile);
2. overlapping boxes are one face (non-maximum suppression by intersection over the
   smaller box, which also merges a mesh box with the larger detector box of one face);
3. a face counts when it is at least `MIN_WIDTH_SHARE` of the largest one's width;
4. a face only one model saw must be confirmed by the other on a crop around it (there
   it is large): on tiles the detector takes a helmet or a badge for a face, and the mesh
   fits drawings; when nothing is confirmed, the mesh is trusted for its one face.

Pure functions of boxes; the MediaPipe calls (rule 4) stay in `landmarks`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

MIN_WIDTH_SHARE = 1 / 3  # a poster or a far-away passer-by is smaller
SAME_FACE_OVERLAP = 0.5  # intersection over the smaller box's area
TILE_FACE_WIDTHS = 3.3
# the detector sees faces down to ~1/10 of its input's long side: tiling pays only when a
# face a third of the largest is smaller than that in the whole picture
TILE_WHEN_FACE_UNDER = 0.3  # largest face width / long side of the picture
MIN_TILE_PX = 128


@dataclass(frozen=True)
class Box:
    """A face box in image pixels; `mesh` is the index of the mesh face it came from."""

    left: float
    top: float
    width: float
    height: float
    mesh: int | None = None

    @property
    def area(self) -> float:
        return self.width * self.height

    def overlap(self, other: Box) -> float:
        """Intersection over the smaller box's area (0..1)."""
        dx = min(self.left + self.width, other.left + other.width) - max(self.left, other.left)
        dy = min(self.top + self.height, other.top + other.height) - max(self.top, other.top)
        if dx <= 0 or dy <= 0:
            return 0.0
        return dx * dy / max(1e-9, min(self.area, other.area))

    def scaled(self, factor: float) -> Box:
        return Box(self.left * factor, self.top * factor, self.width * factor, self.height * factor, self.mesh)

    def shifted(self, dx: float, dy: float) -> Box:
        return Box(self.left + dx, self.top + dy, self.width, self.height, self.mesh)


@dataclass(frozen=True)
class CountedFace:
    """One face after merging: its widest box, and the mesh face inside it, if any."""

    box: Box
    mesh: int | None
    detected: bool  # the full-range detector saw it


def mesh_box(points: np.ndarray, index: int) -> Box:
    """The extent of one mesh face's (N, 2) pixel landmarks."""
    low, high = points.min(axis=0), points.max(axis=0)
    return Box(float(low[0]), float(low[1]), float(high[0] - low[0]), float(high[1] - low[1]), mesh=index)


def tiles(height: int, width: int, face_width: float) -> Iterator[tuple[int, int, int]]:
    """(top, left, side) of square tiles `TILE_FACE_WIDTHS` face widths wide, overlapping by
    at least one face width so every face up to that width lies whole inside one tile."""
    side = int(min(min(height, width), max(MIN_TILE_PX, TILE_FACE_WIDTHS * face_width)))
    stride = max(1, int(side - face_width))
    for top in _starts(height, side, stride):
        for left in _starts(width, side, stride):
            yield top, left, side


def _starts(length: int, side: int, stride: int) -> list[int]:
    """Evenly spread starts from 0 to length - side, no further apart than `stride`."""
    count = int(np.ceil((length - side) / stride)) + 1
    return sorted({round(start) for start in np.linspace(0, length - side, count)})


def needs_tiles(height: int, width: int, largest_width: float) -> bool:
    return largest_width < TILE_WHEN_FACE_UNDER * max(height, width)


def merge(boxes: list[Box]) -> list[CountedFace]:
    """Boxes that overlap are one face: largest first, each absorbing what overlaps it."""
    faces: list[tuple[Box, list[Box]]] = []
    for box in sorted(boxes, key=lambda b: b.area, reverse=True):
        for kept, members in faces:
            if box.overlap(kept) >= SAME_FACE_OVERLAP:
                members.append(box)
                break
        else:
            faces.append((box, [box]))
    counted = []
    for kept, members in faces:
        meshes = [member.mesh for member in members if member.mesh is not None]
        counted.append(CountedFace(kept, meshes[0] if meshes else None, any(m.mesh is None for m in members)))
    return counted


def people(faces: list[CountedFace]) -> list[CountedFace]:
    """The faces at least `MIN_WIDTH_SHARE` as wide as the widest, widest first."""
    if not faces:
        return []
    largest = max(face.box.width for face in faces)
    return sorted(
        (face for face in faces if face.box.width >= MIN_WIDTH_SHARE * largest),
        key=lambda face: face.box.width,
        reverse=True,
    )


Detect = Callable[[np.ndarray], list[Box]]


def detector_boxes(rgb: np.ndarray, detect: Detect, largest_width: float) -> list[Box]:
    """Full-range boxes on the whole picture and, when faces are small in it, on tiles."""
    height, width = rgb.shape[:2]
    boxes = detect(rgb)
    largest_width = max([largest_width, *(box.width for box in boxes)])
    if largest_width > 0 and needs_tiles(height, width, largest_width):
        for top, left, side in tiles(height, width, largest_width):
            boxes += [
                box.shifted(left, top)
                for box in detect(np.ascontiguousarray(rgb[top : top + side, left : left + side]))
            ]
    return boxes
