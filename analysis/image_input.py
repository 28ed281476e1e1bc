"""Image input: uploaded bytes -> an upright RGB uint8 array, or the contract error that says why not.

Checks run cheapest first (analysis.md § Image input): byte size (1003), format (1002), pixel
count and resolution read from the header before anything is decoded (1004: a 109 KB PNG can
describe a 30000×30000 image), full decode (1002 for truncated or corrupt files), then EXIF
orientation and colour mode. Pillow reads every header and is told to recognise JPEG, PNG and
WebP and nothing else. The pixels are decoded once: those of an RGB or gray JPEG (nearly
every photo) by simplejpeg, the same libjpeg-turbo with the same settings as Pillow but
straight into a numpy array (12 MP: 26 ms against Pillow's 60-90 ms of decoding and then
copying out its own 4-byte pixels); everything else by Pillow.
"""

from __future__ import annotations

import contextlib
import io
import re
import warnings
from collections.abc import Callable

import numpy as np
import simplejpeg
from PIL import ExifTags, Image, ImageOps

from shared.contract import MSG_IMAGE_TOO_LARGE, MSG_UNSUPPORTED_IMAGE_FORMAT, RefusalKind
from shared.settings import AnalysisSettings

from .errors import AnalysisError

ACCEPTED_FORMATS = ("JPEG", "PNG", "WEBP")

_MSG_UNSUPPORTED = MSG_UNSUPPORTED_IMAGE_FORMAT
_MSG_CORRUPT = "图片文件已损坏或不完整：请重新导出或重新拍摄后上传（支持 JPEG、PNG、WebP）"
# Pillow itself refuses headers beyond 89.5 MP (warning) / 179 MP (error), before our own
# check sees them; its message carries the pixel count.
_PILLOW_PIXEL_COUNT = re.compile(r"\((\d+) pixels\)")
# Pillow's warning (89.5 MP) is redundant under our stricter pixel limit, which refuses the
# same images with 1004; silenced process-wide once, since `catch_warnings` is not thread-safe.
warnings.filterwarnings("ignore", category=Image.DecompressionBombWarning)

_SIXTEEN_BIT_MODES = ("I;16", "I;16L", "I;16B", "I;16N", "I")
_WHITE = (255, 255, 255)
# JPEG colour modes libjpeg-turbo turns into RGB itself (CMYK is left to Pillow)
_DIRECT_JPEG_MODES = ("RGB", "L")
# EXIF orientation -> the array view that shows the photo upright: Pillow's
# `ImageOps.exif_transpose` table (2 FLIP_LEFT_RIGHT ... 8 ROTATE_90) on (H, W, 3) arrays
_UPRIGHT: dict[int, Callable[[np.ndarray], np.ndarray]] = {
    2: lambda rgb: rgb[:, ::-1],
    3: lambda rgb: rgb[::-1, ::-1],
    4: lambda rgb: rgb[::-1],
    5: lambda rgb: rgb.transpose(1, 0, 2),
    6: lambda rgb: np.rot90(rgb, -1),
    7: lambda rgb: rgb[::-1, ::-1].transpose(1, 0, 2),
    8: lambda rgb: np.rot90(rgb),
}


def decode_image(data: bytes, limits: AnalysisSettings) -> np.ndarray:
    """Decode an upload into an upright RGB uint8 (H, W, 3) array, writable and the caller's
    own (the measure endpoint draws its picture on it); EXIF and alpha are dropped."""
    _check_byte_size(len(data), limits)
    image = _open_header(data)
    _check_pixel_count(image.width, image.height, limits)
    # EXIF orientation only swaps width and height, which the rule on the shortest and
    # longest side does not see: checking the header spares decoding a photo bound for 1004.
    check_image_size(image.width, image.height, limits)
    if image.format == "JPEG" and image.mode in _DIRECT_JPEG_MODES:
        return _upright(_decode_jpeg(data), _orientation(image))
    _load_pixels(image)
    return _to_rgb8(_apply_orientation(image))


def check_image_size(width: int, height: int, limits: AnalysisSettings) -> None:
    """The resolution rule on the upright image: 1004 with both numbers when it is broken."""
    short_side, long_side = min(width, height), max(width, height)
    if short_side < limits.min_short_side_px:
        raise AnalysisError(
            RefusalKind.BAD_RESOLUTION,
            f"图片分辨率过低：最短边 {short_side}px，要求至少 {limits.min_short_side_px}px",
        )
    if long_side > limits.max_long_side_px:
        raise AnalysisError(
            RefusalKind.BAD_RESOLUTION,
            f"图片分辨率过高：最长边 {long_side}px，最多允许 {limits.max_long_side_px}px，请缩小后上传",
        )


