"""Builders of test images and uploads: real faces edited in known ways, and hostile files.

Plain functions so that any test can make its own variant; `conftest.py` wraps the common
ones as fixtures.
"""

from __future__ import annotations

import io
import struct
import zlib
from pathlib import Path

import numpy as np
from PIL import Image
from skimage import data
from skimage.transform import rotate


def side_by_side(left: np.ndarray, right: np.ndarray) -> np.ndarray:
    """Two photos in one (heights must match): two faces for the 1006 rule."""
    return np.ascontiguousarray(np.concatenate([left, right], axis=1))


def rotated(rgb: np.ndarray, degrees: float) -> np.ndarray:
    """Rotated counter-clockwise in the image plane about the centre, same size, edges repeated."""
    turned = rotate(rgb, degrees, resize=False, mode="edge", preserve_range=True)
    return np.ascontiguousarray(np.clip(np.rint(turned), 0, 255).astype(np.uint8))


def mirrored(rgb: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(rgb[:, ::-1])


def pasted_on_canvas(rgb: np.ndarray, size: int, top: int, left: int, gray: int = 128) -> np.ndarray:
    """The photo as a small part of a large uniform canvas: a face far from the camera."""
    canvas = np.full((size, size, 3), gray, dtype=np.uint8)
    canvas[top : top + rgb.shape[0], left : left + rgb.shape[1]] = rgb
    return canvas


def fringe_lifted(rgb: np.ndarray, hair: np.ndarray, points: np.ndarray, line_row: float) -> np.ndarray:
    """`rgb` with the hair in `hair` between `line_row` and the brows, over the forehead's
    width (landmarks 54 to 284 of `points`), painted with the forehead's own skin (a little
    noise): a fringe brushed back, showing a straight hairline at `line_row`."""
    x, y = points[151].round().astype(int)
    skin = np.median(rgb[y + 2 : y + 6, x - 10 : x + 10].reshape(-1, 3), axis=0)
    noise = np.random.default_rng(0).normal(0, 3, rgb.shape)
    painted = np.clip(skin[None, None, :] + noise, 0, 255).astype(np.uint8)
    rows, columns = np.arange(rgb.shape[0])[:, None], np.arange(rgb.shape[1])[None, :]
    brows = points[[70, 63, 105, 66, 107, 300, 293, 334, 296, 336], 1].min()
    forehead = (rows > line_row) & (rows < brows) & (columns >= points[54][0]) & (columns <= points[284][0])
    return np.where((hair & forehead)[..., None], painted, rgb)


def load_photo(photos_dir: Path, name: str) -> np.ndarray:
    """A labelled photo as RGB uint8 (several are below 480 px: call the analysis directly)."""
    with Image.open(photos_dir / name) as image:
        return np.asarray(image.convert("RGB"))


def no_face_photo() -> np.ndarray:
    """A real photo without a face (a cup of coffee, 400×600)."""
    return data.coffee()


def gradient(height: int = 480, width: int = 640) -> np.ndarray:
    ramp = np.linspace(0, 255, width, dtype=np.uint8)
    return np.ascontiguousarray(np.broadcast_to(ramp[None, :, None], (height, width, 3)))


def encode(image: np.ndarray | Image.Image, format: str, **options: object) -> bytes:
    """The bytes a client would upload: `format` is Pillow's name (JPEG, PNG, WEBP, GIF...)."""
    picture = image if isinstance(image, Image.Image) else Image.fromarray(image)
    buffer = io.BytesIO()
    picture.save(buffer, format=format, **options)
    return buffer.getvalue()


def huge_blank_png(width: int, height: int) -> bytes:
    """A valid 1-bit PNG of any size, built without ever holding its pixels: a decompression
    bomb (30000×30000 is ~109 KB). Rows are compressed 1000 at a time."""
    row = b"\0" * (1 + (width + 7) // 8)
    compressor = zlib.compressobj(9)
    pixels = [compressor.compress(row * min(1000, height - start)) for start in range(0, height, 1000)]
    pixels.append(compressor.flush())
    header = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", header) + _chunk(b"IDAT", b"".join(pixels)) + _chunk(b"IEND", b"")


def _chunk(kind: bytes, payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload))
