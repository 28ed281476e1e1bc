#!/usr/bin/env python
"""The hairline analysis judged held out: 5-fold cross-validation of the fitted decision layer.

    .venv/bin/python scripts/eval_hairline.py [--photos ../shared/photos] [--no-copies]
        [--write] [--cache var/eval_hairline.pkl] [--per-photo]

Every labelled photo (`labels.json`) and its copies (mirrored, 0.5x, 1.5x, JPEG q40, hair
recoloured blonde through the network's own mask, top cropped above the hair; and, as covered
hairlines, the hairline under a flat beige or blue scarf) is traced once
up to its candidate answer (`analysis.endpoints.trace`: refusals, segmentation, tracing,
the evidence). The photos are split into 5 folds stratified by kind (hairline,
no_hairline, occluded, rejected), each photo's copies in its own fold; the decision layer
(`analysis.hairline.decision`) is fitted on four folds and scores the fifth. Printed per
fold, pooled held out, and in sample (fitted on all): confident wrong numbers, false
claims, bald heads `no_hairline`, covered hairlines with a number, the `ok` share of
hairlines, band coverage, the error of `ok` answers, refusals.

`--write` fits on every photo and writes `analysis/data/hairline_decision.json` (`make
fit`); the same photos give the same file. Needs scikit-learn (the test extra).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import pickle
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cv2
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # for tests.analysis (the copies and the photo loader)

from analysis.endpoints import pose_widening_mm, trace  # noqa: E402
from analysis.errors import AnalysisError  # noqa: E402
from analysis.hairline.decision import (  # noqa: E402
    BALD_FEATURES,
    DECISION_FILE,
    Candidate,
    Decision,
    LogisticModel,
    decide,
)
from analysis.models import Models, load_models  # noqa: E402
from shared.contract import ContractError  # noqa: E402
from shared.settings import AnalysisSettings  # noqa: E402

DEFAULT_PHOTOS = ROOT / ".." / "shared" / "photos"
DECISION_PATH = ROOT / "analysis" / "data" / DECISION_FILE
FOLDS = 5
SEED = 0
OK_WITHIN_MM = 3.0  # an `ok` trichion is within max(3 mm, the label's tolerance) (analysis.md)
BAND_COVERAGE = 0.90  # the conformal band's target coverage
OK_PRECISION = 0.99  # `ok` where held-out answers like it are within tolerance this often
# The logistic models' regularisation (scikit-learn's C). Trust: strong, for ~50 photos and
# overlapping classes (0.1 and above put wrong answers higher in the held-out ranking).
# Bald: weak: four features on classes the texture and the network separate; chosen by
# grouped inner cross-validation of the log loss within the training folds (10 in four of
# five folds and on all photos; at 0.03 the blonde copy of a short cut outranked every bald
# head's copy and the bald share held out was 84 %, at 10 it is 93 % with no false claim).
TRUST_REGULARISATION = 0.03
BALD_REGULARISATION = 10.0
# The trust model reads four of the evidence's features: the views' agreement, the pixel
# size, the disagreement the band holds and the failed gates. Chosen held out: with all 16
# (`decision.TRUST_FEATURES`) the out-of-fold ranking put its first wrong answer after 109
# right ones, with these four after 118 (and its second after 137, not 111).
TRUST_MODEL_FEATURES = ("views_agree", "log_mm_per_px", "disagreement_mm", "gate_notes")
COPIES = ("mirrored", "0.5x", "1.5x", "jpeg q40", "blonde", "top cropped", "beige scarf", "blue scarf", "turned")
# A photo turned 180° is refused as upside down (1008), or as no face where the mesh does not
# find one that way up (1005): either tells the user what to do.
TURNED_CODES = (1008, 1005)
UPSIDE_DOWN = "倒置"  # the pose refusal's word for an upside-down face
KINDS = ("hairline", "no_hairline", "occluded", "rejected")


@dataclass
class Answer:
    """One traced image (a photo or a copy of it) and what scoring needs of it."""

    photo: str
    copy: str  # "" for the photo itself
    kind: str
    truth_row: float | None  # the trichion row in this image's pixels
    tolerance_px: float | None
    expect_codes: tuple[int, ...]  # the refusals that answer it right (none: it is measured)
    refused: int | None = None  # the refusal's code
    refusal: str = ""
    mm_per_px: float = math.nan
    candidate: Candidate | None = None
    trichion_row: float | None = None  # the candidate's trichion in this image's pixels
    pose_extra_mm: float = 0.0  # what a pose past its limit adds to the band

    @property
    def tolerance_mm(self) -> float:
        return OK_WITHIN_MM if self.tolerance_px is None else max(OK_WITHIN_MM, self.tolerance_px * self.mm_per_px)

    @property
    def error_mm(self) -> float | None:
        if self.truth_row is None or self.trichion_row is None:
            return None
        return abs(self.trichion_row - self.truth_row) * self.mm_per_px


@dataclass
class Outcome:
    """An answer as the decision layer gives it."""

    answer: Answer
    status: str  # a hairline status, or "refused"
    band_mm: float | None = None

    @property
    def number(self) -> bool:
        return self.status in ("ok", "uncertain") and self.answer.trichion_row is not None


def load_labels(photos: Path) -> list[dict[str, Any]]:
    return json.loads((photos / "labels.json").read_text())


def copies_of(rgb: np.ndarray, traced: Any, label: dict[str, Any]) -> Iterable[tuple[str, np.ndarray, float, float]]:
    """(name, image, row scale, rows cut) of each copy that keeps the hairline where it is."""
    from tests.analysis.copies import cropped_above_hair, recoloured

    yield "mirrored", np.ascontiguousarray(rgb[:, ::-1]), 1.0, 0.0
    for factor in (0.5, 1.5):
        size = (round(rgb.shape[1] * factor), round(rgb.shape[0] * factor))
        yield f"{factor}x", cv2.resize(rgb, size, interpolation=cv2.INTER_AREA), factor, 0.0
    _, encoded = cv2.imencode(".jpg", rgb[..., ::-1], [cv2.IMWRITE_JPEG_QUALITY, 40])
    yield "jpeg q40", np.ascontiguousarray(cv2.imdecode(encoded, cv2.IMREAD_COLOR)[..., ::-1]), 1.0, 0.0
    if traced is None:
        return
    hair = traced.turn.segmentation_back(traced.segmentation).hair
    if hair.any():
        yield "blonde", recoloured(rgb, hair, traced.found.face, "blonde"), 1.0, 0.0
        cropped, cut = cropped_above_hair(rgb, hair)
        if cut > 0:
            yield "top cropped", cropped, 1.0, float(cut)


def covered_copies(rgb: np.ndarray, traced: Any) -> Iterable[tuple[str, np.ndarray]]:
    """A hairline photo's hairline covered by a flat scarf, beige and blue (`copies.scarved`):
    answers that may give no number and may not call the head bald."""
    from tests.analysis.copies import SCARF_RGB, scarved

    hair = traced.turn.segmentation_back(traced.segmentation).hair
    if hair.any():
        for colour in SCARF_RGB:
            yield f"{colour} scarf", scarved(rgb, hair, traced.found.face, colour)


def trace_answer(
    rgb: np.ndarray, models: Models, label: dict[str, Any], copy: str, scale: float, cut: float
) -> tuple[Answer, Any]:
    limits = AnalysisSettings()
    row = label.get("trichion_row")
    tolerance = label.get("tolerance_px")
    answer = Answer(
        photo=label["file"],
        copy=copy,
        kind=label["kind"],
        truth_row=None if row is None else row * scale - cut,
        tolerance_px=None if tolerance is None else tolerance * scale,
        expect_codes=tuple(label.get("expect_codes", [label["expect_code"]] if "expect_code" in label else [])),
    )
    try:
        traced = trace(rgb, models, limits)
    except AnalysisError as error:
        refused = ContractError.refusing(error.kind, error.message)
        answer.refused, answer.refusal = int(refused.code), str(refused)
        return answer, None
    answer.mm_per_px = traced.calibration.mm_per_px
    answer.candidate = traced.candidate
    back = traced.turn.hairline_back(traced.candidate.hairline)
    if back.trichion is not None:
        answer.trichion_row = float(back.trichion[1])
        answer.pose_extra_mm = pose_widening_mm(back, traced.found, traced.calibration, limits)
    return answer, traced


def extract(
    photos: Path, with_copies: bool, log: Callable[[str], None] = print, bisenet: Path | None = None
) -> list[Answer]:
    from analysis.face.landmarks import FaceMeshDetector
    from analysis.segmentation.hairnet import HairNetSegmenter
    from tests.analysis.images import load_photo

    # never the fallback in place of a network that did not load: that would be another report
    models = load_models(str(bisenet), "cpu") if bisenet else Models(FaceMeshDetector(), HairNetSegmenter("cpu"), "cpu")
    answers: list[Answer] = []
    try:
        for label in load_labels(photos):
            rgb = load_photo(photos, label["file"])
            answer, traced = trace_answer(rgb, models, label, "", 1.0, 0.0)
            answers.append(answer)
            if with_copies and label["kind"] != "rejected":
                for name, image, scale, cut in copies_of(rgb, traced, label):
                    answers.append(trace_answer(image, models, label, name, scale, cut)[0])
                turned = {**label, "kind": "rejected", "expect_codes": TURNED_CODES, "trichion_row": None}
                upside_down = np.ascontiguousarray(rgb[::-1, ::-1])
                answers.append(trace_answer(upside_down, models, turned, "turned", 1.0, 0.0)[0])
            if with_copies and label["kind"] == "hairline" and traced is not None:
                covered = {**label, "kind": "occluded", "trichion_row": None, "tolerance_px": None}
                for name, image in covered_copies(rgb, traced):
                    answers.append(trace_answer(image, models, covered, name, 1.0, 0.0)[0])
            log(f"traced {label['file']}")
    finally:
        models.close()
    return answers


# ---------------------------------------------------------------------------------------
# fitting


def _matrix(rows: Sequence[dict[str, float]], features: Sequence[str]) -> np.ndarray:
    return np.array([[row.get(name, math.nan) for name in features] for row in rows], dtype=np.float64)


def fit_logistic(
    rows: Sequence[dict[str, float]],
    labels: Sequence[bool],
    features: Sequence[str],
    groups: Sequence[str],
    precision: float,
    regularisation: float,
) -> LogisticModel:
    """A logistic model and its threshold, read off out-of-fold probabilities within the
    training photos (grouped by photo). `precision` 1: above every negative, held out or in
    the final model (a claim no training photo contradicted: `no_hairline`); below 1: the
    lowest threshold at which that share of the held-out answers above it are right (`ok`,
    analysis.md: "within 3 mm at least 99 % of the time")."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import StratifiedGroupKFold

    x = _matrix(rows, features)
    y = np.asarray(labels, dtype=bool)
    # a missing view (no network: the fallback segmenter; no crossing) is imputed by the
    # training mean: standardised to 0, it moves the probability neither way
    impute = np.nanmean(np.where(np.isfinite(x), x, np.nan), axis=0)
    impute = np.where(np.isnan(impute), 0.0, impute)
    filled = np.where(np.isnan(x), impute, x)
    mean = filled.mean(axis=0)
    scale = filled.std(axis=0)
    scale = np.where(scale < 1e-9, 1.0, scale)

    def model(train: np.ndarray) -> Any:
        fitted = LogisticRegression(C=regularisation, class_weight="balanced", max_iter=2000)
        return fitted.fit((filled[train] - mean) / scale, y[train])

    whole = model(np.ones(len(y), dtype=bool))
    oof = np.full(len(y), np.nan)
    photo_groups = np.asarray(groups)
    splits = min(FOLDS, len(set(photo_groups[y])), len(set(photo_groups[~y])))
    if splits >= 2:
        for train, test in StratifiedGroupKFold(splits, shuffle=True, random_state=SEED).split(filled, y, photo_groups):
            oof[test] = model(np.isin(np.arange(len(y)), train)).predict_proba((filled[test] - mean) / scale)[:, 1]
    else:
        oof = whole.predict_proba((filled - mean) / scale)[:, 1]
    if precision < 1.0:
        threshold = _precise_threshold(oof, y, precision)
    else:
        in_sample = whole.predict_proba((filled - mean) / scale)[:, 1]
        threshold = _strict_threshold(oof, y, in_sample)
    threshold = min(max(threshold, 0.5), 0.999)
    return LogisticModel(
        features=tuple(features),
        impute=impute,
        mean=mean,
        scale=scale,
        coef=whole.coef_[0].astype(np.float64),
        intercept=float(whole.intercept_[0]),
        threshold=threshold,
    )


