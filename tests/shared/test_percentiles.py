"""The one percentile definition of `/admin/stats` and the benchmarks: nearest rank."""

from __future__ import annotations

import math

import pytest

from shared.percentiles import percentile, percentiles


def test_one_slow_sample_among_ten_is_the_p99_and_p95() -> None:
    samples = [30.0] * 9 + [600.0]
    assert percentiles(samples, 0.5, 0.95, 0.99, 1.0) == [30.0, 600.0, 600.0, 600.0]


@pytest.mark.parametrize(("fraction", "expected"), [(0.0, 1), (0.01, 1), (0.5, 50), (0.95, 95), (0.99, 99), (1.0, 100)])
def test_nearest_rank_of_one_to_a_hundred(fraction: float, expected: int) -> None:
    assert percentile(range(1, 101), fraction) == expected


def test_floating_point_products_do_not_push_the_rank_up() -> None:
    assert percentile(range(1, 21), 0.95) == 19  # 0.95 * 20 is 19.000000000000004


def test_no_sample_is_nan_and_a_bad_fraction_is_refused() -> None:
    assert math.isnan(percentile([], 0.5))
    with pytest.raises(ValueError):
        percentile([1.0], 99)
