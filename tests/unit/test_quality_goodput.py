"""Goodput with a quality floor (`eval/bench/quality_goodput.py`) and the planner benchmark's pure
parts (`eval/bench/planner_goodput.py`), against hand-computed cases."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from eval.bench.planner_goodput import CONFIGS, deepest_fixed, service_environment, summarize
from eval.bench.quality_goodput import (
    LevelOutcome,
    answer_quality,
    goodput_with_floor,
    level_summary,
    quality_floor,
)
from eval.lib.latency_stats import LevelRun, RequestRecord, goodput_rps

GOLDS = {"q1": ("Denver Broncos",), "q2": ("Santa Clara", "Levi's Stadium")}


def answered(question_id: str, answer: str, ttft_ms: float = 100.0, **fields: Any) -> RequestRecord:
    return RequestRecord(
        question_id, "ok", 0.0, rate_rps=0.1, client_ttft_ms=ttft_ms, answer=answer, **fields
    )


def test_quality_over_answered_requests_and_over_all_arrivals() -> None:
    records = [
        answered("q1", "The Denver[1] Broncos won."),  # 1: markers do not split the answer
        answered("q2", "It was in Houston."),  # 0
        RequestRecord("q1", "rejected", 0.0, http_status=429),  # no answer
        RequestRecord("q2", "error", 0.0, client_ttft_ms=50.0),  # failed after a token
    ]
    quality = answer_quality(records, GOLDS)
    assert quality.answered == 2
    assert quality.answered_mean == pytest.approx(1 / 2)
    assert quality.all_mean == pytest.approx(1 / 4)  # non-answers count 0
    nothing = answer_quality([RequestRecord("q1", "timeout", 0.0)], GOLDS)
    assert (nothing.answered_mean, nothing.all_mean, nothing.answered) == (None, 0.0, 0)
    assert answer_quality([], GOLDS).all_mean is None


def test_a_rate_that_meets_the_slo_below_the_quality_floor_is_not_goodput() -> None:
    levels = [
        LevelOutcome(0.1, attainment=0.95, quality=0.80),
        LevelOutcome(0.2, attainment=0.92, quality=0.70),  # fast enough, too poor
        LevelOutcome(0.3, attainment=0.91, quality=0.78),
        LevelOutcome(0.45, attainment=0.50, quality=0.80),  # good, too slow
    ]
    slo_only = goodput_rps((level.rate_rps, level.attainment) for level in levels)
    assert slo_only == 0.3
    assert goodput_with_floor(levels, floor=0.76) == 0.3
    # A higher floor leaves the 0.3 level out as well: lower goodput than on the SLO alone.
    assert goodput_with_floor(levels, floor=0.79) == 0.1
    assert goodput_with_floor(levels, floor=None) == slo_only


def test_goodput_is_zero_when_no_rate_passes() -> None:
    assert goodput_with_floor([LevelOutcome(0.1, 0.89, 1.0)], floor=0.5) == 0.0
    assert goodput_with_floor([LevelOutcome(0.1, 0.99, 0.4)], floor=0.5) == 0.0
    assert goodput_with_floor([LevelOutcome(0.1, 0.99, None)], floor=0.5) == 0.0
    assert goodput_with_floor([LevelOutcome(0.1, None, 1.0)], floor=None) == 0.0
    assert goodput_with_floor([], floor=0.5) == 0.0


def test_a_quality_exactly_on_the_floor_passes() -> None:
    floor = quality_floor(0.8)  # 0.8 - 0.02 in floating point
    assert floor == pytest.approx(0.78)
    assert goodput_with_floor([LevelOutcome(0.2, 0.9, 0.78)], floor) == 0.2
    assert quality_floor(None) is None


def test_level_summary_reports_the_plans_and_cuts() -> None:
    records = (
        answered("q1", "Denver Broncos", 500.0, plan_passages=5, plan_rerank_depth=20,
                 plan_retrieve_k=20, passages_in_prompt=5, prompt_tokens=400, cached_tokens=100),
        answered("q2", "no idea", 2500.0, plan_passages=3, plan_rerank_depth=0,
                 plan_retrieve_k=3, plan_cuts=('{"done": 0, "planned": 20, "reason": "late", "stage": "rerank"}', "x"), passages_in_prompt=3,
                 prompt_tokens=200, cached_tokens=200),
        RequestRecord("q1", "rejected", 0.0, rate_rps=0.1, http_status=503),
    )  # fmt: skip
    summary = level_summary(LevelRun("rate", 0.1, 10.0, 12.0, records), 2000.0, GOLDS)
    assert summary["rate"] == 0.1
    assert summary["slo_attainment"] == pytest.approx(1 / 3, abs=1e-4)
    assert summary["quality_answered"] == 0.5
    assert summary["quality_all"] == pytest.approx(1 / 3, abs=1e-4)
    assert (summary["sent"], summary["ok"], summary["rejected"], summary["errored"]) == (3, 2, 1, 0)
    assert summary["ttft_p50_ms"] == 1500.0
    assert summary["ttft_p95_ms"] == 2400.0  # rank 0.95 of 2 values
    assert summary["mean_plan_passages"] == 4.0
    assert summary["mean_plan_rerank_depth"] == 10.0
    assert summary["mean_plan_retrieve_k"] == 11.5
    assert summary["mean_passages_in_prompt"] == 4.0
    assert summary["plans_reported"] == 2
    assert summary["cuts"] == {"rerank/late": 1, "x": 1}
    assert summary["cached_token_share"] == 0.5  # 300 of 600


def _run(rate: float, hits: int, correct: int, total: int = 10) -> LevelRun:
    """`total` answered requests, the first `hits` within the SLO, the first `correct` right."""
    records = tuple(
        answered("q1", "Denver Broncos" if n < correct else "Miami", 100.0 if n < hits else 5000.0)
        for n in range(total)
    )
    return LevelRun("rate", rate, 10.0, 10.0, records)


def test_the_floor_comes_from_the_deepest_fixed_configuration_at_the_lowest_rate() -> None:
    configs = [CONFIGS["deep"], CONFIGS["mid"], CONFIGS["planner"]]
    runs = {
        # deep: right 9/10 at the lowest rate (floor 0.88), too slow from 0.2 on.
        "deep": [_run(0.2, 5, 9), _run(0.1, 10, 9)],
        # mid: fast at both rates, but right only 8/10 at 0.2: below the floor there.
        "mid": [_run(0.1, 10, 9), _run(0.2, 10, 8)],
        # planner: fast and right enough at both.
        "planner": [_run(0.1, 10, 9), _run(0.2, 9, 9)],
    }
    summary = summarize(runs, configs, GOLDS, slo_ms=2000.0)
    assert summary["floor"] == 0.88
    assert summary["floor_from"] == {"config": "deep", "rate": 0.1, "quality_answered": 0.9}
    results = summary["configs"]
    assert [level["rate"] for level in results["deep"]["levels"]] == [0.1, 0.2]
    assert (results["deep"]["goodput_rps"], results["deep"]["goodput_rps_slo_only"]) == (0.1, 0.1)
    assert (results["mid"]["goodput_rps"], results["mid"]["goodput_rps_slo_only"]) == (0.1, 0.2)
    assert results["planner"]["goodput_rps"] == 0.2
    assert summary["planner_goodput_vs_best_fixed"] == 2.0


def test_the_deepest_fixed_configuration() -> None:
    assert deepest_fixed(list(CONFIGS.values())) == CONFIGS["deep_rerank"]
    assert deepest_fixed([CONFIGS["deep"], CONFIGS["mid"]]) == CONFIGS["deep"]
    assert deepest_fixed([CONFIGS["shallow"], CONFIGS["mid"]]) == CONFIGS["mid"]
    assert deepest_fixed([CONFIGS["planner"]]) is None


def test_each_service_gets_its_configuration_and_no_inherited_answer_setting() -> None:
    args = argparse.Namespace(
        reranker="some/cross-encoder", max_new_tokens=32, service_env={"ANSWER_DEVICE": "cpu"}
    )

    base = {"PATH": "/bin", "ANSWER_SGLANG_WORKERS": "http://elsewhere", "ANSWER_TOP_K": "9"}
    mid = service_environment(base, CONFIGS["mid"], args)
    assert mid == {
        "PATH": "/bin",
        "ANSWER_ANSWER_CACHE_TTL_S": "0",  # every answer measured is generated
        "ANSWER_PLANNER": "false",
        "ANSWER_DEFAULT_TOP_K": "3",
        "ANSWER_RERANKER_MODEL": "",
        "ANSWER_MAX_NEW_TOKENS": "32",
        "ANSWER_DEVICE": "cpu",
    }
    deep = service_environment(base, CONFIGS["deep_rerank"], args)
    assert deep["ANSWER_RERANKER_MODEL"] == "some/cross-encoder"
    assert service_environment(base, CONFIGS["deep"], args)["ANSWER_RERANKER_MODEL"] == ""
    planner = service_environment(base, CONFIGS["planner"], args)
    assert planner["ANSWER_PLANNER"] == "true"
    shallow = service_environment(base, CONFIGS["shallow"], args)
    assert shallow["ANSWER_DEFAULT_TOP_K"] == "1"