def _strict_threshold(oof: np.ndarray, y: np.ndarray, in_sample: np.ndarray) -> float:
    """Above every negative held out (midway to the next positive: less tuned to the last
    negative) and every negative the final model scores (its probabilities are not the
    folds')."""
    negatives = oof[~y]
    threshold = float(negatives.max()) + 1e-6 if len(negatives) else 0.5
    positives_above = oof[y & (oof > threshold)]
    if len(positives_above):
        threshold = (threshold + float(positives_above.min())) / 2
    if (~y).any():
        threshold = max(threshold, float(in_sample[~y].max()) + 1e-6)
    return threshold


def _precise_threshold(oof: np.ndarray, y: np.ndarray, precision: float) -> float:
    """The lowest out-of-fold probability at which the answers at or above it are right at
    least `precision` of the time."""
    order = np.argsort(-oof)
    right_share = np.cumsum(y[order]) / np.arange(1, len(order) + 1)
    reaching = np.nonzero(right_share >= precision)[0]
    return float(oof[order][reaching.max()]) if len(reaching) else 1.0


def _conformal(scores: Sequence[float]) -> float:
    """The split-conformal quantile at BAND_COVERAGE: ceil((n+1)q)/n of the scores."""
    values = np.sort(np.asarray(scores, dtype=np.float64))
    if len(values) == 0:
        return 1.0
    rank = min(len(values), math.ceil((len(values) + 1) * BAND_COVERAGE))
    return float(values[rank - 1])


