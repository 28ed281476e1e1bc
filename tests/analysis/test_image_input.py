"""decode_image: every accepted format in, every hostile upload refused with the right code."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image, ImageOps, PngImagePlugin

from analysis.errors import AnalysisError
from analysis.image_input import check_image_size, decode_image
from shared.contract import RefusalKind
from shared.settings import AnalysisSettings

from .images import encode, huge_blank_png

EXIF_ORIENTATION = 0x0112
ROTATE_90_CLOCKWISE_TO_DISPLAY = 6


def refusal(data: bytes, limits: AnalysisSettings) -> AnalysisError:
    with pytest.raises(AnalysisError) as caught:
        decode_image(data, limits)
    return caught.value


@pytest.fixture
def portrait(astronaut: np.ndarray) -> np.ndarray:
    """Non-square (600×512 H×W), so that orientation mistakes change the shape."""
    return np.ascontiguousarray(np.concatenate([astronaut, astronaut[:88]], axis=0))


# ---- accepted formats --------------------------------------------------------------------


@pytest.mark.parametrize("format, options", [("PNG", {}), ("WEBP", {"lossless": True})])
def test_lossless_formats_decode_exactly(portrait, limits, format, options):
    decoded = decode_image(encode(portrait, format, **options), limits)
    assert decoded.dtype == np.uint8 and decoded.flags.c_contiguous and decoded.flags.writeable
    np.testing.assert_array_equal(decoded, portrait)


def test_jpeg_decodes_close_to_the_original(portrait, limits):
    decoded = decode_image(encode(portrait, "JPEG", quality=95), limits)
    assert decoded.shape == portrait.shape
    assert np.abs(decoded.astype(int) - portrait).mean() < 3


def test_exif_orientation_is_applied(portrait, limits):
    # Stored sideways (512 high, 600 wide) with "rotate 90° clockwise to display".
    stored = np.ascontiguousarray(np.rot90(portrait, k=1))
    exif = Image.Exif()
    exif[EXIF_ORIENTATION] = ROTATE_90_CLOCKWISE_TO_DISPLAY
    decoded = decode_image(encode(stored, "JPEG", quality=95, exif=exif.tobytes()), limits)
    assert decoded.shape == portrait.shape
    assert np.abs(decoded.astype(int) - portrait).mean() < 3


@pytest.mark.parametrize("mode", ["RGB", "L"])
@pytest.mark.parametrize("orientation", range(1, 9))
def test_jpeg_pixels_and_orientation_are_pillows(portrait, limits, mode, orientation):
    """JPEGs skip Pillow's decoder: the pixels and every EXIF orientation must still be
    exactly what Pillow (and so every image viewer) shows."""
    exif = Image.Exif()
    exif[EXIF_ORIENTATION] = orientation
    upload = encode(Image.fromarray(portrait).convert(mode), "JPEG", quality=90, exif=exif.tobytes())
    shown = ImageOps.exif_transpose(Image.open(io.BytesIO(upload))).convert("RGB")
    decoded = decode_image(upload, limits)
    assert decoded.flags.c_contiguous and decoded.flags.writeable  # measure draws on it
    np.testing.assert_array_equal(decoded, np.asarray(shown))


def test_cmyk_jpeg_becomes_rgb(limits):
    cmyk = Image.new("CMYK", (640, 480), (0, 255, 255, 0))  # pure red in CMYK
    decoded = decode_image(encode(cmyk, "JPEG", quality=95), limits)
    assert decoded.shape == (480, 640, 3)
    assert np.abs(decoded[240, 320].astype(int) - (255, 0, 0)).max() <= 3


@pytest.mark.parametrize("format, options", [("PNG", {}), ("WEBP", {"lossless": True})])
def test_transparency_is_composited_over_white(portrait, limits, format, options):
    rgba = np.dstack([portrait, np.full(portrait.shape[:2], 255, np.uint8)])
    rgba[:100, :, 3] = 0  # a transparent band over whatever colour lies beneath
    decoded = decode_image(encode(rgba, format, **options), limits)
    assert (decoded[:100] == 255).all()
    np.testing.assert_array_equal(decoded[100:], portrait[100:])


def test_palette_with_transparency_becomes_rgb(limits):
    palette = Image.new("P", (640, 480), 1)
    palette.putpalette([0, 0, 0, 10, 200, 30] + [0] * 762)
    palette.paste(0, (0, 0, 640, 100))
    decoded = decode_image(encode(palette, "PNG", transparency=0), limits)
    assert (decoded[:100] == 255).all()  # transparent index -> white
    assert tuple(decoded[300, 300]) == (10, 200, 30)


def test_sixteen_bit_gray_is_scaled_not_clipped(limits):
    ramp = np.linspace(0, 65535, 640).round().astype(np.uint16)
    sixteen = np.ascontiguousarray(np.broadcast_to(ramp, (480, 640)))
    decoded = decode_image(encode(Image.fromarray(sixteen), "PNG"), limits)
    assert decoded.shape == (480, 640, 3)
    expected = np.rint(ramp / 257).astype(np.uint8)
    np.testing.assert_array_equal(decoded[0, :, 0], expected)
    np.testing.assert_array_equal(decoded[..., 0], decoded[..., 2])


@pytest.mark.parametrize("mode", ["L", "LA", "1"])
def test_gray_modes_become_rgb(limits, mode):
    gray = Image.new(mode, (640, 480), 255 if mode != "LA" else (255, 255))
    decoded = decode_image(encode(gray, "PNG"), limits)
    assert decoded.shape == (480, 640, 3) and (decoded == 255).all()


# ---- 1003 / 1002 -------------------------------------------------------------------------


def test_too_many_bytes_is_1003_before_anything_else(limits):
    too_big = b"\0" * (limits.max_image_bytes + 1)  # not even an image: size is checked first
    error = refusal(too_big, limits)
    assert error.kind is RefusalKind.IMAGE_TOO_LARGE
    assert "15.0 MB" in error.message


@pytest.mark.parametrize("format", ["GIF", "BMP", "TIFF"])
def test_other_formats_are_1002(portrait, limits, format):
    error = refusal(encode(portrait, format), limits)
    assert error.kind is RefusalKind.UNSUPPORTED_IMAGE
    assert "JPEG" in error.message and "WebP" in error.message


@pytest.mark.parametrize(
    "data", [b"", b"not an image at all", b"\x89PNG\r\n\x1a\n"], ids=["empty", "text", "png-magic-only"]
)
def test_junk_is_1002(limits, data):
    assert refusal(data, limits).kind is RefusalKind.UNSUPPORTED_IMAGE


@pytest.mark.parametrize("format", ["JPEG", "PNG", "WEBP"])
def test_truncated_files_are_1002(portrait, limits, format):
    whole = encode(portrait, format)
    error = refusal(whole[: len(whole) * 2 // 3], limits)
    assert error.kind is RefusalKind.UNSUPPORTED_IMAGE
    assert "损坏" in error.message


# ---- 1004 --------------------------------------------------------------------------------


@pytest.fixture
def no_decoding(monkeypatch):
    """Fail the test if any PNG pixel data is decoded."""

    def refuse(self):
        raise AssertionError("pixels were decoded")

    monkeypatch.setattr(PngImagePlugin.PngImageFile, "load", refuse)


@pytest.fixture(scope="module")
def bomb_30000() -> bytes:
    return huge_blank_png(30000, 30000)


def test_decompression_bomb_is_1004_without_decoding(bomb_30000, limits, no_decoding):
    assert len(bomb_30000) < 200_000  # the point of a bomb: tiny file, 900 MP
    error = refusal(bomb_30000, limits)
    assert error.kind is RefusalKind.BAD_RESOLUTION
    assert "900 百万像素" in error.message


@pytest.mark.filterwarnings("ignore::PIL.Image.DecompressionBombWarning")  # as analysis.image_input does
@pytest.mark.parametrize("width, height", [(8000, 7000), (10000, 10000)])
def test_pixel_count_over_the_limit_is_1004_without_decoding(limits, no_decoding, width, height):
    # 56 MP passes Pillow's own guard and is stopped by ours; 100 MP trips Pillow's warning.
    error = refusal(huge_blank_png(width, height), limits)
    assert error.kind is RefusalKind.BAD_RESOLUTION
    assert f"{width * height / 1e6:.0f} 百万像素" in error.message


@pytest.mark.filterwarnings("error::PIL.Image.DecompressionBombWarning")
def test_pillow_bomb_warning_raised_as_error_is_still_1004(limits, no_decoding):
    assert refusal(huge_blank_png(10000, 10000), limits).kind is RefusalKind.BAD_RESOLUTION


def test_pixel_limit_comes_from_settings(no_decoding):
    error = refusal(huge_blank_png(2000, 1000), AnalysisSettings(max_image_megapixels=1.5))
    assert error.kind is RefusalKind.BAD_RESOLUTION
    assert "2000×1000" in error.message


def test_small_image_is_1004_with_both_numbers(limits, no_decoding):
    error = refusal(encode(np.zeros((300, 400, 3), np.uint8), "PNG"), limits)
    assert error.kind is RefusalKind.BAD_RESOLUTION
    assert error.message == "图片分辨率过低：最短边 300px，要求至少 480px"


def test_long_image_is_1004_without_decoding(limits, no_decoding):
    error = refusal(huge_blank_png(9000, 4000), limits)
    assert error.kind is RefusalKind.BAD_RESOLUTION
    assert "最长边 9000px" in error.message and "8192px" in error.message


@pytest.mark.parametrize(
    "width, height, accepted",
    [
        (480, 480, True),
        (479, 4096, False),
        (8192, 480, True),
        (8193, 1000, False),
        (640, 479, False),
        (4352, 2903, True),
        (3061, 4600, True),
        (8192, 6144, True),
    ],  # phone photos are normal input
)
def test_resolution_rule_edges(limits, width, height, accepted):
    if accepted:
        check_image_size(width, height, limits)
    else:
        with pytest.raises(AnalysisError) as caught:
            check_image_size(width, height, limits)
        assert caught.value.kind is RefusalKind.BAD_RESOLUTION
