"""Annotated images and PNG encoding (contract.md § Images in responses).

Every image is drawn at the input size, on a copy of the input (endpoint 1's one picture on
the decoded photo itself). Labels are ASCII (cv2.putText has no CJK glyphs, and a CJK font
is not guaranteed on a host). Nothing is drawn outside the image: polylines go through
OpenCV's own clipping with coordinates bounded first (huge or non-finite values would
overflow its fixed-point maths), and point markers and labels are moved inside the image
so they stay visible.
"""

from __future__ import annotations

import functools
import logging
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import cv2
import numpy as np
import pybase64

from .designs import Design, FaceFrame, canthal_u, has_hairline
from .types import Calibration, Face, Hairline, LandmarkId

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

# libvips' PNG encoder (libspng + zlib-ng), deflate level 1 and the UP filter. At 12 MP on a
# 2-core EPYC: the benchmark's smooth upscaled astronaut 115 ms and 11.5 MB (SUB: 120 ms,
# 13 MB; OpenCV's libpng at level 1: 470 ms, 6.5 MB); real photos cost 14-18 ms/MP and come
# out at 54-57 % of the raw pixels (SUB: 16-19 ms/MP, 59-66 %). Level 0 (stored) would be
# 60 ms and 36 MB, but every megabyte of PNG costs the host ~5 ms again in base64 JSON and
# the pipe from the model process, so the smaller file is the cheaper one overall.
_PNG_OPTIONS = {"compression": 1, "filter": "up"}
_COORDINATE_BOUND = 1 << 20