def is_covered_copy(answer: Answer) -> bool:
    """A scarf over the hairline (`covered_copies`): scored, never fitted on. Fitted on, the
    beige scarf, as smooth and skin-coloured as a scalp, drove the bald threshold above every
    bald head (bald held out 93 % -> 16 %): the evidence does not yet tell them apart."""
    return answer.copy.endswith("scarf")


def fit_decision(answers: Sequence[Answer], summary: str = "") -> Decision:
    answers = [a for a in answers if not is_covered_copy(a)]
    traced = [a for a in answers if a.candidate is not None and not a.candidate.settled]
    bald_rows = [a for a in traced if a.candidate is not None and a.candidate.evidence.bald]
    bald = fit_logistic(
        [dict(a.candidate.evidence.bald) for a in bald_rows if a.candidate],
        [a.kind == "no_hairline" for a in bald_rows],
        BALD_FEATURES,
        [a.photo for a in bald_rows],
        1.0,
        BALD_REGULARISATION,
    )
    numbered = [
        a
        for a in traced
        if a.kind == "hairline" and a.error_mm is not None and a.candidate and a.candidate.evidence.trust
    ]
    trust = fit_logistic(
        [dict(a.candidate.evidence.trust) for a in numbered if a.candidate],
        [(a.error_mm or 0.0) <= a.tolerance_mm for a in numbered],
        TRUST_MODEL_FEATURES,
        [a.photo for a in numbered],
        OK_PRECISION,
        TRUST_REGULARISATION,
    )
    scores: dict[str, list[float]] = {"ok": [], "uncertain": []}
    for a in numbered:
        assert a.candidate is not None and a.candidate.base_band_mm
        status = "ok" if trust.says_yes(a.candidate.evidence.trust) else "uncertain"
        scores[status].append((a.error_mm or 0.0) / max(a.candidate.base_band_mm, 1e-6))
    quantile = {status: max(1.0, _conformal(values)) for status, values in scores.items()}
    floor = {"ok": 0.0, "uncertain": OK_WITHIN_MM}
    return Decision(bald=bald, trust=trust, band_quantile=quantile, band_floor_mm=floor, fitted_on=summary)


