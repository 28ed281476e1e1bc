"""Annotated images and PNG encoding (contract.md § Images in responses).

Every image is drawn at the input size, on a copy of the input (endpoint 1's one picture on
the decoded photo itself). Nothing covers what a picture is about (analysis.md § Rendering):
- the subject (hairline, design line, key points, the face's own landmarks' hull) is marked
  on a coarse occupancy grid first (`Pen.protect`), and every label and the legend are
  placed where they cover the least of it (`Pen.place`: preferred spots first, then a scan
  of the whole picture), on a translucent backing;
- the subject is drawn last, over the guides and the text: the hairline's own points are
  never painted over (tests/analysis/test_render.py measures it on real photos).
Text is Pillow's own FreeType font (Aileron, embedded in Pillow: no font file to find on a
host), so `±` is drawn as itself; labels stay Latin-1 (a CJK font is not guaranteed on a
host). Nothing is drawn outside the image: polylines go through OpenCV's own clipping with
coordinates bounded first (huge or non-finite values would overflow its fixed-point maths),
and point markers and labels are moved inside the image so they stay visible.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import cv2
import numpy as np
import pybase64
from PIL import Image, ImageDraw, ImageFont

from ..frame import FaceFrame
from ..types import Calibration, Face, Hairline, LandmarkId
from .designs import Design, canthal_u, has_hairline

# RGB colours
HAIRLINE = (40, 220, 60)
DESIGN = (255, 70, 200)
CURRENT = (255, 230, 80)
MIDLINE = (80, 200, 255)
THIRDS = (255, 255, 255)
POINT = (255, 50, 50)
TEMPLE = (0, 255, 255)
TEXT = (255, 255, 255)
TEXT_BACKGROUND = (0, 0, 0)
BACKING_OPACITY = 0.6  # the photo shows through the labels' backing

# libvips' PNG encoder (libspng + zlib-ng), deflate level 1 and the UP filter. At 12 MP on a
# 2-core EPYC: the benchmark's smooth upscaled photo 115 ms and 11.5 MB (SUB: 120 ms,
# 13 MB; OpenCV's libpng at level 1: 470 ms, 6.5 MB); real photos cost 14-18 ms/MP and come
# out at 54-57 % of the raw pixels (SUB: 16-19 ms/MP, 59-66 %). Level 0 (stored) would be
# 60 ms and 36 MB, but every megabyte of PNG costs the host ~5 ms again in base64 JSON and
# the pipe from the model process, so the smaller file is the cheaper one overall.
_PNG_OPTIONS = {"compression": 1, "filter": "up"}
_COORDINATE_BOUND = 1 << 20
# The occupancy grid: about this many cells along the long side (placing is exact enough at
# a few pixels, and a 12 MP photo's grid stays small).
_GRID_CELLS = 320
_SCAN_STEPS = 24  # candidate positions per axis when no preferred spot is free


@functools.cache
def _font(size_px: int) -> ImageFont.FreeTypeFont | ImageFont.ImageFont:
    return ImageFont.load_default(size=size_px)


class Pen:
    """Line widths and font size scaled to the image, so 512 px and 12 MP look alike; an
    occupancy grid of what labels must not cover."""

    def __init__(self, image: np.ndarray) -> None:
        self.image = image
        self.height, self.width = image.shape[:2]
        short_side = min(self.height, self.width)
        self.thickness = max(1, round(short_side / 300))
        self.thin = max(1, self.thickness // 2)  # guides (midline, thirds, the current hairline)
        self.font = _font(max(11, round(short_side / 42)))
        self.radius = max(2, round(short_side / 180))
        self.pad = max(2, round(short_side / 250))
        self.cell = max(1.0, max(self.height, self.width) / _GRID_CELLS)
        grid_shape = (int(np.ceil(self.height / self.cell)), int(np.ceil(self.width / self.cell)))
        self._protected = np.zeros(grid_shape, np.uint8)  # 1: the subject; 2: a label already placed

    # what labels must not cover
    def protect_line(self, points: np.ndarray, thickness: int | None = None) -> None:
        grid_points = self._grid_points(points)
        if len(grid_points) >= 2:
            width = max(1, round(2 * (thickness or self.thickness) / self.cell) + 1)
            cv2.polylines(self._protected, [grid_points], False, (1,), width)

    def protect_point(self, point: Any) -> None:
        x, y = self._inside(point)
        if x is not None and y is not None:
            radius = max(1, round(2 * self.radius / self.cell))
            cv2.circle(self._protected, (int(x / self.cell), int(y / self.cell)), radius, (1,), -1)

    def protect_hull(self, points: np.ndarray) -> None:
        grid_points = self._grid_points(points)
        if len(grid_points) >= 3:
            cv2.fillConvexPoly(self._protected, cv2.convexHull(grid_points), (1,))

    def covered(self, box: tuple[int, int, int, int]) -> float:
        """Share of `box` (x0, y0, x1, y1 px) lying on the subject or on a placed label."""
        cells = self._cells(box)
        return float(np.count_nonzero(cells)) / max(1, cells.size)

    def _cells(self, box: tuple[int, int, int, int]) -> np.ndarray:
        x0, y0, x1, y1 = box
        c = self.cell
        return self._protected[int(y0 / c) : int(np.ceil(y1 / c)), int(x0 / c) : int(np.ceil(x1 / c))]

    def _grid_points(self, points: np.ndarray) -> np.ndarray:
        points = np.asarray(points, dtype=np.float64).reshape(-1, 2)
        points = points[np.isfinite(points).all(axis=1)]
        return np.clip(np.round(points / self.cell), -_COORDINATE_BOUND, _COORDINATE_BOUND).astype(np.int32)

    # drawing
    def polyline(self, points: np.ndarray, colour: tuple[int, int, int], thickness: int | None = None) -> None:
        points = np.asarray(points, dtype=np.float64).reshape(-1, 2)
        points = points[np.isfinite(points).all(axis=1)]
        if len(points) < 2:
            return
        bounded = np.clip(np.round(points), -_COORDINATE_BOUND, _COORDINATE_BOUND).astype(np.int32)
        cv2.polylines(self.image, [bounded], False, colour, thickness or self.thickness, cv2.LINE_AA)

    def marker(self, point: Any, colour: tuple[int, int, int]) -> None:
        x, y = self._inside(point)
        if x is not None and y is not None:
            cv2.circle(self.image, (x, y), self.radius, colour, -1, cv2.LINE_AA)

    def text_size(self, lines: Sequence[str]) -> tuple[int, int]:
        """(width, height) px of a text block with its backing."""
        _left, _top, right, bottom = ImageDraw.Draw(Image.new("L", (1, 1))).multiline_textbbox(
            (0, 0), "\n".join(_latin1(line) for line in lines), font=self.font, spacing=self._spacing
        )
        return int(right) + 2 * self.pad, int(bottom) + 2 * self.pad

    @property
    def _spacing(self) -> int:
        return max(2, round(0.3 * self.font.size)) if isinstance(self.font, ImageFont.FreeTypeFont) else 4

    def place(self, size: tuple[int, int], preferred: Sequence[Any] = ()) -> tuple[int, int]:
        """Top-left corner for a box of `size` (w, h) inside the image: the first preferred
        spot (each moved inside) that covers nothing, else whichever of them and of a scan of
        the whole picture covers least (ties: the earlier, then the nearer the top-left)."""
        width, height = size
        x_max, y_max = max(0, self.width - width), max(0, self.height - height)
        spots = []
        for anchor in preferred:
            x, y = self._inside(anchor)
            if x is not None and y is not None:
                spots.append((int(np.clip(x, 0, x_max)), int(np.clip(y, 0, y_max))))
        for spot in spots:
            if self.covered((spot[0], spot[1], spot[0] + width, spot[1] + height)) == 0.0:
                return spot
        xs = np.unique(np.linspace(0, x_max, _SCAN_STEPS).round().astype(int))
        ys = np.unique(np.linspace(0, y_max, _SCAN_STEPS).round().astype(int))
        spots += [(int(x), int(y)) for y in ys for x in xs]
        return min(spots, key=lambda spot: self.covered((spot[0], spot[1], spot[0] + width, spot[1] + height)))

    def text_block(self, lines: Sequence[str], preferred: Sequence[Any] = ((0, 0),)) -> None:
        """Lines of text on a translucent backing, placed where they cover least (`place`)."""
        if not lines:
            return
        width, height = self.text_size(lines)
        x, y = self.place((width, height), preferred)
        x1, y1 = min(self.width, x + width), min(self.height, y + height)
        region = self.image[y:y1, x:x1]
        picture = Image.fromarray(cv2.LUT(region, _backing_table()))
        ImageDraw.Draw(picture).multiline_text(
            (self.pad, self.pad),
            "\n".join(_latin1(line) for line in lines),
            font=self.font,
            fill=TEXT,
            spacing=self._spacing,
        )
        region[...] = np.asarray(picture)
        cells = self._cells((x, y, x1, y1))
        cells[cells == 0] = 2

    def label(self, text: str, anchor: Any) -> None:
        self.text_block([text], (anchor,))

    def _inside(self, point: Any) -> tuple[int, int] | tuple[None, None]:
        x, y = (float(value) for value in np.asarray(point, dtype=np.float64).reshape(2))
        if not (np.isfinite(x) and np.isfinite(y)):
            return None, None
        return int(np.clip(round(x), 0, self.width - 1)), int(np.clip(round(y), 0, self.height - 1))


@functools.cache
def _backing_table() -> np.ndarray:
    """Each channel's value under the translucent backing, as a (256, 1, 3) lookup table: the
    same float32 blend per value, looked up instead of computed over a 12 MP photo's label
    regions (3.8 ms of its 15 ms picture)."""
    levels = np.arange(256, dtype=np.float32)[:, None] * (1 - BACKING_OPACITY) + np.float32(BACKING_OPACITY) * np.array(
        TEXT_BACKGROUND, np.float32
    )
    return np.clip(np.rint(levels), 0, 255).astype(np.uint8).reshape(256, 1, 3)


def _latin1(text: str) -> str:
    """What the font can draw: Latin-1 (so `±`, `°`), anything else as `?`."""
    return text.encode("latin-1", "replace").decode("latin-1")


def _mm(value: Any) -> str:
    return "n/a" if value is None else f"{value:.1f} mm"


def _face_width(face: Face) -> float:
    return float(np.ptp(face.points[:, 0]))


def _draw_thirds(pen: Pen, face: Face, frame: FaceFrame, trichion: Any, measurements: dict[str, Any]) -> None:
    """Ticks across the midline at trichion, glabella, subnasale and menton, with lengths
    beside them (on the free side of the face)."""
    levels = [LandmarkId.GLABELLA, LandmarkId.SUBNASALE, LandmarkId.MENTON]
    v = list(frame.to_frame(face.points[levels])[:, 1])
    names = ["middle", "lower"]
    keys = ["middle_third_mm", "lower_third_mm"]
    if trichion is not None:
        v.insert(0, float(frame.to_frame(np.asarray(trichion))[0, 1]))
        names.insert(0, "upper")
        keys.insert(0, "upper_third_mm")
    left, right = canthal_u(face, frame)
    half = 0.35 * (right - left)
    for level in v:
        pen.polyline(frame.to_image(np.array([[left - half, level], [right + half, level]])), THIRDS, pen.thin)
    gap = 0.05 * _face_width(face)
    for name, key, top, bottom in zip(names, keys, v[:-1], v[1:], strict=True):
        text = f"{name} {_mm(measurements.get(key))}"
        width, height = pen.text_size([text])
        middle = (top + bottom) / 2
        beside = [
            frame.to_image(np.array([[right + half + gap, middle]]))[0] - [0, height / 2],
            frame.to_image(np.array([[left - half - gap, middle]]))[0] - [width, height / 2],
        ]
        pen.text_block([text], beside)


def _protect_subject(pen: Pen, face: Face, lines: Sequence[np.ndarray], points: Sequence[Any]) -> None:
    pen.protect_hull(face.points)
    for line in lines:
        pen.protect_line(line)
    for point in points:
        pen.protect_point(point)


def annotate_measurement(
    rgb: np.ndarray, face: Face, hairline: Hairline, calibration: Calibration, result: dict[str, Any]
) -> np.ndarray:
    """Endpoint 1's picture: midline, thirds, hairline, key points and the numbers, drawn on
    `rgb` itself (the endpoint needs the photo no more; a 12 MP copy costs ~10 ms).

    `result` is the endpoint's data (`measurements`, `assessment`, `segmenter`)."""
    pen = Pen(rgb)
    frame = FaceFrame.from_face(face)
    measurements = result.get("measurements") or {}
    key_points = [
        face.points[landmark]
        for landmark in (
            LandmarkId.GLABELLA,
            LandmarkId.NASION,
            LandmarkId.SUBNASALE,
            LandmarkId.MENTON,
            *LandmarkId.IRIS_CENTERS,
        )
    ]
    temples = [temple for temple in (hairline.left_temple, hairline.right_temple) if temple is not None]
    drawn_line = hairline.points if has_hairline(hairline) and hairline.points is not None else None
    _protect_subject(
        pen,
        face,
        [] if drawn_line is None else [drawn_line],
        [*key_points, *temples, *([hairline.trichion] if hairline.trichion is not None else [])],
    )
    top_v = frame.to_frame(face.points[LandmarkId.MESH_TOP])[0, 1] * 1.6
    bottom_v = frame.to_frame(face.points[LandmarkId.MENTON])[0, 1] * 1.1
    pen.polyline(frame.to_image(np.array([[0.0, bottom_v], [0.0, top_v]])), MIDLINE, pen.thin)
    _draw_thirds(pen, face, frame, hairline.trichion if has_hairline(hairline) else None, measurements)
    assessment = result.get("assessment") or {}
    band = f" \u00b1{hairline.uncertainty_mm:.1f} mm" if hairline.uncertainty_mm else ""
    pen.text_block(
        [
            f"forehead {_mm(measurements.get('forehead_height_mm'))} ({assessment.get('forehead') or 'n/a'})",
            f"hairline {hairline.status}{band}",
            f"scale {calibration.mm_per_px:.3f} mm/px (iris {calibration.iris_diameter_px:.1f} px)",
            f"segmenter {result.get('segmenter', 'n/a')}",
        ],
        _corners(pen),
    )
    # the subject last: nothing is painted over it
    for point in key_points:
        pen.marker(point, MIDLINE)
    for temple in temples:
        pen.marker(temple, TEMPLE)
    if hairline.trichion is not None:
        pen.marker(hairline.trichion, POINT)
    if drawn_line is not None:
        pen.polyline(drawn_line, HAIRLINE)
    return rgb


