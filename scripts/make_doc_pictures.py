#!/usr/bin/env python
"""The before/after pictures of docs/generation.md: licence-clear ones to commit, dev-photo crops to look at.

    .venv/bin/python scripts/make_doc_pictures.py [--out docs/images] [--photos ../shared/photos]
        [--crops docs/pictures]

The photos are the two real faces shipped inside installed packages: scikit-image's
astronaut (Eileen Collins, NASA, public domain) and matplotlib's `grace_hopper.jpg`. No
picture derived from a press photo may be committed (docs/analysis_models.md), so the
labelled photos of `../shared/photos` are never used here. Each picture runs the real
endpoints in-process (`run_endpoint`, the default models, no ComfyUI): `mark` with
`drop_mm` gives the marked line and the built-in preview; `measure` gives the face box the
head is cropped to. Written per photo and drop: `preview_<photo>_<drop>mm.jpg`, three
panels side by side: the photo, the marked line, the preview. A photo without a hairline to
lower (`occluded`, `no_hairline`: `mark` refuses `drop_mm`, nothing is grown) gets instead
`measure_<photo>.jpg`, the photo and what `measure` draws, whole, and
`mark_points_<photo>.jpg`: the photo and `mark` with `hairline_points`, a line a client
might draw (`client_line`: `BELOW_FRINGE_MM` under the lowest hair above the brows, from
brow end to brow end), beside the preview where one is grown.

Beside the texture table (issue 27), where `--photos` exists: per labelled photo whose shown
plan (`bench_preview.shown_plan`) lowers the line, `<photo>.jpg` in `--crops`, the hairline
region (the band and the hair above it) before | after, at least `CROP_HEIGHT` px tall.
They derive from press photos: `docs/pictures/` is git-ignored (its own `.gitignore`), the
pictures are remade on any checkout beside `../shared/photos`, never committed.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib import cbook
from PIL import Image
from skimage import data

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from analysis.drawing.preview import grown_edge
from analysis.endpoints import analyse, run_endpoint
from analysis.models import Models, load_models
from analysis.types import LandmarkId
from scripts.bench_preview import DEFAULT_PHOTOS, grown_photos
from shared.contract.bodies import parse_options
from shared.settings import AnalysisSettings

DOCS = Path(__file__).resolve().parents[1] / "docs"
DEFAULT_OUT = DOCS / "images"
DEFAULT_CROPS = DOCS / "pictures"
CROP_HEIGHT = 240  # px of a crop pair: a band of a few mm at 2-10 px per mm, enlarged to be seen
CROP_QUALITY = 85
BELOW_FRINGE_MM = 3.0  # the client's line: just under the fringe, on the forehead it hides nothing of
CLIENT_LINE_POINTS = 9
HALF_WIDTH_MM, ABOVE_MM, BELOW_MM = 22.0, 8.0, 5.0  # the crop: the deepest drop, the hair lent, the new edge
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


def client_line(rgb: np.ndarray, models: Models, limits: AnalysisSettings) -> list[list[float]]:
    """A line a client might draw where the hairline is hidden: from brow end to brow end,
    `BELOW_FRINGE_MM` under the hair's lower edge (per column the lowest hair pixel above the
    brows, a parabola through them to smooth its strands), never below the brows."""
    found = analyse(rgb, models, limits)
    brows = found.face.points[[*LandmarkId.LEFT_BROW_UPPER, *LandmarkId.RIGHT_BROW_UPPER]]
    brows = brows[np.argsort(brows[:, 0])]
    xs = np.linspace(brows[0, 0], brows[-1, 0], CLIENT_LINE_POINTS)
    brow_ys = np.interp(xs, brows[:, 0], brows[:, 1])
    hair = found.segmentation.hair & found.segmentation.person
    edge = [
        (x, rows.max())
        for x, y in zip(xs, brow_ys, strict=True)
        if (rows := np.nonzero(hair[: int(y), round(x)])[0]).size
    ]
    assert len(edge) >= 3, "no hair above the brows to draw a line under"
    columns, rows_at_edge = np.asarray(edge, dtype=float).T
    fitted = np.polyval(np.polyfit(columns, rows_at_edge, 2), xs)
    ys = np.minimum(fitted + BELOW_FRINGE_MM / found.calibration.mm_per_px, brow_ys - 1.0)
    return [[round(float(x), 1), round(float(y), 1)] for x, y in zip(xs, ys, strict=True)]


def picture(panels: list[np.ndarray], box: tuple[int, int, int, int], height: int = PANEL_HEIGHT) -> Image.Image:
    left, top, right, bottom = box
    strip = np.concatenate([panel[top:bottom, left:right] for panel in panels], axis=1)
    image = Image.fromarray(strip)
    scale = height / image.height
    return image.resize((round(image.width * scale), height), Image.Resampling.LANCZOS)


def crop_box(old: np.ndarray, edge: np.ndarray, px_per_mm: float, shape: tuple[int, ...]) -> tuple[int, int, int, int]:
    """left, top, right, bottom: `HALF_WIDTH_MM` either side of the deepest drop, from
    `ABOVE_MM` above the old line (the hair lent) to `BELOW_MM` below the new edge."""
    old, edge = old[np.argsort(old[:, 0])], edge[np.argsort(edge[:, 0])]
    drop = edge[:, 1] - np.interp(edge[:, 0], old[:, 0], old[:, 1])
    centre = float(edge[int(np.argmax(drop)), 0])
    left, right = centre - HALF_WIDTH_MM * px_per_mm, centre + HALF_WIDTH_MM * px_per_mm
    inside = (edge[:, 0] >= left) & (edge[:, 0] <= right)
    top = float(np.interp(edge[inside, 0], old[:, 0], old[:, 1]).min()) - ABOVE_MM * px_per_mm
    bottom = float(edge[inside, 1].max()) + BELOW_MM * px_per_mm
    return max(0, int(left)), max(0, int(top)), min(shape[1], int(right) + 1), min(shape[0], int(bottom) + 1)


def hairline_crops(photos: Path, out: Path) -> None:
    """`<photo>.jpg`: the hairline region before | after, for each photo whose shown plan grows."""
    out.mkdir(parents=True, exist_ok=True)
    for photo in grown_photos(photos):
        plan, grown = photo.shown()
        name = Path(photo.label["file"]).stem
        if grown is None or not plan.drop_mm:
            print(f"{name}: no crop ({plan.name} drops {plan.drop_mm or 0.0:.1f} mm, preview {grown is not None})")
            continue
        found = photo.found
        edge = grown_edge(found.face, found.hairline, plan, found.calibration)
        assert edge is not None and found.hairline.points is not None  # a grown preview has both
        box = crop_box(np.asarray(found.hairline.points), edge, 1.0 / found.calibration.mm_per_px, photo.rgb.shape)
        path = out / f"{name}.jpg"
        picture([photo.rgb, grown], box, CROP_HEIGHT).save(path, quality=CROP_QUALITY)
        print(f"{path} ({plan.name}, drop {plan.drop_mm:.1f} mm)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--photos", type=Path, default=DEFAULT_PHOTOS)
    parser.add_argument("--crops", type=Path, default=DEFAULT_CROPS)
    args = parser.parse_args()
    if (args.photos / "labels.json").is_file():
        hairline_crops(args.photos, args.crops)
    else:
        print(f"{args.photos}: no labelled photos, no hairline crops")
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
                points = json.dumps(client_line(rgb, models, limits))
                marked = run_endpoint(
                    "mark", upload, parse_options("mark", {"hairline_points": points}), models, limits
                )
                grown = marked["grown_image_base64"]
                panels = [rgb, decoded(marked["marked_image_base64"])] + ([] if grown is None else [decoded(grown)])
                path = args.out / f"mark_points_{name}.jpg"
                picture(panels, box).save(path, quality=QUALITY)
                print(f"{path} (hairline_points {points}, preview {grown is not None})")
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
