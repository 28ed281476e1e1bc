"""The fallback segmenter on real faces: full-size masks, hair where hair is, determinism."""

from __future__ import annotations

import subprocess
import sys

import numpy as np

from analysis.face.landmarks import FaceMeshDetector
from analysis.segmentation.fallback import FallbackSegmenter


def test_astronaut_masks_are_full_size_and_find_her_hair(
    astronaut: np.ndarray, detector: FaceMeshDetector, segmenter: FallbackSegmenter
) -> None:
    face = detector.detect(astronaut)
    result = segmenter.segment(astronaut, face)
    assert result.segmenter == "fallback"
    assert result.hair.shape == result.person.shape == astronaut.shape[:2]
    assert result.hair.dtype == bool
    # crown of her head (row 40 on the midline) is hair; her cheeks and the sky are not
    assert result.hair[40, 226]
    for cheek in (50, 280):
        x, y = face.points[cheek].round().astype(int)
        assert not result.hair[y, x]
    assert not result.hair[20, 60]
    assert result.person[150, 226]


def test_same_photo_gives_the_identical_mask_twice(
    astronaut: np.ndarray, detector: FaceMeshDetector, segmenter: FallbackSegmenter
) -> None:
    face = detector.detect(astronaut)
    first = segmenter.segment(astronaut, face)
    second = FallbackSegmenter().segment(astronaut, face)
    assert np.array_equal(first.hair, second.hair)
    assert np.array_equal(first.person, second.person)


def test_importing_the_analysis_does_not_import_mediapipe() -> None:
    # the GPU host's web process imports these modules; only the model child may load mediapipe
    code = (
        "import sys, analysis.segmentation.fallback, analysis.hairline.frontal, analysis.hairline.measurements\n"
        "assert 'mediapipe' not in sys.modules and 'torch' not in sys.modules, sorted(sys.modules)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
