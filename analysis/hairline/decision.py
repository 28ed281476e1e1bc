"""The fitted decision layer: from the measured evidence of one answer to its status and band.

Tracing and measuring place the hairline and say what each view of it shows (`Evidence`);
whether to trust it is decided here, by parameters fitted on the labelled photos
(`scripts/eval_hairline.py --write`, `make fit`) and read from one versioned data file,
`analysis/data/hairline_decision.json`. No threshold below names a photo: the file holds
two logistic models and the quantiles of a split-conformal band, each fitted and scored
held out (docs/analysis_science.md § The decision).

- **Bald** (`no_hairline`): the probability that the top of the head is bare scalp, from the
  colour of the top of the head against the face's own skin, the share of it that colour
  explains, its texture against the cheeks' and the hair network's confidence there
  (`BALD_FEATURES`). Claimed only at or above the fitted threshold (no training photo with
  hair reached it, held out or in sample).
- **Trust** (`ok`): the probability that the trichion is within the label's tolerance (at
  least 3 mm). Tracing measures every feature of `TRUST_FEATURES`; the file names the few
  the model reads (today whether the mask edge, the image's crossing and the clear forehead
  agree, the pixel size, the views' disagreement and the plausibility gates failed: more
  features scored worse held out on 67 photos). `ok` at or above the fitted threshold,
  `uncertain` below.
- **Band**: `uncertainty_mm` is the position-and-scale term of the trace times the
  conformal quantile of |error| / that term for answers of the same status: it covers the
  truth on >= 90 % of held-out answers.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from functools import cache
from importlib import resources
from typing import Any

import numpy as np

from ..types import Hairline, HairlineStatus

DECISION_FILE = "hairline_decision.json"
FORMAT_VERSION = 1

# The evidence each model reads, in the file's order (`Evidence.bald` / `Evidence.trust`).
BALD_FEATURES = (
    "top_delta_e",  # ΔE of the top of the head's median colour from the cheeks
    "top_skin_fraction",  # share of the top of the head the skin colour explains
    "log_texture_ratio",  # high-pass of the skin-coloured top / the cheeks' (scalp ~ 1, strands > 1)
    "network_hair",  # the hair network's mean probability over the top of the head
)
TRUST_FEATURES = (
    "views_agree",  # mask edge, image crossing and clear forehead agree (`checks.weigh_edges`)
    "log_mm_per_px",
    "spread_mm",  # raggedness of the midline edge
    "offset_mm",  # |image crossing - mask edge|
    "no_crossing",
    "sharpness",  # ΔE per working px at the crossing
    "contrast",  # ΔE between hair and skin at the crossing
    "ramp_mm",
    "split_mm",  # the window's halves disagree by
    "skin_into_mm",  # |the clear forehead's top - the mask edge|
    "third_colour",
    "low_contrast",
    "disagreement_mm",  # the views' disagreement that the trace's band already holds
    "gate_notes",  # plausibility gates failed (ratio, < 40 mm, flooded band, small face)
    "fringe",
    "top_cut",
)

NOTE_UNSURE = "发际线位置的证据不足以给出确定结果（各项检查的综合判断），位置不确定"
NOTE_BALD = "头顶以皮肤为主，未见前额发际线（光头或剃发）；如有浅色或花白头发，请在光线充足处重拍"


@dataclass(frozen=True)
class Evidence:
    """The measured features of one answer; NaN where a view is missing (imputed by the model)."""

    bald: Mapping[str, float]
    trust: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Candidate:
    """What tracing found before the decision: the answer it would give, its evidence, and
    the position-and-scale term of its band (mm; None without a number)."""

    hairline: Hairline
    evidence: Evidence
    base_band_mm: float | None = None
    # a status decided by direct evidence of a covering or of nothing to judge (a cap, a
    # fringe to the brows, no head outline): the models do not override it
    settled: bool = False


@dataclass(frozen=True)
class LogisticModel:
    """A fitted logistic model over named features: NaN imputed, standardised, then linear."""

    features: tuple[str, ...]
    impute: np.ndarray
    mean: np.ndarray
    scale: np.ndarray
    coef: np.ndarray
    intercept: float
    threshold: float

    def probability(self, values: Mapping[str, float]) -> float:
        x = np.array([values.get(name, math.nan) for name in self.features], dtype=np.float64)
        x = np.where(np.isnan(x), self.impute, x)
        z = float(((x - self.mean) / self.scale) @ self.coef + self.intercept)
        return 1.0 / (1.0 + math.exp(-max(-500.0, min(500.0, z))))

    def says_yes(self, values: Mapping[str, float]) -> bool:
        return self.probability(values) >= self.threshold

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> LogisticModel:
        return cls(
            features=tuple(data["features"]),
            impute=np.asarray(data["impute"], np.float64),
            mean=np.asarray(data["mean"], np.float64),
            scale=np.asarray(data["scale"], np.float64),
            coef=np.asarray(data["coef"], np.float64),
            intercept=float(data["intercept"]),
            threshold=float(data["threshold"]),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "features": list(self.features),
            "impute": _rounded(self.impute),
            "mean": _rounded(self.mean),
            "scale": _rounded(self.scale),
            "coef": _rounded(self.coef),
            "intercept": round(self.intercept, 6),
            "threshold": round(self.threshold, 6),
        }


@dataclass(frozen=True)
class Decision:
    """The fitted parameters: the two models and the band's quantile per status."""

    bald: LogisticModel
    trust: LogisticModel
    band_quantile: Mapping[str, float]  # status -> quantile of |error| / base band
    band_floor_mm: Mapping[str, float]  # status -> the smallest band it claims
    fitted_on: str = ""  # what the file was fitted on (the eval script's summary)

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT_VERSION,
            "fitted_on": self.fitted_on,
            "bald": self.bald.to_json(),
            "trust": self.trust.to_json(),
            "band_quantile": {key: round(value, 4) for key, value in self.band_quantile.items()},
            "band_floor_mm": {key: round(value, 4) for key, value in self.band_floor_mm.items()},
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Decision:
        if data.get("format") != FORMAT_VERSION:
            raise ValueError(f"{DECISION_FILE}: format {data.get('format')!r}, expected {FORMAT_VERSION}")
        return cls(
            bald=LogisticModel.from_json(data["bald"]),
            trust=LogisticModel.from_json(data["trust"]),
            band_quantile=dict(data["band_quantile"]),
            band_floor_mm=dict(data["band_floor_mm"]),
            fitted_on=str(data.get("fitted_on", "")),
        )


