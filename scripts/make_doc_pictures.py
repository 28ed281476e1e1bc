#!/usr/bin/env python
"""The before/after pictures of docs/generation.md, from licence-clear photos only.

    .venv/bin/python scripts/make_doc_pictures.py [--out docs/images]

The photos are the two real faces shipped inside installed packages: scikit-image's
astronaut (Eileen Collins, NASA, public domain) and matplotlib's `grace_hopper.jpg`. No
picture derived from a press photo may be committed (docs/analysis_models.md), so the
labelled photos of `../shared/photos` are never used here. Each picture runs the real
endpoints in-process (`run_endpoint`, the default models, no ComfyUI): `mark` with
`drop_mm` gives the marked line and the built-in preview; `measure` gives the face box the
head is cropped to. Written per photo and drop: `preview_<photo>_<drop>mm.jpg`, three
panels side by side: the photo, the marked line, the preview. A photo without a hairline to
lower (`occluded`, `no_hairline`: `mark` refuses `drop_mm`, nothing is grown) gets
`measure_<photo>.jpg` instead: the photo and what `measure` draws, whole.
"""

from __future__ import annotations

import argparse
import base64
import io
import sys
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib import cbook
from PIL import Image
from skimage import data

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from analysis.endpoints import run_endpoint
from analysis.models import load_models
from shared.options import parse_options
from shared.settings import AnalysisSettings

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "docs" / "images"
DROPS_MM = (4, 8)
PANEL_HEIGHT = 300  # px of each picture: the heads are ~150 px tall in the photos, shown 2x
QUALITY = 90


def photos() -> dict[str, np.ndarray]:
    with Image.open(cbook.get_sample_data("grace_hopper.jpg", asfileobj=False)) as picture:
        grace_hopper = np.asarray(picture.convert("RGB"))
    return {"astronaut": data.astronaut(), "grace_hopper": grace_hopper}


def png_upload(rgb: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(rgb).save(buffer, format="PNG")
    return buffer.getvalue()


def decoded(encoded: str) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(base64.b64decode(encoded))).convert("RGB"))


def head_box(measured: dict[str, Any], shape: tuple[int, ...]) -> tuple[int, int, int, int]:
    """left, top, right, bottom: the face box widened to the whole head (hair above, brows below)."""
    x, y, width, height = measured["face"]["bbox"]
    left, right = max(0, x - width // 3), min(shape[1], x + width + width // 3)
    top, bottom = max(0, y - int(0.6 * height)), min(shape[0], y + int(0.45 * height))
    return left, top, right, bottom


def picture(panels: list[np.ndarray], box: tuple[int, int, int, int]) -> Image.Image:
    left, top, right, bottom = box
    strip = np.concatenate([panel[top:bottom, left:right] for panel in panels], axis=1)
    image = Image.fromarray(strip)
    scale = PANEL_HEIGHT / image.height
    return image.resize((round(image.width * scale), PANEL_HEIGHT), Image.Resampling.LANCZOS)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    limits = AnalysisSettings()
    models = load_models("", "cpu")
    try:
        for name, rgb in photos().items():
            upload = png_upload(rgb)
            measured = run_endpoint("measure", upload, parse_options("measure", {}), models, limits)
            box = head_box(measured, rgb.shape)
            status = measured["hairline"]["status"]
            if status not in ("ok", "uncertain"):
                path = args.out / f"measure_{name}.jpg"  # whole and at full size: its legend names the status
                Image.fromarray(np.concatenate([rgb, decoded(measured["annotated_image_base64"])], axis=1)).save(
                    path, quality=QUALITY
                )
                print(f"{path} (segmenter {measured['segmenter']}, hairline {status}: nothing to grow)")
                continue
            for drop in DROPS_MM:
                marked = run_endpoint("mark", upload, parse_options("mark", {"drop_mm": str(drop)}), models, limits)
                if marked["grown_image_base64"] is None:
                    print(f"{name}: {drop} mm: no preview ({measured['hairline']['status']})")
                    continue
                panels = [rgb, decoded(marked["marked_image_base64"]), decoded(marked["grown_image_base64"])]
                path = args.out / f"preview_{name}_{drop}mm.jpg"
                picture(panels, box).save(path, quality=QUALITY)
                print(f"{path} (segmenter {measured['segmenter']}, hairline {measured['hairline']['status']})")
    finally:
        models.close()


if __name__ == "__main__":
    main()
