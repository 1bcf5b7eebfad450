"""The running estimate of a prompt's uncached tokens."""

from __future__ import annotations

import pytest

from budget import CacheEstimator


def test_prior_then_learns_from_observations() -> None:
    estimator = CacheEstimator(alpha=0.5, prior_hit_ratio=1.0)
    assert estimator.expected_uncached("w0", 1000, 600) == 400.0
    # The worker served only half of the predicted prefix: the ratio moves halfway to 0.5.
    estimator.observe("w0", 1000, 600, 300)
    assert estimator.expected_uncached("w0", 1000, 600) == pytest.approx(1000 - 600 * 0.75)
    # Another worker keeps its own estimate.
    assert estimator.expected_uncached("w1", 1000, 600) == 400.0


def test_outliers_are_clipped_and_bad_inputs_bounded() -> None:
    estimator = CacheEstimator(alpha=1.0, prior_hit_ratio=0.5)
    estimator.observe("w", 1000, 100, 900)  # more cached than predicted: ratio clipped to 1
    assert estimator.expected_uncached("w", 1000, 100) == 900.0
    assert estimator.expected_uncached("w", 100, 5000) == 0.0  # never below zero
    estimator.observe("w", 1000, 0, 0)  # nothing predicted: the ratio is not updated
    assert estimator.expected_uncached("w", 1000, 100) == 900.0


def test_stats_sum_tokens_per_worker() -> None:
    estimator = CacheEstimator()
    estimator.observe("b", 1000, 500, 400)
    estimator.observe("b", 1000, 500, 600)
    estimator.observe("a", 200, 0, 0)
    stats = estimator.stats()
    assert [s.worker for s in stats] == ["a", "b"]
    assert stats[1].share == 0.5
    assert stats[1].observations == 2


@pytest.mark.parametrize("kwargs", [{"alpha": 0.0}, {"alpha": 1.5}, {"prior_hit_ratio": 2.0}])
def test_invalid_settings(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="must be"):
        CacheEstimator(**kwargs)
