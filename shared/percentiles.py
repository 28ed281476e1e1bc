"""Percentiles of samples: one definition for `/admin/stats` and every `scripts/bench_*.py`.

Nearest rank, never interpolated: the p-th percentile is the smallest sample that at
least p % of the samples are at or below. It is always a real sample and never drops the
tail: the p99 of 10 samples is the largest of them (a rank that rounds down would call
one 600 ms request among nine of 30 ms "p99 = 30 ms").
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

_EPSILON = 1e-9  # 0.95 * 20 is 19.000000000000004 in binary floating point: still rank 19


def percentile(samples: Iterable[float], fraction: float) -> float:
    """The nearest-rank percentile (`fraction` in [0, 1]); NaN when there is no sample."""
    return percentiles(samples, fraction)[0]


def percentiles(samples: Iterable[float], *fractions: float) -> list[float]:
    """Several nearest-rank percentiles of `samples`, sorting them once."""
    ordered = sorted(samples)
    return [_at_rank(ordered, fraction) for fraction in fractions]


def _at_rank(ordered: Sequence[float], fraction: float) -> float:
    if not ordered:
        return math.nan
    if not 0 <= fraction <= 1:
        raise ValueError(f"a percentile's fraction lies in [0, 1], not {fraction}")
    rank = max(1, math.ceil(fraction * len(ordered) - _EPSILON))
    return ordered[rank - 1]
