"""Calibration where the service runs: stage timings measured at warm-up become the stage
models' priors, so a machine faster than the one the shipped priors were measured on admits the
budgets it can make (and a slower one refuses the ones it cannot)."""

from __future__ import annotations

import pytest

from budget.latency_model import LatencyModel, LinearPrior
from budget.planner import PlanInput, Planner, PlannerConfig, QualityCurve, StageModels

CURVE = QualityCurve({0: (0.6, 0.7, 0.75, 0.78, 0.8)})
CONFIG = PlannerConfig(rerank_depths=(0,), margin_fraction=0.0, margin_ms=0.0)


def request(remaining_ms: float) -> PlanInput:
    return PlanInput(remaining_ms=remaining_ms, query_tokens=10, max_passages=5, reranker=False)


def test_settling_makes_what_was_measured_the_prior() -> None:
    model = LatencyModel(LinearPrior(120.0, 1.9, 350.0), min_observations=8)
    for tokens in (100.0, 400.0, 1200.0):  # a GPU: 8 ms + 0.01 ms a token
        model.observe(tokens, 8.0 + 0.01 * tokens)
    blended = model.predict_ms(1000.0)
    assert blended > 1000.0  # three of eight observations: still mostly the CPU prior
    assert model.settle()
    assert model.predict_ms(1000.0) == pytest.approx(18.0, abs=0.5)
    assert model.prior.intercept_ms == pytest.approx(8.0, abs=0.5)
    # It keeps learning from there: a slower stretch moves it, from the measured start.
    for _ in range(8):
        model.observe(1000.0, 40.0)
    assert 18.0 < model.predict_ms(1000.0) <= 41.0


def test_nothing_observed_keeps_the_shipped_prior() -> None:
    prior = LinearPrior(120.0, 1.9, 350.0)
    model = LatencyModel(prior)
    assert not model.settle()
    assert model.prior == prior
    assert model.predict_ms(100.0) == prior.predict_ms(100.0)


def test_a_budget_down_to_the_calibrated_floor_is_planned_for() -> None:
    """With the shipped CPU priors a 300 ms budget fits no generated answer; after the warm-up
    measures a fast machine, the idle floor drops below it and the plan fits."""
    models = StageModels()
    planner = Planner(models, CURVE, CONFIG)
    assert planner.idle_floor_ms(request(300.0)) > 300.0
    assert not planner.plan(request(300.0)).fits
    for words in (3.0, 8.0, 14.0):
        models.observe("embed", words, 2.0)
        models.observe("sentences", 30.0, 1.0)
    for depth in (5.0, 20.0):
        models.observe("search", depth, 1.0)
    models.observe("prompt", 1.0, 0.5)
    for tokens in (60.0, 250.0, 700.0):
        models.observe("first_token", tokens, 10.0 + 0.02 * tokens)
    assert models.settle() == ["embed", "first_token", "prompt", "search", "sentences"]
    floor = planner.idle_floor_ms(request(300.0))
    assert floor < 60.0
    plan = planner.plan(request(300.0))
    assert plan.fits
    assert plan.knobs.passages == 5  # the whole budget's worth: every passage fits


def test_a_slower_machine_calibrates_the_floor_up() -> None:
    models = StageModels()
    planner = Planner(models, CURVE, CONFIG)
    shipped = planner.idle_floor_ms(request(3_000.0))
    for tokens in (60.0, 250.0, 700.0):
        models.observe("first_token", tokens, 900.0 + 6.0 * tokens)
    models.settle()
    assert planner.idle_floor_ms(request(3_000.0)) > shipped + 500.0