def _corners(pen: Pen) -> list[tuple[int, int]]:
    """The picture's corners, top first: where a legend is looked for."""
    far_x, far_y = pen.width, pen.height  # moved inside by `place`
    return [(0, 0), (far_x, 0), (0, far_y), (far_x, far_y)]


def draw_design(rgb: np.ndarray, hairline: Hairline, design: Design, caption: str) -> np.ndarray:
    """A designed (or marked) hairline over the photo, the current one faintly beneath."""
    image = rgb.copy()
    pen = Pen(image)
    current = hairline.points if has_hairline(hairline) and hairline.points is not None else None
    ends = (design.points[0], design.points[-1])
    for line in [design.points] if current is None else [design.points, current]:
        pen.protect_line(line)
    for end in ends:
        pen.protect_point(end)
    pen.text_block([caption], _corners(pen))
    for end in ends:
        pen.marker(end, TEMPLE)
    if current is not None:
        pen.polyline(current, CURRENT, pen.thin)
    pen.polyline(design.points, DESIGN, pen.thickness + 1)
    return image


def mask_image(hair: np.ndarray) -> np.ndarray:
    """Single-channel uint8: hair 255, everything else 0."""
    return np.where(hair, 255, 0).astype(np.uint8)


def encode_png(image: np.ndarray) -> bytes:
    """PNG bytes of an RGB or single-channel uint8 image."""
    if image.dtype != np.uint8 or image.ndim not in (2, 3):
        raise ValueError(f"expected a uint8 RGB or single-channel image, got {image.dtype} {image.shape}")
    pixels = np.ascontiguousarray(image)
    bands = 1 if pixels.ndim == 2 else pixels.shape[2]
    vips = _pyvips()
    picture = vips.Image.new_from_memory(pixels.data, pixels.shape[1], pixels.shape[0], bands, "uchar")
    return bytes(picture.pngsave_buffer(**_PNG_OPTIONS))


@functools.cache
def _pyvips() -> Any:
    """libvips, loaded on first use: the GPU host's web process imports this module too."""
    import pyvips

    # libvips reports every finished thread pool at INFO ("threadpool completed with 2
    # workers"), twice per image: chatter; its warnings and errors still show
    logging.getLogger("pyvips").setLevel(logging.WARNING)
    pyvips.cache_set_max(0)  # every image is new: caching operations would only hold memory
    return pyvips


def png_base64(image: np.ndarray) -> str:
    """Base64 of `encode_png` (pybase64: SIMD, 1 ms for a 13 MB PNG against 15 ms)."""
    return pybase64.b64encode_as_string(encode_png(image))


def png_base64_all(images: list[np.ndarray]) -> list[str]:
    """`png_base64` of several images at once. pyvips calls libvips through cffi, which
    releases the GIL, so threads use every core."""
    if len(images) <= 1:
        return [png_base64(image) for image in images]
    with ThreadPoolExecutor(max_workers=min(len(images), os.cpu_count() or 1)) as pool:
        return list(pool.map(png_base64, images))