def _check_byte_size(size: int, limits: AnalysisSettings) -> None:
    if size > limits.max_image_bytes:
        message = MSG_IMAGE_TOO_LARGE.format(size_mb=size / 2**20, limit_mb=limits.max_image_bytes / 2**20)
        raise AnalysisError(RefusalKind.IMAGE_TOO_LARGE, message)
    if size == 0:
        raise AnalysisError(RefusalKind.UNSUPPORTED_IMAGE, "图片文件为空：请重新上传")


def _open_header(data: bytes) -> Image.Image:
    """Identify the format and read the header only; Pillow decodes nothing yet."""
    try:
        return Image.open(io.BytesIO(data), formats=list(ACCEPTED_FORMATS))
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as bomb:  # warning: under -W error
        raise _too_many_pixels(str(bomb)) from None
    except Image.UnidentifiedImageError:
        raise AnalysisError(RefusalKind.UNSUPPORTED_IMAGE, _MSG_UNSUPPORTED) from None
    except Exception:  # a damaged header raises whatever the plugin's parser hit
        raise AnalysisError(RefusalKind.UNSUPPORTED_IMAGE, _MSG_CORRUPT) from None


def _check_pixel_count(width: int, height: int, limits: AnalysisSettings) -> None:
    megapixels = width * height / 1e6
    if megapixels > limits.max_image_megapixels:
        raise AnalysisError(
            RefusalKind.BAD_RESOLUTION,
            f"图片像素数过大：{width}×{height}（{megapixels:.0f} 百万像素），"
            f"最多允许 {limits.max_image_megapixels:g} 百万像素，请缩小后上传",
        )


def _too_many_pixels(pillow_message: str) -> AnalysisError:
    found = _PILLOW_PIXEL_COUNT.search(pillow_message)
    amount = f"{int(found.group(1)) / 1e6:.0f} 百万像素" if found else "远超允许范围"
    return AnalysisError(RefusalKind.BAD_RESOLUTION, f"图片像素数过大：{amount}，请缩小后上传")


def _load_pixels(image: Image.Image) -> None:
    try:
        image.load()
    except Exception:  # truncated data, bad Huffman tables, CRC errors...: all "corrupt"
        raise AnalysisError(RefusalKind.UNSUPPORTED_IMAGE, _MSG_CORRUPT) from None


def _decode_jpeg(data: bytes) -> np.ndarray:
    try:  # strict: a truncated file or bad Huffman data raises instead of coming back grey-filled
        return simplejpeg.decode_jpeg(data, colorspace="RGB", fastdct=False, fastupsample=False, strict=True)
    except Exception:
        raise AnalysisError(RefusalKind.UNSUPPORTED_IMAGE, _MSG_CORRUPT) from None


def _orientation(image: Image.Image) -> int:
    """The EXIF orientation tag from the parsed header (1, as stored, when unreadable)."""
    try:
        return int(image.getexif().get(ExifTags.Base.Orientation, 1))
    except Exception:  # unreadable EXIF: the pixels are fine, show them as stored
        return 1


def _upright(rgb: np.ndarray, orientation: int) -> np.ndarray:
    turn = _UPRIGHT.get(orientation)
    return rgb if turn is None else np.ascontiguousarray(turn(rgb))


def _apply_orientation(image: Image.Image) -> Image.Image:
    # in place: without it Pillow copies every upright photo (36 MB at 12 MP) to return it
    with contextlib.suppress(Exception):  # unreadable EXIF: the pixels are fine, show them as stored
        ImageOps.exif_transpose(image, in_place=True)
    return image


def _to_rgb8(image: Image.Image) -> np.ndarray:
    if image.mode in _SIXTEEN_BIT_MODES:
        # Pillow's I;16 -> L conversion clips at 255 instead of scaling: scale by hand.
        wide = np.asarray(image, dtype=np.float64)
        gray = np.clip(np.rint(wide / 257.0), 0, 255).astype(np.uint8)
        return np.ascontiguousarray(np.repeat(gray[:, :, None], 3, axis=2))
    if _has_alpha(image):
        # Composite over white: what an image viewer shows for transparent pixels, instead of
        # whatever colour the encoder left under alpha 0.
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (*_WHITE, 255))
        image = Image.alpha_composite(background, rgba)
    rgb = image if image.mode == "RGB" else image.convert("RGB")  # convert() copies even RGB
    return np.array(rgb, dtype=np.uint8)  # a copy: Pillow's own array view is read-only


def _has_alpha(image: Image.Image) -> bool:
    return image.mode in ("RGBA", "LA", "PA") or "transparency" in image.info
