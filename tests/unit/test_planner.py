"""The deadline planner: plans across budgets and loads, the generation re-plan, learning."""

from __future__ import annotations

import dataclasses

import pytest

from budget.arrivals import ArrivalRate
from budget.latency_model import LinearPrior
from budget.planner import (
    Knobs,
    PlanInput,
    Planner,
    PlannerConfig,
    PromptOption,
    QualityCurve,
    StageModels,
    StagePriors,
)

# Rerank helps, more passages help, with diminishing returns (the shape measured on SQuAD).
CURVE = QualityCurve(
    {
        0: (0.55, 0.70, 0.78, 0.82, 0.85),
        20: (0.75, 0.85, 0.89, 0.91, 0.92),
    }
)
PRIORS = StagePriors(
    embed=LinearPrior(10.0),
    search=LinearPrior(5.0),
    rerank=LinearPrior(0.0, 20.0),  # 20 candidates: 400 ms
    sentences=LinearPrior(0.0),  # free here, to keep the arithmetic below
    prompt=LinearPrior(5.0),
    first_token=LinearPrior(100.0, 2.0),  # 2 ms per prefilled token
)
CONFIG = PlannerConfig(
    rerank_depths=(0, 20),
    fixed_prompt_tokens=100,
    passage_tokens=200,
    margin_fraction=0.0,
    margin_ms=0.0,
)


def planner() -> Planner:
    return Planner(StageModels(PRIORS), CURVE, CONFIG)


def request(remaining_ms: float, **load: float) -> PlanInput:
    return PlanInput(
        remaining_ms=remaining_ms,
        query_tokens=0,
        max_passages=5,
        reranker=True,
        prefill_ahead_tokens=load.get("ahead", 0.0),
        cached_share=load.get("cached", 0.0),
    )


# Fixed costs: embed 10 + search 5 + prompt 5 + first-token intercept 100 = 120 ms; prefill
# is 200 ms for the system prompt and 400 ms per passage; rerank 400 ms. So (depth, passages):
# (0, 1) 720 ms, (0, 2) 1_120, (0, 3) 1_520, (20, 1) 1_120, (20, 2) 1_520, (20, 4) 2_320,
# (20, 5) 2_720.
@pytest.mark.parametrize(
    ("budget_ms", "depth", "passages"),
    [
        (10_000, 20, 5),  # everything fits: the deepest plan
        (2_720, 20, 5),  # exactly the deepest plan
        (2_700, 20, 4),  # rerank is worth more than the fifth passage
        (1_900, 20, 2),  # reranked top two (0.85) beat five in retrieval order (0.85, slower)
        (1_500, 20, 1),  # reranked top one (0.75) beats two unreranked (0.70)
        (1_000, 0, 1),
        (720, 0, 1),
    ],
)
def test_plans_shrink_with_the_budget(budget_ms: float, depth: int, passages: int) -> None:
    plan = planner().plan(request(budget_ms))
    assert plan.fits
    assert (plan.knobs.rerank_depth, plan.knobs.passages) == (depth, passages)
    assert plan.predicted_ms.total <= budget_ms


def test_nothing_fits_gives_the_smallest_plan_marked_as_not_fitting() -> None:
    plan = planner().plan(request(500))
    assert not plan.fits
    assert (plan.knobs.rerank_depth, plan.knobs.passages) == (0, 1)
    assert plan.predicted_ms.total == pytest.approx(720)


def test_the_idle_floor_is_the_smallest_plan_with_nothing_queued() -> None:
    # With no observations the median is the prior: (0, 1) takes 720 ms, whatever is queued.
    assert planner().idle_floor_ms(request(500)) == pytest.approx(720)
    assert planner().idle_floor_ms(request(500, ahead=4_000)) == pytest.approx(720)
    busy = planner().plan(request(1_000, ahead=4_000))
    assert not busy.likely  # the queue, not the budget, is what it cannot make


def test_each_request_queued_ahead_costs_the_fixed_part_too() -> None:
    # Three short prompts ahead are three intercepts (100 ms each) plus their tokens, not one.
    base = dataclasses.replace(request(60_000, ahead=400), max_passages=1)
    queued = dataclasses.replace(base, requests_ahead=3.0)
    one = planner().evaluate(base, 0, 1).predicted_ms.first_token
    three = planner().evaluate(queued, 0, 1).predicted_ms.first_token
    assert three - one == pytest.approx(300)
    assert planner().plan(queued).predicted_ms.first_token == pytest.approx(three)
    assert planner().idle_floor_ms(queued) == planner().idle_floor_ms(base)


def test_a_queue_on_the_worker_shrinks_the_plan() -> None:
    idle = planner().plan(request(2_000))
    busy = planner().plan(request(2_000, ahead=400))  # 800 ms of someone else's prefill
    assert busy.knobs.passages < idle.knobs.passages
    assert busy.predicted_ms.first_token > 0


