"""The fitted decision layer (`analysis.hairline.decision`) on hand-made evidence: what each
model's threshold decides, the band from the conformal quantile, and the file's round trip."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from analysis.hairline.decision import (
    NOTE_BALD,
    NOTE_UNSURE,
    Candidate,
    Decision,
    Evidence,
    LogisticModel,
    decide,
    fitted,
)
from analysis.types import Hairline


def _model(feature: str, threshold: float) -> LogisticModel:
    """p = sigmoid(value): a model whose probability the test sets through one feature."""
    return LogisticModel(
        features=(feature,),
        impute=np.array([0.0]),
        mean=np.array([0.0]),
        scale=np.array([1.0]),
        coef=np.array([1.0]),
        intercept=0.0,
        threshold=threshold,
    )


DECISION = Decision(
    bald=_model("bare", 0.9),
    trust=_model("agree", 0.8),
    band_quantile={"ok": 1.5, "uncertain": 2.0},
    band_floor_mm={"ok": 0.0, "uncertain": 3.0},
)


def _logit(p: float) -> float:
    return math.log(p / (1 - p))


def _traced(bald_p: float, trust_p: float, notes: tuple[str, ...] = (), band_mm: float = 2.0) -> Candidate:
    hairline = Hairline(status="uncertain", points=np.zeros((3, 2)), trichion=(10.0, 20.0), notes=notes)
    evidence = Evidence({"bare": _logit(bald_p)}, {"agree": _logit(trust_p)})
    return Candidate(hairline, evidence, band_mm)


@pytest.mark.parametrize(
    ("bald_p", "trust_p", "notes", "status", "band", "expected_notes"),
    [
        (0.1, 0.95, (), "ok", 3.0, ()),  # trusted: the band is base x 1.5
        (0.1, 0.95, ("a view disagrees",), "ok", 3.0, ()),  # doubts the model outweighed: not said
        (0.1, 0.5, (), "uncertain", 4.0, (NOTE_UNSURE,)),  # an uncertain answer says why
        (0.1, 0.5, ("a view disagrees",), "uncertain", 4.0, ("a view disagrees",)),
        (0.95, 0.95, ("a view disagrees",), "no_hairline", None, (NOTE_BALD,)),  # bald wins
    ],
)
def test_the_thresholds_decide_the_status_and_the_quantile_the_band(
    bald_p: float,
    trust_p: float,
    notes: tuple[str, ...],
    status: str,
    band: float | None,
    expected_notes: tuple[str, ...],
) -> None:
    answer = decide(_traced(bald_p, trust_p, notes), DECISION)
    assert (answer.status, answer.uncertainty_mm, answer.notes) == (status, band, expected_notes)
    assert (answer.trichion is None) == (status == "no_hairline")


def test_an_uncertain_band_keeps_its_floor() -> None:
    assert decide(_traced(0.1, 0.5, band_mm=0.5), DECISION).uncertainty_mm == 3.0


def test_a_missing_view_is_imputed_and_a_settled_answer_is_kept() -> None:
    no_view = Candidate(Hairline(status="uncertain", trichion=(1.0, 2.0)), Evidence({}, {}), 2.0)
    assert decide(no_view, DECISION).status == "uncertain"  # p = 0.5 on both: neither claim
    covered = Hairline(status="occluded", notes=("a cap",))
    settled = Candidate(covered, Evidence({"bare": _logit(0.99)}), settled=True)
    assert decide(settled, DECISION) is covered  # direct evidence of a covering is not outvoted


def test_the_shipped_file_round_trips_and_names_its_features() -> None:
    decision = fitted()
    again = Decision.from_json(json.loads(json.dumps(decision.to_json())))
    assert again.to_json() == decision.to_json()
    assert set(decision.bald.features) and set(decision.trust.features)
    with pytest.raises(ValueError, match="format"):
        Decision.from_json({**decision.to_json(), "format": 0})
