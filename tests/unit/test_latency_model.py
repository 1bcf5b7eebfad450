"""The stage latency models: priors, online refits, robustness to outliers."""

from __future__ import annotations

import random

import pytest

from budget.latency_model import LatencyModel, LinearPrior


def test_with_no_observations_the_prior_predicts() -> None:
    model = LatencyModel(LinearPrior(100.0, 2.0, 50.0))
    assert model.predict_ms(500) == pytest.approx(100 + 1000 + 50)
    assert model.observations == 0


def test_learns_intercept_and_slope_from_observations() -> None:
    # The machine is twice as slow per token as the prior says.
    model = LatencyModel(LinearPrior(100.0, 1.0, 0.0), quantile=0.9)
    rng = random.Random(0)
    for _ in range(128):
        work = rng.uniform(0, 1000)
        model.observe(work, 200.0 + 2.0 * work + rng.uniform(0, 40))
    state = model.state()
    assert state.slope_ms == pytest.approx(2.0, abs=0.05)
    assert state.intercept_ms == pytest.approx(220.0, abs=15)
    # The prediction is a high quantile: about 90% of fresh timings fall under it.
    fresh = [
        (w, 200.0 + 2.0 * w + rng.uniform(0, 40))
        for w in (rng.uniform(0, 1000) for _ in range(2000))
    ]
    under = sum(y <= model.predict_ms(w) for w, y in fresh) / len(fresh)
    assert 0.85 <= under <= 0.95


def test_outliers_do_not_move_the_fit() -> None:
    model = LatencyModel(LinearPrior(0.0, 1.0, 0.0), window=64)
    for i in range(64):
        work = float(i * 10)
        elapsed = 50.0 + 1.0 * work
        if i % 16 == 0:  # one in sixteen is a 10 s stall
            elapsed = 10_000.0
        model.observe(work, elapsed)
    state = model.state()
    assert state.slope_ms == pytest.approx(1.0, abs=0.05)
    assert state.intercept_ms == pytest.approx(50.0, abs=5)
    assert model.predict_ms(300) < 500


def test_blends_with_the_prior_until_enough_observations() -> None:
    model = LatencyModel(LinearPrior(1000.0, 0.0, 0.0), min_observations=8)
    for _ in range(4):
        model.observe(0.0, 0.0)
    assert model.predict_ms(0) == pytest.approx(500.0)
    for _ in range(4):
        model.observe(0.0, 0.0)
    assert model.predict_ms(0) == pytest.approx(0.0)


def test_follows_drift_over_its_window() -> None:
    model = LatencyModel(LinearPrior(10.0, 0.0, 0.0), window=32)
    for _ in range(32):
        model.observe(1.0, 10.0)
    for _ in range(32):
        model.observe(1.0, 100.0)
    assert model.predict_ms(1.0) == pytest.approx(100.0)


def test_slope_never_negative_and_constant_work_keeps_the_prior_slope() -> None:
    model = LatencyModel(LinearPrior(0.0, 3.0, 0.0))
    for i in range(20):
        model.observe(5.0, 100.0 + i % 3)
    assert model.state().slope_ms == 3.0
    falling = LatencyModel(LinearPrior(0.0, 3.0, 0.0))
    for i in range(20):
        falling.observe(float(i), 100.0 - i)
    assert falling.state().slope_ms == 0.0


def test_ignores_impossible_timings() -> None:
    model = LatencyModel(LinearPrior(10.0, 0.0, 0.0))
    model.observe(1.0, -5.0)
    model.observe(1.0, float("nan"))
    assert model.observations == 0


def test_rejects_bad_settings() -> None:
    with pytest.raises(ValueError, match="cannot be negative"):
        LinearPrior(-1.0)
    with pytest.raises(ValueError, match="quantile"):
        LatencyModel(LinearPrior(1.0), quantile=1.0)


def test_the_admission_quantile_lies_between_the_median_and_the_planning_quantile() -> None:
    model = LatencyModel(LinearPrior(0.0, 1.0, 0.0), quantile=0.9, admit_quantile=0.6)
    rng = random.Random(1)
    for _ in range(128):
        work = rng.uniform(0, 1000)
        model.observe(work, 100.0 + work + rng.expovariate(1 / 200))
    assert model.median_ms(500) < model.admit_ms(500) < model.predict_ms(500)
    fresh = [
        (w, 100.0 + w + rng.expovariate(1 / 200))
        for w in (rng.uniform(0, 1000) for _ in range(4000))
    ]
    under = sum(y <= model.admit_ms(w) for w, y in fresh) / len(fresh)
    assert 0.52 <= under <= 0.68
    same = LatencyModel(LinearPrior(10.0, 1.0, 30.0))
    assert same.admit_ms(5) == same.predict_ms(5) == 45.0


def test_the_admission_margin_of_the_prior_is_scaled_as_a_normal_spread() -> None:
    # 128.16 ms at the p90 is a standard deviation of 100 ms: the p75 is 67.45 over the median.
    model = LatencyModel(LinearPrior(100.0, 0.0, 128.16), quantile=0.9, admit_quantile=0.75)
    assert model.admit_ms(0) == pytest.approx(167.45, abs=0.05)
    assert LatencyModel(LinearPrior(100.0, 0.0, 128.16), admit_quantile=0.5).admit_ms(0) == (
        pytest.approx(100.0)
    )
    with pytest.raises(ValueError, match="quantile"):
        LatencyModel(LinearPrior(1.0), admit_quantile=0.4)