class Pen:
    """Line widths and font size scaled to the image, so 512 px and 12 MP look alike."""

    def __init__(self, image: np.ndarray) -> None:
        self.image = image
        self.height, self.width = image.shape[:2]
        short_side = min(self.height, self.width)
        self.thickness = max(1, round(short_side / 300))
        self.thin = max(1, self.thickness // 2)  # guides (midline, thirds, the current hairline)
        self.font_scale = max(0.35, short_side / 1100)
        self.radius = max(2, round(short_side / 180))

    def polyline(self, points: np.ndarray, colour: tuple[int, int, int], thickness: int | None = None) -> None:
        points = np.asarray(points, dtype=np.float64).reshape(-1, 2)
        points = points[np.isfinite(points).all(axis=1)]
        if len(points) < 2:
            return
        bounded = np.clip(np.round(points), -_COORDINATE_BOUND, _COORDINATE_BOUND).astype(np.int32)
        cv2.polylines(self.image, [bounded], False, colour, thickness or self.thickness, cv2.LINE_AA)

    def marker(self, point: Any, colour: tuple[int, int, int]) -> None:
        x, y = self._inside(point)
        if x is not None:
            cv2.circle(self.image, (x, y), self.radius, colour, -1, cv2.LINE_AA)

    def label(self, text: str, anchor: Any, colour: tuple[int, int, int] = TEXT) -> None:
        """Text whose top-left corner is at `anchor`, shifted as needed to fit inside."""
        text = text.encode("ascii", "replace").decode("ascii")
        font, thickness = cv2.FONT_HERSHEY_SIMPLEX, self.thin
        (text_w, text_h), baseline = cv2.getTextSize(text, font, self.font_scale, thickness)
        x, y = self._inside(anchor)
        if x is None:
            return
        pad = max(1, self.thickness)
        x = int(np.clip(x, 0, max(0, self.width - text_w - 2 * pad)))
        y = int(np.clip(y, 0, max(0, self.height - text_h - baseline - 2 * pad)))
        cv2.rectangle(self.image, (x, y), (x + text_w + 2 * pad, y + text_h + baseline + 2 * pad), TEXT_BACKGROUND, -1)
        cv2.putText(self.image, text, (x + pad, y + pad + text_h), font, self.font_scale, colour, thickness, cv2.LINE_AA)

    def text_block(self, lines: list[str], anchor: tuple[float, float] = (0, 0)) -> None:
        step = cv2.getTextSize("Ag", cv2.FONT_HERSHEY_SIMPLEX, self.font_scale, 1)[0][1] * 1.9
        for index, line in enumerate(lines):
            self.label(line, (anchor[0], anchor[1] + index * step))

    def _inside(self, point: Any) -> tuple[int, int] | tuple[None, None]:
        x, y = (float(value) for value in np.asarray(point, dtype=np.float64).reshape(2))
        if not (np.isfinite(x) and np.isfinite(y)):
            return None, None
        return int(np.clip(round(x), 0, self.width - 1)), int(np.clip(round(y), 0, self.height - 1))


def _mm(value: Any) -> str:
    return "n/a" if value is None else f"{value:.1f} mm"


def _face_width(face: Face) -> float:
    return float(np.ptp(face.points[:, 0]))


def _draw_hairline(pen: Pen, hairline: Hairline, colour: tuple[int, int, int], thickness: int | None = None) -> None:
    if has_hairline(hairline):
        pen.polyline(hairline.points, colour, thickness)


def _draw_thirds(pen: Pen, face: Face, frame: FaceFrame, trichion: Any, measurements: dict[str, Any]) -> None:
    """Ticks across the midline at trichion, glabella, subnasale and menton, with lengths."""
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
    label_u = right + half + 0.05 * _face_width(face)
    for name, key, top, bottom in zip(names, keys, v[:-1], v[1:]):
        anchor = frame.to_image(np.array([[label_u, (top + bottom) / 2]]))[0]
        pen.label(f"{name} {_mm(measurements.get(key))}", anchor)


def annotate_measurement(
    rgb: np.ndarray, face: Face, hairline: Hairline, calibration: Calibration, result: dict[str, Any]
) -> np.ndarray:
    """Endpoint 1's picture: midline, thirds, hairline, key points and the numbers, drawn on
    `rgb` itself (the endpoint needs the photo no more; a 12 MP copy costs ~10 ms).

    `result` is the endpoint's data (`measurements`, `assessment`, `segmenter`)."""
    pen = Pen(rgb)
    frame = FaceFrame.from_face(face)
    measurements = result.get("measurements") or {}
    top_v = frame.to_frame(face.points[LandmarkId.MESH_TOP])[0, 1] * 1.6
    bottom_v = frame.to_frame(face.points[LandmarkId.MENTON])[0, 1] * 1.1
    pen.polyline(frame.to_image(np.array([[0.0, bottom_v], [0.0, top_v]])), MIDLINE, pen.thin)
    _draw_thirds(pen, face, frame, hairline.trichion if has_hairline(hairline) else None, measurements)
    _draw_hairline(pen, hairline, HAIRLINE)
    for landmark in (LandmarkId.GLABELLA, LandmarkId.NASION, LandmarkId.SUBNASALE, LandmarkId.MENTON,
                     *LandmarkId.IRIS_CENTERS):
        pen.marker(face.points[landmark], MIDLINE)
    for temple in (hairline.left_temple, hairline.right_temple):
        if temple is not None:
            pen.marker(temple, TEMPLE)
    if hairline.trichion is not None:
        pen.marker(hairline.trichion, POINT)
    assessment = result.get("assessment") or {}
    pen.text_block([
        f"forehead {_mm(measurements.get('forehead_height_mm'))} ({assessment.get('forehead') or 'n/a'})",
        f"hairline {hairline.status}" + (f" +-{hairline.uncertainty_mm:.1f} mm" if hairline.uncertainty_mm else ""),
        f"scale {calibration.mm_per_px:.3f} mm/px (iris {calibration.iris_diameter_px:.1f} px)",
        f"segmenter {result.get('segmenter', 'n/a')}",
    ])
    return rgb


def draw_design(rgb: np.ndarray, hairline: Hairline, design: Design, caption: str) -> np.ndarray:
    """A designed (or marked) hairline over the photo, the current one faintly beneath."""
    image = rgb.copy()
    pen = Pen(image)
    _draw_hairline(pen, hairline, CURRENT, pen.thin)
    pen.polyline(design.points, DESIGN, pen.thickness + 1)
    for end in (design.points[0], design.points[-1]):
        pen.marker(end, TEMPLE)
    pen.text_block([caption])
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