# ---------------------------------------------------------------------------------------
# scoring


def outcome(answer: Answer, decision: Decision) -> Outcome:
    if answer.refused is not None or answer.candidate is None:
        return Outcome(answer, "refused")
    decided = decide(answer.candidate, decision)
    band = None if decided.uncertainty_mm is None else decided.uncertainty_mm + answer.pose_extra_mm
    return Outcome(answer, decided.status, band)


@dataclass
class Report:
    """The figures of analysis.md § Judged on photos it was never tuned on."""

    outcomes: list[Outcome] = field(default_factory=list)

    def of(self, kind: str) -> list[Outcome]:
        return [o for o in self.outcomes if o.answer.kind == kind]

    @property
    def confident_wrong(self) -> list[Outcome]:
        return [
            o
            for o in self.outcomes
            if o.status == "ok" and (o.answer.kind != "hairline" or (o.answer.error_mm or 0.0) > o.answer.tolerance_mm)
        ]

    @property
    def false_claims(self) -> list[Outcome]:
        return [
            o
            for o in self.outcomes
            if (o.status == "no_hairline" and o.answer.kind != "no_hairline")
            or (o.status == "occluded" and o.answer.kind in ("hairline", "no_hairline"))
        ]

    @property
    def covered_with_number(self) -> list[Outcome]:
        return [o for o in self.of("occluded") if o.number]

    @property
    def bald_share(self) -> float:
        bald = self.of("no_hairline")
        return sum(o.status == "no_hairline" for o in bald) / max(1, len(bald))

    @property
    def ok_share(self) -> float:
        hairlines = self.of("hairline")
        return sum(o.status == "ok" for o in hairlines) / max(1, len(hairlines))

    @property
    def band_misses(self) -> list[Outcome]:
        return [
            o
            for o in self.of("hairline")
            if o.number and (o.answer.error_mm or 0.0) > max(o.band_mm or 0.0, o.answer.tolerance_mm)
        ]

    @property
    def band_coverage(self) -> float:
        numbered = [o for o in self.of("hairline") if o.number and o.answer.error_mm is not None]
        return 1.0 - len(self.band_misses) / max(1, len(numbered))

    @property
    def ok_errors(self) -> list[float]:
        return [o.answer.error_mm or 0.0 for o in self.of("hairline") if o.status == "ok"]

    @property
    def wrong_refusals(self) -> list[Outcome]:
        """A refusal photo not refused with its code, or an upright face called upside down."""
        wrong = [o for o in self.of("rejected") if o.answer.refused not in o.answer.expect_codes]
        return wrong + [o for o in self.outcomes if o.answer.kind != "rejected" and UPSIDE_DOWN in o.answer.refusal]

    def row(self, title: str) -> str:
        hairlines = self.of("hairline")
        errors = self.ok_errors
        return (
            f"{title:22} {len(self.outcomes):4} {len(self.confident_wrong):4} "
            f"{100 * len(self.confident_wrong) / max(1, len(hairlines)):5.1f}% {len(self.false_claims):4} "
            f"{100 * self.bald_share:5.0f}% {len(self.covered_with_number):4} {100 * self.ok_share:5.0f}% "
            f"{100 * self.band_coverage:5.0f}% {np.mean(errors) if errors else math.nan:5.2f} "
            f"{max(errors, default=math.nan):5.2f} {len(self.wrong_refusals):4}"
        )


