#!/usr/bin/env python
"""The built-in growth preview: time per plan at 1 MP, its texture against the hair, before/after pictures.

    .venv/bin/python scripts/bench_preview.py [--runs 5] [--photos ../shared/photos] [--pictures /tmp/previews]
    .venv/bin/python scripts/bench_preview.py --texture [--photos ../shared/photos]

Each labelled photo with a hairline is resized to 1 MP and analysed once (fallback
segmenter); then, per plan, the median over `--runs` of `grow_preview` alone and of
`grow_preview` + the PNG encoding the grow endpoint adds (issue 10 target: <= 300 ms at
1 MP on CPU, per plan). Bald photos are listed with the None they get. With
`--pictures`, writes one before/after JPEG per photo (the `standard` plan, or the
`aggressive` one where `standard` drops nothing), cropped to the head, at the photo's
own size, to look at locally: they derive from press photos and must never be committed
(the pictures of docs/generation.md come from scripts/make_doc_pictures.py).

With `--texture`, the table of docs/generation.md § The preview's texture, measured
(issue 27): each labelled photo with a hairline through the real analysis (`analyse`: the
hair network, the photo as given), its `shown_plan` grown, and `preview_texture.band_texture`
of the band (high-frequency energy, lightness spread, new edge sharpness against the
hair above and the old edge), as Markdown rows; then the worst ratios over every plan
that drops > 0, against the targets (>= 0.7, <= 1.5), and the range of the spread.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cv2
import numpy as np
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for tests.analysis.images

from analysis.drawing import designs, render
from analysis.drawing.preview import grow_preview
from analysis.drawing.preview_texture import band_texture
from analysis.endpoints import Analysis, analyse
from analysis.face.calibration import calibrate
from analysis.face.landmarks import FaceMeshDetector
from analysis.hairline.frontal import trace_hairline
from analysis.models import CPU, load_models
from analysis.segmentation.fallback import FallbackSegmenter
from analysis.types import PLANS
from scripts.bench_analysis import median_ms
from shared.settings import AnalysisSettings
from tests.analysis.images import load_photo

DEFAULT_PHOTOS = Path(__file__).resolve().parents[1] / ".." / "shared" / "photos"
MEGAPIXEL = 1_000_000
PICTURE_WIDTH = 640  # px of one before/after pair


def at_one_megapixel(rgb: np.ndarray) -> np.ndarray:
    scale = (MEGAPIXEL / (rgb.shape[0] * rgb.shape[1])) ** 0.5
    return cv2.resize(rgb, None, fx=scale, fy=scale, interpolation=cv2.INTER_AREA if scale < 1 else cv2.INTER_CUBIC)


HF_TARGET, EDGE_TARGET = 0.7, 1.5  # analysis.md § Rendering


def shown_plan(plans: list[designs.Design]) -> designs.Design:
    """The plan a photo's preview is shown and measured with: `standard`, or `aggressive`
    where `standard` lowers nothing."""
    by_name = {plan.name: plan for plan in plans}
    return by_name["aggressive"] if not by_name["standard"].drop_mm else by_name["standard"]


@dataclass(frozen=True)
class Grown:
    """One labelled photo through the real analysis, with every plan and its preview."""

    label: dict[str, Any]
    rgb: np.ndarray
    found: Analysis
    plans: list[tuple[designs.Design, np.ndarray | None]]  # each plan and its preview (None: nothing to grow)

    def shown(self) -> tuple[designs.Design, np.ndarray | None]:
        chosen = shown_plan([plan for plan, _ in self.plans])
        return next(pair for pair in self.plans if pair[0] is chosen)


def grown_photos(photos: Path) -> Iterator[Grown]:
    """The labelled photos with a hairline, analysed as `measure` does (default segmenter, CPU)."""
    labels = json.loads((photos / "labels.json").read_text())
    models, limits = load_models("", CPU), AnalysisSettings()
    try:
        for label in labels:
            if label["kind"] != "hairline":
                continue
            rgb = load_photo(photos, label["file"])
            found = analyse(rgb, models, limits)
            plans = designs.plan_designs(list(PLANS), found.face, found.hairline, found.calibration, "unknown")
            grown = [
                (plan, grow_preview(rgb, found.face, found.hairline, found.segmentation, plan, found.calibration))
                for plan in plans
            ]
            yield Grown(label, rgb, found, grown)
    finally:
        models.close()


def texture_table(photos: Path) -> None:
    print("| photo | plan | drop mm | HF energy | L spread | edge sharpness |")
    print("|---|---|---|---|---|---|")
    worst_hf, worst_edge = (float("inf"), ""), (0.0, "")
    spreads: list[tuple[float, str]] = []
    for photo in grown_photos(photos):
        name = Path(photo.label["file"]).stem
        found = photo.found
        for plan, grown in photo.plans:
            if grown is None or not plan.drop_mm:
                continue
            measured = band_texture(photo.rgb, grown, found.face, found.hairline, plan, found.calibration)
            if measured is None:
                continue
            worst_hf = min(worst_hf, (measured.high_frequency_ratio, f"{name} {plan.name}"))
            worst_edge = max(worst_edge, (measured.edge_sharpness_ratio, f"{name} {plan.name}"))
            spreads.append((measured.lightness_spread_ratio, f"{name} {plan.name}"))
            if plan is photo.shown()[0]:
                print(
                    f"| {name} | {plan.name} | {plan.drop_mm:.1f} | {measured.high_frequency_ratio:.2f} | "
                    f"{measured.lightness_spread_ratio:.2f} | {measured.edge_sharpness_ratio:.2f} |"
                )
        shown, grown = photo.shown()
        if grown is None or not shown.drop_mm:
            drops = ", ".join(f"{plan.name} {plan.drop_mm or 0.0:.1f}" for plan, _ in photo.plans)
            why = "no preview" if grown is None else "nothing lowered"
            print(f"<!-- {name}: no band to measure ({drops} mm; {why}) -->")
    print(f"worst over every plan dropping > 0: HF {worst_hf[0]:.2f} ({worst_hf[1]}; target >= {HF_TARGET}),")
    print(f"edge {worst_edge[0]:.2f} ({worst_edge[1]}; target <= {EDGE_TARGET}),")
    if spreads:
        low, high = min(spreads), max(spreads)
        print(f"lightness spread {low[0]:.2f} ({low[1]}) to {high[0]:.2f} ({high[1]}) over {len(spreads)} plans")


def _grown(preview: np.ndarray | None) -> np.ndarray:
    """A preview the timing loop already saw grown (it skips the plans that get None)."""
    assert preview is not None, "grow_preview is a pure function: the same plan grows again"
    return preview


def before_after(rgb: np.ndarray, grown: np.ndarray, face, hairline) -> Image.Image:
    """The head, from above the hair to below the brows, before | after."""
    x, y, width, height = face.bbox
    top_y = int(min(y, min(point[1] for point in hairline.points)) - 0.35 * height)
    box = (
        max(0, x - width // 6),
        max(0, top_y),
        min(rgb.shape[1], x + width + width // 6),
        min(rgb.shape[0], y + int(0.45 * height)),
    )
    pair = np.concatenate([image[box[1] : box[3], box[0] : box[2]] for image in (rgb, grown)], axis=1)
    picture = Image.fromarray(pair)
    picture.thumbnail((PICTURE_WIDTH, PICTURE_WIDTH))
    return picture


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--photos", type=Path, default=DEFAULT_PHOTOS)
    parser.add_argument("--pictures", type=Path, help="write before/after JPEGs here")
    parser.add_argument("--texture", action="store_true", help="the texture table of docs/generation.md")
    args = parser.parse_args()
    if args.texture:
        texture_table(args.photos)
        return
    labels = json.loads((args.photos / "labels.json").read_text())
    detector, segmenter = FaceMeshDetector(), FallbackSegmenter()
    print(f"{'photo':18} {'size':>9} {'plan':12} {'drop mm':>7} {'preview ms':>10} {'+png ms':>8}")
    worst = 0.0
    for label in labels:
        original = load_photo(args.photos, label["file"])
        for rgb, timed in ((at_one_megapixel(original), True), (original, False)):
            face = detector.detect(rgb)
            calibration = calibrate(face)
            segmentation = segmenter.segment(rgb, face)
            hairline = trace_hairline(rgb, face, segmentation, calibration)
            plans = designs.plan_designs(list(PLANS), face, hairline, calibration, "unknown")

            def grow(plan: designs.Design) -> np.ndarray | None:
                return grow_preview(rgb, face, hairline, segmentation, plan, calibration)  # noqa: B023  only called in this iteration

            if timed:
                for plan in plans:
                    grown = grow(plan)
                    if grown is None:
                        print(f"{label['file']:18} {rgb.shape[1]:>4}x{rgb.shape[0]:<4} {plan.name:12} {'-':>7} None")
                        continue
                    alone = median_ms(lambda: grow(plan), args.runs)  # noqa: B023  timed here, in this iteration
                    encoded = median_ms(lambda: render.png_base64(_grown(grow(plan))), args.runs)  # noqa: B023  timed here
                    worst = max(worst, encoded)
                    print(
                        f"{label['file']:18} {rgb.shape[1]:>4}x{rgb.shape[0]:<4} {plan.name:12} "
                        f"{plan.drop_mm:7.1f} {alone:10.1f} {encoded:8.1f}"
                    )
            elif args.pictures and label["kind"] == "hairline":
                chosen = shown_plan(plans)
                grown = grow(chosen)
                if grown is None:
                    print(f"{label['file']}: no preview ({chosen.name}, drop {chosen.drop_mm:.1f} mm)")
                    continue
                args.pictures.mkdir(parents=True, exist_ok=True)
                path = args.pictures / f"preview_{Path(label['file']).stem}_{chosen.name}.jpg"
                before_after(rgb, grown, face, hairline).save(path, quality=85)
                print(f"wrote {path} ({chosen.name}, drop {chosen.drop_mm:.1f} mm)")
    print(f"worst preview + png per plan at 1 MP: {worst:.1f} ms (target <= 300 ms)")
    detector.close()
    segmenter.close()


if __name__ == "__main__":
    main()
