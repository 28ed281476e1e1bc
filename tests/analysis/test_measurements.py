"""measure_face: the contract's `measurements`/`assessment` objects from landmarks and a hairline."""

from __future__ import annotations

import numpy as np
import pytest

from analysis.face.calibration import calibrate
from analysis.face.landmarks import FaceMeshDetector
from analysis.frame import FaceFrame
from analysis.hairline.checks import NOTE_FRINGE
from analysis.hairline.measurements import NOTE_GENDER, measure_face
from analysis.types import Face, Hairline
from shared.settings import AnalysisSettings

MEASUREMENT_KEYS = {
    "forehead_height_mm",
    "upper_third_mm",
    "middle_third_mm",
    "lower_third_mm",
    "thirds_ratio",
    "hairline_width_mm",
    "temple_recession_mm",
}


@pytest.fixture(scope="module")
def grace_face(grace_hopper: np.ndarray, detector: FaceMeshDetector) -> Face:
    return detector.detect(grace_hopper)


def hairline_at(
    face: Face, forehead_mm: float, temple_rise_mm: float = 0.0, status: str = "ok", **extra: object
) -> Hairline:
    """A hairline whose trichion sits `forehead_mm` above the glabella along the midline."""
    frame = FaceFrame.from_face(face)
    mm = calibrate(face).mm_per_px
    canthal = frame.to_frame(face.points[[33, 263]])[:, 0]
    trichion, left, right = frame.to_image(
        [
            [0.0, forehead_mm / mm],
            [canthal[0], (forehead_mm + temple_rise_mm) / mm],
            [canthal[1], (forehead_mm + temple_rise_mm) / mm],
        ]
    )
    points = np.stack([left, trichion, right])
    return Hairline(
        status=status,
        points=points,
        trichion=tuple(trichion),
        shape="straight",
        uncertainty_mm=extra.pop("uncertainty_mm", 2.0),
        left_temple=tuple(left),
        right_temple=tuple(right),
        **extra,
    )  # type: ignore[arg-type]


def test_no_hairline_nulls_exactly_what_the_contract_says(grace_face: Face) -> None:
    result = measure_face(
        grace_face, Hairline(status="no_hairline", notes=("bald",)), calibrate(grace_face), "male", AnalysisSettings()
    )
    measurements = result["measurements"]
    assert set(measurements) == MEASUREMENT_KEYS
    assert {key for key, value in measurements.items() if value is None} == MEASUREMENT_KEYS - {
        "middle_third_mm",
        "lower_third_mm",
    }
    assert 40 < measurements["middle_third_mm"] < 80 and 40 < measurements["lower_third_mm"] < 90
    assert result["assessment"]["forehead"] is None
    assert "bald" in result["assessment"]["notes"]


def test_forehead_and_thirds_follow_the_trichion(grace_face: Face) -> None:
    result = measure_face(
        grace_face,
        hairline_at(grace_face, 60.0, temple_rise_mm=8.0),
        calibrate(grace_face),
        "female",
        AnalysisSettings(),
    )
    m = result["measurements"]
    assert m["forehead_height_mm"] == pytest.approx(60.0, abs=0.1) and m["upper_third_mm"] == m["forehead_height_mm"]
    assert sum(m["thirds_ratio"]) == pytest.approx(1.0, abs=0.02)
    assert m["thirds_ratio"][0] == pytest.approx(60.0 / (60.0 + m["middle_third_mm"] + m["lower_third_mm"]), abs=0.01)
    assert m["temple_recession_mm"]["left"] == pytest.approx(8.0, abs=0.1) and m["temple_recession_mm"][
        "right"
    ] == pytest.approx(8.0, abs=0.1)
    assert 60 < m["hairline_width_mm"] < 110
    assert result["assessment"]["forehead"] == "normal"


@pytest.mark.parametrize(
    ("forehead_mm", "gender", "expected"),
    [
        (45, "female", "low"),
        (60, "female", "normal"),
        (70, "female", "high"),
        (50, "male", "low"),
        (70, "male", "normal"),
        (85, "male", "high"),
        (60, "unknown", "normal"),
        (90, "unknown", "high"),
        (45, "unknown", "low"),
    ],
)
def test_reference_ranges(grace_face: Face, forehead_mm: float, gender: str, expected: str) -> None:
    result = measure_face(
        grace_face, hairline_at(grace_face, forehead_mm), calibrate(grace_face), gender, AnalysisSettings()
    )  # type: ignore[arg-type]
    assert result["assessment"]["forehead"] == expected


def test_unknown_gender_where_the_ranges_disagree_gives_no_verdict_and_says_why(grace_face: Face) -> None:
    result = measure_face(
        grace_face, hairline_at(grace_face, 70.0), calibrate(grace_face), "unknown", AnalysisSettings()
    )
    assert result["assessment"]["forehead"] is None
    assert NOTE_GENDER in result["assessment"]["notes"]


def test_an_uncertain_band_across_two_classes_gives_no_verdict(grace_face: Face) -> None:
    hairline = hairline_at(grace_face, 63.0, status="uncertain", uncertainty_mm=6.0, notes=("soft edge",))
    result = measure_face(grace_face, hairline, calibrate(grace_face), "female", AnalysisSettings())
    assert result["measurements"]["forehead_height_mm"] == pytest.approx(63.0, abs=0.1)
    assert result["assessment"]["forehead"] is None


def test_a_fringe_edge_is_measured_but_never_classed(grace_face: Face) -> None:
    hairline = hairline_at(grace_face, 30.0, status="uncertain", uncertainty_mm=1.0, notes=(NOTE_FRINGE,))
    result = measure_face(grace_face, hairline, calibrate(grace_face), "female", AnalysisSettings())
    assert result["measurements"]["forehead_height_mm"] is not None
    assert result["assessment"]["forehead"] is None


def test_small_iris_is_reported(astronaut: np.ndarray, detector: FaceMeshDetector) -> None:
    face = detector.detect(astronaut)  # iris ~8 px
    result = measure_face(face, Hairline(status="no_hairline"), calibrate(face), "female", AnalysisSettings())
    assert any("虹膜" in note for note in result["assessment"]["notes"])