HEADER = (
    f"{'':22} {'n':>4} {'wrong':>4} {'wrong%':>6} {'false':>4} {'bald':>6} {'cover':>4} {'ok':>6} "
    f"{'band':>6} {'mean':>5} {'max':>5} {'refus':>4}\n"
    "(wrong: `ok` outside max(3 mm, tolerance); false: no_hairline/occluded claimed wrongly; bald: "
    "bald heads no_hairline; cover: covered hairlines with a number; ok: share of hairlines; band: "
    "coverage; mean/max: error of `ok` answers, mm; refus: refusals with a wrong code or upright "
    "faces called upside down)"
)


def copies_report(report: Report) -> Report:
    """The copies that keep the hairline in view (the scarves are reported on their own)."""
    return Report([o for o in report.outcomes if o.answer.copy and not is_covered_copy(o.answer)])


def folds_of(answers: Sequence[Answer]) -> dict[str, int]:
    """Photo -> fold: 5 folds stratified by kind, seeded."""
    from sklearn.model_selection import StratifiedKFold

    photos = sorted({(a.photo, a.kind) for a in answers if not a.copy})  # a photo's own kind: a copy's may differ
    kinds = [kind for _, kind in photos]
    splits = min(FOLDS, min(kinds.count(kind) for kind in set(kinds)))
    fold_of = {}
    for index, (_, test) in enumerate(StratifiedKFold(splits, shuffle=True, random_state=SEED).split(photos, kinds)):
        for position in test:
            fold_of[photos[position][0]] = index
    return fold_of