def test_expected_cache_hits_buy_more_context() -> None:
    cold = planner().plan(request(1_500))
    warm = planner().plan(request(1_500, cached=0.8))
    assert warm.quality > cold.quality


def test_no_reranker_means_no_rerank_in_any_plan() -> None:
    plan = planner().plan(
        PlanInput(remaining_ms=60_000, query_tokens=5, max_passages=3, reranker=False)
    )
    assert plan.knobs.rerank_depth == 0
    assert plan.knobs.passages == 3
    assert plan.knobs.retrieve_k == 3


def test_retrieval_depth_follows_rerank_depth_and_slack() -> None:
    config = PlannerConfig(rerank_depths=(0, 20), retrieve_slack=2, margin_ms=0.0)
    plan = Planner(StageModels(PRIORS), CURVE, config).plan(request(60_000))
    assert plan.knobs.retrieve_k == 20
    shallow = Planner(StageModels(PRIORS), CURVE, config).plan(request(1_000))
    assert shallow.knobs.retrieve_k == shallow.knobs.passages + 2


def test_the_safety_margin_is_held_back() -> None:
    config = PlannerConfig(
        rerank_depths=(0, 20),
        margin_fraction=0.1,
        margin_ms=50.0,
        fixed_prompt_tokens=100,
        passage_tokens=200,
    )
    plan = Planner(StageModels(PRIORS), CURVE, config).plan(request(2_720))
    assert plan.available_ms == pytest.approx(2_720 * 0.9 - 50)
    assert plan.predicted_ms.total <= plan.available_ms
    assert (plan.knobs.rerank_depth, plan.knobs.passages) != (20, 5)


def test_observed_timings_move_the_plan() -> None:
    models = StageModels(PRIORS)
    plan_before = Planner(models, CURVE, CONFIG).plan(request(2_720))
    for _ in range(16):  # the reranker turns out five times slower than its prior
        models.observe("rerank", 20, 2_000.0)
    plan_after = Planner(models, CURVE, CONFIG).plan(request(2_720))
    assert plan_before.knobs.rerank_depth == 20
    assert plan_after.knobs.rerank_depth == 0


def test_first_token_models_are_per_worker() -> None:
    models = StageModels(PRIORS)
    for _ in range(16):
        models.observe("first_token", 1000, 8_000.0, worker="slow")
    assert models.predict_ms("first_token", 1000, "slow") > 7_000
    assert models.predict_ms("first_token", 1000, "fast") == pytest.approx(2_100)
    assert "first_token@slow" in models.states()


def test_generation_replan_keeps_the_most_passages_that_fit() -> None:
    options = [
        PromptOption(passages=5, prompt_tokens=1100, uncached_tokens=1100),
        PromptOption(passages=3, prompt_tokens=700, uncached_tokens=700),
        PromptOption(passages=1, prompt_tokens=300, uncached_tokens=300),
    ]
    p = planner()
    chosen, predicted = p.passages_that_fit(1_600, options, 0.0, "")
    assert chosen.passages == 3
    assert predicted == pytest.approx(5 + 100 + 1_400)
    chosen, _ = p.passages_that_fit(5_000, options, 0.0, "")
    assert chosen.passages == 5
    # Nothing fits: the smallest prompt goes anyway (the request was admitted).
    chosen, predicted = p.passages_that_fit(100, options, 0.0, "")
    assert chosen.passages == 1
    assert predicted > 100
    # A cached prefix makes the big prompt cheap.
    cached = [PromptOption(passages=5, prompt_tokens=1100, uncached_tokens=100)]
    assert p.passages_that_fit(600, cached, 0.0, "")[0].passages == 5
    with pytest.raises(ValueError, match="no prompt options"):
        p.passages_that_fit(600, [], 0.0, "")


def test_quality_curve_lookup_and_validation() -> None:
    assert CURVE.score(0, 0) == 0.0
    assert CURVE.score(10, 2) == 0.70  # depth 10 not measured: depth 0's curve
    assert CURVE.score(30, 9) == 0.92  # beyond the measured passages: the curve's end
    with pytest.raises(ValueError, match="depth 0"):
        QualityCurve({20: (0.5,)})
    with pytest.raises(ValueError, match="monotone"):
        QualityCurve({0: (0.5, 0.4)})


def test_a_high_arrival_rate_keeps_prefills_short() -> None:
    p = planner()  # one passage: 720 ms of prefill and overhead, five: 2_320 ms
    calm = p.plan(request(10_000))
    assert calm.knobs.passages == 5
    busy = p.plan(dataclasses.replace(request(10_000), arrival_rate_rps=0.4))
    # max_utilization 0.5 at 0.4 rps: a prefill may take 1.25 s: two passages (1_100 ms).
    assert busy.knobs.passages == 2
    swamped = p.plan(dataclasses.replace(request(10_000), arrival_rate_rps=5.0))
    assert swamped.knobs.passages == 1
    assert swamped.fits


