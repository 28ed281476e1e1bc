"""Robustness copies (issue 27): each labelled photo with its hair recoloured light (blonde,
white) through the hair network's own mask, and with its top cropped just above the hair
(`copies`). A copy changes nothing about where the hairline is, so it must not turn a true
`ok`/`uncertain` into a claim of baldness or of a hat, and any number it states must hold
by the rule of the labelled photos (an `ok` within max(3 mm, the label's tolerance), an
`uncertain` band covering its miss: `copies.problems`). A cheap subset runs by default, the
rest with -m slow; scripts/sweep_copies.py measures other dyes and crop margins.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from analysis.face.calibration import calibrate
from analysis.face.landmarks import FaceMeshDetector
from analysis.hairline.frontal import trace_hairline
from analysis.segmentation.hairnet import HairNetSegmenter

from .copies import copy_of, problems
from .images import load_photo
from .test_real_photos import _labels

COPIES = ("blonde", "white", "top cropped")
DEFAULT_RUN = {
    "obama.jpg",
    "lacamoire.jpg",  # blonde: the dye's rim under the paint, a third colour (`edge_profile`)
    "biden2.jpg",
    "deepface_img1.jpg",
    "openface_adams.jpg",
    "willis_white.png",
}


# measured, not wished away (docs/analysis_science.md § Known limits): black hair dyed
# white reads as a bare scalp to the fitted bald model (skin-coloured, smooth at the working
# scale, the network unsure); fitting on white copies too made every bald head's threshold
# stricter
KNOWN_COPY_MISSES = {
    ("deepface_img1.jpg", "white"): "black hair dyed white is called a bare scalp by the fitted bald model",
}


def _cases() -> list[Any]:
    cases = []
    # named photos only: the whole set and its copies are judged held out (test_heldout.py)
    for entry in _labels():
        if entry["file"] not in (*DEFAULT_RUN, "deepface_img7.jpg"):
            continue
        for copy in COPIES:
            marks = [] if entry["file"] in DEFAULT_RUN else [pytest.mark.slow]
            if (entry["file"], copy) in KNOWN_COPY_MISSES:
                marks.append(pytest.mark.xfail(strict=True, reason=KNOWN_COPY_MISSES[entry["file"], copy]))
            cases.append(pytest.param(entry, copy, id=f"{entry['file']}-{copy}", marks=marks))
        if entry["file"] == "deepface_img7.jpg":
            # the naive dye (scripts/sweep_copies.py): the paint's sharp edge lies 2.5 mm above
            # the fine brown hairs the mask left out, where the new mask and the forehead's skin
            # both end; snapped to, it was `ok` 4.5 mm off (two views outvote it: `weigh_edges`)
            cases.append(
                pytest.param(
                    entry, "whole-mask white", id="deepface_img7.jpg-whole-mask white", marks=[pytest.mark.slow]
                )
            )
    return cases


@pytest.mark.parametrize("label, copy", _cases())
def test_a_copy_makes_no_false_claim(
    label: dict[str, Any], copy: str, photos_dir: Path, detector: FaceMeshDetector, hairnet: HairNetSegmenter
) -> None:
    rgb = load_photo(photos_dir, label["file"])
    face = detector.detect(rgb)
    segmentation = hairnet.segment(rgb, face)
    original = trace_hairline(rgb, face, segmentation, calibrate(face))
    edited, rows_cut = copy_of(rgb, face, segmentation, copy)
    edited_face = detector.detect(edited)
    calibration = calibrate(edited_face)
    hairline = trace_hairline(edited, edited_face, hairnet.segment(edited, edited_face), calibration)
    assert not problems(label, original, hairline, calibration.mm_per_px, rows_cut)