@dataclass
class Evaluation:
    folds: list[Report]
    held_out: Report
    in_sample: Report
    decision: Decision


def evaluate(answers: Sequence[Answer]) -> Evaluation:
    fold_of = folds_of(answers)
    folds = []
    held_out = Report()
    for fold in sorted(set(fold_of.values())):
        train = [a for a in answers if fold_of[a.photo] != fold]
        test = [a for a in answers if fold_of[a.photo] == fold]
        decision = fit_decision(train)
        report = Report([outcome(a, decision) for a in test])
        folds.append(report)
        held_out.outcomes += report.outcomes
    decision = fit_decision(answers, summary=_summary(answers))
    in_sample = Report([outcome(a, decision) for a in answers])
    return Evaluation(folds, held_out, in_sample, decision)


def _summary(answers: Sequence[Answer]) -> str:
    photos = {a.photo for a in answers}
    return f"{len(photos)} labelled photos, {len(answers)} answers (photos and copies); scripts/eval_hairline.py"


def print_report(evaluation: Evaluation, per_photo: bool) -> None:
    print(HEADER)
    for index, report in enumerate(evaluation.folds):
        print(report.row(f"fold {index + 1} held out"))
    print(evaluation.held_out.row("pooled held out"))
    print(evaluation.in_sample.row("in sample"))
    originals = Report([o for o in evaluation.held_out.outcomes if not o.answer.copy])
    print(originals.row("held out, photos only"))
    copies = copies_report(evaluation.held_out)
    if copies.outcomes:
        print(copies.row("held out, copies only"))
    covered = Report([o for o in evaluation.held_out.outcomes if is_covered_copy(o.answer)])
    if covered.outcomes:
        print(covered.row("scarves (not fitted)"))
    problems = (
        [("confident wrong", o) for o in evaluation.held_out.confident_wrong]
        + [("false claim", o) for o in evaluation.held_out.false_claims]
        + [("covered, a number", o) for o in evaluation.held_out.covered_with_number]
        + [("band misses", o) for o in evaluation.held_out.band_misses]
        + [("refusal", o) for o in evaluation.held_out.wrong_refusals]
        + [("bald not called bald", o) for o in evaluation.held_out.of("no_hairline") if o.status != "no_hairline"]
    )
    print("\nheld-out problems:")
    for what, o in problems:
        error = o.answer.error_mm
        print(
            f"  {what:20} {o.answer.photo:28} {o.answer.copy or '(photo)':12} {o.status:11} "
            f"err {'-' if error is None else f'{error:.1f}'} band {o.band_mm} {o.answer.refusal[:50]}"
        )
    if per_photo:
        print("\nper photo (held out):")
        for o in evaluation.held_out.outcomes:
            error = o.answer.error_mm
            print(
                f"  {o.answer.photo:28} {o.answer.copy or '(photo)':12} {o.answer.kind:11} {o.status:11} "
                f"err {'-' if error is None else f'{error:5.1f}'} band {o.band_mm}"
            )