def _rounded(values: np.ndarray) -> list[float]:
    return [round(float(value), 6) for value in values]


@cache
def fitted() -> Decision:
    """The shipped parameters (`analysis/data/hairline_decision.json`)."""
    text = resources.files("analysis.data").joinpath(DECISION_FILE).read_text(encoding="utf-8")
    return Decision.from_json(json.loads(text))


def decide(candidate: Candidate, decision: Decision | None = None) -> Hairline:
    """The answer: bald when the bald model says so (unless a covering or nothing to judge
    was seen directly); a traced hairline `ok` or `uncertain` by the trust model, its band
    from the conformal quantile; anything else as tracing left it."""
    decision = decision or fitted()
    found = candidate.hairline
    if candidate.settled:
        return found
    if decision.bald.says_yes(candidate.evidence.bald):
        return Hairline(status="no_hairline", notes=(NOTE_BALD,))
    if found.trichion is None or candidate.base_band_mm is None:
        return found
    trusted = decision.trust.says_yes(candidate.evidence.trust)
    status: HairlineStatus = "ok" if trusted else "uncertain"
    band = max(candidate.base_band_mm * decision.band_quantile[status], decision.band_floor_mm[status])
    # the trace's notes are its doubts; where the model trusts the answer they are outweighed,
    # and an `ok` that says "position uncertain" would contradict itself
    notes = () if trusted else (found.notes or (NOTE_UNSURE,))
    return replace(found, status=status, uncertainty_mm=round(band, 1), notes=notes)
