#!/usr/bin/env python
"""The robustness copies (issue 27) beyond the tests: how much the answers depend on how a copy is made.

    .venv/bin/python scripts/sweep_copies.py [--photos ../shared/photos] [--only NAME ...]
        [--dyes skin-kept,whole-mask,probability] [--margins 0,0.005,0.01,0.02]

Each labelled photo recoloured blonde and white by each dye, and cropped above its hair at
each margin (share of the photo's height left), judged by the rule of
tests/analysis/test_copies.py (`copies.problems`). The dyes:
- `skin-kept`: the tests' own (`copies.recoloured`): the skin inside the mask keeps its colour;
- `whole-mask`: the whole mask painted, the skin it holds included (the naive recolouring);
- `probability`: the hair network's probability as the paint's opacity.
Painting skin moves the hairline the copy was meant to keep where the mask holds skin
(a sparse tuft or forelock): those copies' "misses" are the copy's, not the analysis's
(docs/analysis_science.md § Robustness copies). One line per copy, then the tally.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for tests.analysis

from analysis.face.calibration import calibrate
from analysis.face.landmarks import FaceMeshDetector
from analysis.hairline.frontal import trace_hairline
from analysis.segmentation.hairnet import HairNetSegmenter
from tests.analysis.copies import DYES, copy_of, problems
from tests.analysis.images import load_photo

DEFAULT_PHOTOS = Path(__file__).resolve().parents[1] / ".." / "shared" / "photos"
COLOURS = ("blonde", "white")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--photos", type=Path, default=DEFAULT_PHOTOS)
    parser.add_argument("--only", nargs="*", default=None, help="photo file names (default: all labelled)")
    parser.add_argument("--dyes", default=",".join(DYES))
    parser.add_argument("--margins", default="0,0.005,0.01,0.02")
    args = parser.parse_args()
    dyes = [dye for dye in args.dyes.split(",") if dye]
    margins = [float(margin) for margin in args.margins.split(",") if margin]
    detector, network = FaceMeshDetector(), HairNetSegmenter("cpu")
    tally: Counter[tuple[str, str]] = Counter()
    print(f"{'photo':30} {'copy':22} {'photo says':11} {'copy says':11} {'err mm':>6} {'±mm':>5}  problems")
    for label in json.loads((args.photos / "labels.json").read_text()):
        if args.only and label["file"] not in args.only:
            continue
        rgb = load_photo(args.photos, label["file"])
        face = detector.detect(rgb)
        segmentation = network.segment(rgb, face)
        original = trace_hairline(rgb, face, segmentation, calibrate(face))
        names = [f"{dye} {colour}" for dye in dyes for colour in COLOURS]
        names += [f"top cropped {margin:g}" for margin in margins]
        for name in names:
            copy, rows_cut = copy_of(rgb, face, segmentation, name)
            copy_face = detector.detect(copy)
            calibration = calibrate(copy_face)
            answer = trace_hairline(copy, copy_face, network.segment(copy, copy_face), calibration)
            found = problems(label, original, answer, calibration.mm_per_px, rows_cut)
            tally[(name.rpartition(" ")[0], "problem" if found else "holds")] += 1
            print(
                f"{label['file']:30} {name:22} {original.status:11} {answer.status:11} "
                f"{_error_mm(label, answer.trichion, rows_cut, calibration.mm_per_px):>6} "
                f"{'' if answer.uncertainty_mm is None else f'{answer.uncertainty_mm:.1f}':>5}  {'; '.join(found)}"
            )
    print("\ncopies that hold / with a problem:")
    for kind in dict.fromkeys(kind for kind, _ in tally):
        print(f"  {kind:12} {tally[(kind, 'holds')]:4} / {tally[(kind, 'problem')]}")


def _error_mm(label: dict, trichion: tuple[float, float] | None, rows_cut: int, mm_per_px: float) -> str:
    """Signed: + is below the label."""
    if trichion is None or label["kind"] != "hairline":
        return ""
    return f"{(trichion[1] + rows_cut - label['trichion_row']) * mm_per_px:+.1f}"


if __name__ == "__main__":
    main()