def _code_hash() -> str:
    """What the cached tracing depends on: the analysis' code (not the decision's file)."""
    digest = hashlib.sha256()
    for path in sorted((ROOT / "analysis").rglob("*.py")):
        if path.name != "decision.py":
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def cache_key(photos: Path, with_copies: bool, bisenet: Path | None) -> tuple[Any, ...]:
    """What the traced answers depend on: the code, the segmenter, the photos and their labels."""
    segmenter = str(bisenet.resolve()) if bisenet else "hair network"
    labels = (photos / "labels.json").read_bytes()
    return (_code_hash(), segmenter, str(photos.resolve()), with_copies and COPIES, labels)


def cached_answers(photos: Path, with_copies: bool, cache: Path | None, bisenet: Path | None = None) -> list[Answer]:
    key = cache_key(photos, with_copies, bisenet)
    if cache is not None and cache.is_file():
        stored_key, answers = pickle.loads(cache.read_bytes())
        if stored_key == key:
            return answers
    answers = extract(photos, with_copies, log=lambda line: print(line, file=sys.stderr), bisenet=bisenet)
    if cache is not None:
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_bytes(pickle.dumps((key, answers)))
    return answers


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--photos", type=Path, default=DEFAULT_PHOTOS)
    parser.add_argument("--no-copies", action="store_true", help="the photos alone (faster)")
    parser.add_argument("--write", action="store_true", help=f"fit on every photo and write {DECISION_PATH.name}")
    parser.add_argument("--cache", type=Path, help="default: var/eval_hairline.pkl (var/eval_hairline_bisenet.pkl)")
    parser.add_argument("--per-photo", action="store_true")
    parser.add_argument(
        "--bisenet",
        type=Path,
        help="face-parsing weights (79999_iter.pth): BiSeNet as the segmenter instead of the hair network, "
        "as evidence only (docs/analysis_science.md § BiSeNet measured)",
    )
    args = parser.parse_args(argv)
    if args.write and args.bisenet:
        parser.error("--write fits the shipped file, which is the hair network's: not with --bisenet")
    cache = args.cache or ROOT / "var" / ("eval_hairline_bisenet.pkl" if args.bisenet else "eval_hairline.pkl")
    answers = cached_answers(args.photos, not args.no_copies, cache, args.bisenet)
    evaluation = evaluate(answers)
    print_report(evaluation, args.per_photo)
    if args.write:
        text = json.dumps(evaluation.decision.to_json(), indent=1, ensure_ascii=False) + "\n"
        DECISION_PATH.write_text(text, encoding="utf-8")
        print(f"\nwrote {DECISION_PATH.relative_to(ROOT)} ({len(text.encode())} bytes)")


if __name__ == "__main__":
    main()
