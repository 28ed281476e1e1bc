"""Fixtures shared by the analysis tests: real faces, one detector and one segmenter, the
labelled photos."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
from matplotlib import cbook
from PIL import Image
from skimage import data

from analysis.face.calibration import calibrate
from analysis.face.landmarks import FaceMeshDetector
from analysis.segmentation.fallback import FallbackSegmenter
from analysis.segmentation.hairnet import HairNetSegmenter
from analysis.types import Calibration, Face
from shared.settings import AnalysisSettings

from .images import fringe_lifted, no_face_photo, rotated, side_by_side

# Beside the checkout (/work/shared/photos for /work/main; ../shared in CI); never in the repo.
PHOTOS_DIR = Path(__file__).resolve().parents[2] / ".." / "shared" / "photos"
# the hairline painted on the astronaut (`astronaut_lifted`): 10 px above her landmark 10
ASTRONAUT_LIFTED_ROW = 61.7
# Endpoint 99's points (contract.md): what the analysis answers and what the gateway serves.
SPECIAL_POINT_NAMES = frozenset(
    {
        "trichion",
        "glabella",
        "nasion",
        "subnasale",
        "menton",
        "left_temple",
        "right_temple",
        "left_iris_center",
        "right_iris_center",
    }
)


def _read_only(rgb: np.ndarray) -> np.ndarray:
    # Session-wide images: a test that writes into one would corrupt every later test.
    rgb = np.ascontiguousarray(rgb, dtype=np.uint8)
    rgb.setflags(write=False)
    return rgb


@pytest.fixture(scope="session")
def astronaut() -> np.ndarray:
    """Eileen Collins, 512×512 RGB: frontal, yaw ≈ −1°, pitch ≈ +2°, roll ≈ −3°, iris ≈ 8 px."""
    return _read_only(data.astronaut())


@pytest.fixture(scope="session")
def grace_hopper() -> np.ndarray:
    """Grace Hopper, 600×512 (H×W) RGB, from matplotlib's sample data: frontal, iris ≈ 16 px."""
    with Image.open(cbook.get_sample_data("grace_hopper.jpg", asfileobj=False)) as picture:
        return _read_only(np.asarray(picture.convert("RGB")))


@pytest.fixture(scope="session")
def detector() -> Iterator[FaceMeshDetector]:
    """One MediaPipe detector for the whole session (building one costs ~0.5 s)."""
    mesh = FaceMeshDetector()
    yield mesh
    mesh.close()


@pytest.fixture(scope="session")
def segmenter() -> Iterator[FallbackSegmenter]:
    """One fallback segmenter for the whole session (deterministic: GrabCut is reseeded)."""
    fallback = FallbackSegmenter()
    yield fallback
    fallback.close()


@pytest.fixture(scope="session")
def hairnet() -> Iterator[HairNetSegmenter]:
    """The default segmenter (the hair network, on the CPU here), one for the session."""
    network = HairNetSegmenter("cpu")
    yield network
    network.close()


@pytest.fixture(scope="session")
def face(detector: FaceMeshDetector, astronaut: np.ndarray) -> Face:
    """The astronaut's landmarks: the face the design and drawing tests draw on."""
    return detector.detect(astronaut)


@pytest.fixture(scope="session")
def astronaut_lifted(astronaut: np.ndarray, face: Face, segmenter: FallbackSegmenter) -> np.ndarray:
    """The astronaut with her fringe brushed back (`fringe_lifted`): a straight hairline at
    `ASTRONAUT_LIFTED_ROW`, 10 px above landmark 10 (a forehead of ~48 mm). Her own photo is
    `occluded`, her fringe covering her forehead; this is the shipped face with a hairline."""
    hair = cv2.dilate(segmenter.segment(astronaut, face).hair.astype(np.uint8), np.ones((5, 5), np.uint8)) > 0
    return _read_only(fringe_lifted(astronaut, hair, face.points, ASTRONAUT_LIFTED_ROW))


@pytest.fixture(scope="session")
def calibration(face: Face) -> Calibration:
    """The astronaut's iris calibration."""
    return calibrate(face)


@pytest.fixture
def limits() -> AnalysisSettings:
    """The default input and pose limits."""
    return AnalysisSettings()


@pytest.fixture(scope="session")
def two_faces(grace_hopper: np.ndarray) -> np.ndarray:
    """Grace Hopper twice, side by side (600×1024)."""
    return _read_only(side_by_side(grace_hopper, grace_hopper))


@pytest.fixture(scope="session")
def no_face() -> np.ndarray:
    """A real photo with no face in it (coffee cup, 400×600)."""
    return _read_only(no_face_photo())


@pytest.fixture(scope="session")
def astronaut_rolled_30(astronaut: np.ndarray) -> np.ndarray:
    """The astronaut turned 30° counter-clockwise in the image plane (roll ≈ +27°)."""
    return _read_only(rotated(astronaut, 30))


@pytest.fixture(scope="session")
def photos_dir() -> Path:
    """The labelled real photos; the test is skipped, saying where it looked, when absent."""
    if not (PHOTOS_DIR / "labels.json").is_file():
        pytest.skip(
            f"SKIPPED: labelled photos not found at {PHOTOS_DIR.resolve()} "
            "(expected ../shared/photos beside the checkout)"
        )
    return PHOTOS_DIR


@pytest.fixture(scope="session")
def photo_labels(photos_dir: Path) -> list[dict[str, Any]]:
    """labels.json: one entry per photo (file, kind, trichion_row, tolerance_px, ...)."""
    return json.loads((photos_dir / "labels.json").read_text())


# labels.json's first entries: the set the per-photo tests of landmarks, pose and preview
# were written on (issue 27). The photos added after it (issue 38: refusals, bald, covered
# and receding heads) are judged as a whole by the held-out report (test_heldout.py).
FIRST_SET_SIZE = 34


@pytest.fixture(scope="session")
def first_set_labels(photo_labels: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return photo_labels[:FIRST_SET_SIZE]