def test_arrival_rate_over_a_sliding_window() -> None:
    now = [0.0]
    rate = ArrivalRate(window_s=10.0, burst_window_s=10.0, clock=lambda: now[0])
    assert rate.per_second() == 0.0
    for step in range(50):  # 2 per second for 25 s
        now[0] = step * 0.5
        rate.mark()
    assert rate.per_second() == pytest.approx(2.0, abs=0.11)
    now[0] = 40.0
    assert rate.per_second() == 0.0


def test_a_burst_shows_in_the_arrival_rate_within_seconds() -> None:
    now = [0.0]
    rate = ArrivalRate(window_s=30.0, burst_window_s=5.0, clock=lambda: now[0])
    for step in range(30):  # 0.5 per second for a minute
        now[0] = step * 2.0
        rate.mark()
    now[0] = 60.0
    assert rate.per_second() == pytest.approx(0.5, abs=0.04)
    for step in range(15):  # then 3 per second
        now[0] = 60.0 + step / 3.0
        rate.mark()
    now[0] = 64.9  # 15 arrivals in the last 5 s
    # The 30-s window alone would say (12 + 15) / 30 = 0.9.
    assert rate.per_second() == pytest.approx(3.0, abs=0.01)
    with pytest.raises(ValueError, match="burst_window_s"):
        ArrivalRate(window_s=5.0, burst_window_s=10.0)


def test_a_plan_that_misses_only_with_its_margins_is_still_likely() -> None:
    priors = dataclasses.replace(PRIORS, first_token=LinearPrior(100.0, 2.0, 500.0))
    p = Planner(StageModels(priors), CURVE, CONFIG)
    # Smallest plan: 720 ms typical, 1_220 ms with the first-token margin.
    close = p.plan(request(1_000))
    assert not close.fits
    assert close.likely
    hopeless = p.plan(request(600))
    assert not hopeless.fits
    assert not hopeless.likely


# A quote pays for no generation: embed 10 + search 5 (+ rerank 400 at depth 20) and the
# sentences (free here). Its quality is the curve's first passage: 0.55 at depth 0, 0.75 at 20.
@pytest.mark.parametrize(("budget_ms", "depth"), [(10_000, 20), (415, 20), (414, 0), (10, 0)])
def test_a_quote_buys_the_rerank_depth_that_fits(budget_ms: float, depth: int) -> None:
    quote = dataclasses.replace(request(budget_ms), quote=True)
    plan = planner().plan(quote)
    assert plan.knobs == Knobs(depth, 5, max(depth, 5))  # its passages are the sources
    assert plan.predicted_ms.prompt == plan.predicted_ms.first_token == 0.0
    assert plan.predicted_ms.total == pytest.approx(15 + (400 if depth else 0))
    assert plan.quality == CURVE.quote(depth) == (0.75 if depth else 0.55)
    assert plan.fits == (budget_ms >= 15)
    # The same budget with a generation to pay for buys no rerank at all.
    assert planner().plan(request(budget_ms)).knobs.rerank_depth == (20 if budget_ms > 1_500 else 0)


@pytest.mark.parametrize(("rate", "depth"), [(0.0, 20), (1.25, 20), (1.3, 0), (10.0, 0)])
def test_a_quote_reranks_only_what_the_replicas_arrivals_leave_room_for(
    rate: float, depth: int
) -> None:
    # 400 ms of rerank a request: past 1.25 requests a second it would take over half the CPU.
    quote = dataclasses.replace(request(10_000), quote=True, replica_rate_rps=rate)
    assert planner().plan(quote).knobs.rerank_depth == depth


def test_a_quote_without_a_reranker_never_reranks() -> None:
    quote = dataclasses.replace(request(60_000), quote=True, reranker=False)
    assert planner().plan(quote).knobs.rerank_depth == 0


def test_a_measured_quote_curve_values_the_quote_and_a_flat_one_buys_no_rerank() -> None:
    measured = dataclasses.replace(CURVE, quote_by_depth={0: 0.80, 20: 0.803})
    assert (measured.quote(0), measured.quote(10), measured.quote(30)) == (0.80, 0.80, 0.803)
    quote = dataclasses.replace(request(10_000), quote=True)
    # 0.3 points for 400 ms: within the half point that goes to the faster plan.
    assert Planner(StageModels(PRIORS), measured, CONFIG).plan(quote).knobs.rerank_depth == 0
    steeper = dataclasses.replace(CURVE, quote_by_depth={0: 0.80, 20: 0.85})
    assert Planner(StageModels(PRIORS), steeper, CONFIG).plan(quote).knobs.rerank_depth == 20
    with pytest.raises(ValueError, match="depth 0"):
        QualityCurve({0: (0.5,)}, {20: 0.6})
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        QualityCurve({0: (0.5,)}, {0: 1.5})
