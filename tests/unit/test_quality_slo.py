"""Quality within the SLO (eval/lib/metrics.py) and the benchmark's arrivals and workload
(eval/bench/planner_quality_slo.py): what counts as right, late, refused, and how the planner is
compared with the fixed configurations on the same arrivals."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import cast

import pytest

from eval.bench.planner_quality_slo import (
    CONFIGURATIONS,
    build_parser,
    planned_arrivals,
    workload,
)
from eval.lib.data import squad_articles
from eval.lib.latency_stats import RequestRecord, Status
from eval.lib.load_engine import level_questions, poisson_arrivals
from eval.lib.metrics import (
    Arrival,
    Gold,
    judge,
    judged_level,
    level_quality,
    paired_gain,
    rate_comparison,
)
from eval.lib.stack import service_environment

SLO = 500.0
GOLDS = {"a": Gold(("Denver Broncos",)), "r": Gold(("Paris",), removed=True)}


def _record(
    question: str = "a",
    *,
    answer: str | None = "The Denver Broncos won [1].",
    ttft: float | None = 120.0,
    status: str = "ok",
    form: str | None = "quote",
    planned: float = 0.0,
) -> RequestRecord:
    return RequestRecord(
        question_id=question,
        status=cast(Status, status),
        start_offset_s=planned,
        planned_offset_s=planned,
        client_ttft_ms=ttft,
        answer=answer,
        form=form,
    )


def test_a_right_answer_in_time_counts() -> None:
    arrival = judge(_record(), 0, GOLDS["a"], SLO)
    assert (arrival.correct, arrival.within_slo, arrival.good) == (True, True, True)


def test_the_short_answer_is_judged_from_the_same_arrival() -> None:
    quote = "The Denver Broncos won [1]."
    right = dataclasses.replace(_record(answer=quote), short_answer="Denver Broncos")
    wrong = dataclasses.replace(_record(answer=quote), short_answer="won")
    judged = [judge(r, 0, GOLDS["a"], SLO) for r in (right, wrong, _record(answer=quote))]
    # No short answer: the whole answer is what was shown.
    assert [(a.correct, a.short_correct) for a in judged] == [
        (True, True),
        (True, False),
        (True, True),
    ]
    abstained = judge(_record("r", answer="I do not know.", form="abstain"), 0, GOLDS["r"], SLO)
    assert abstained.short_correct
    quality = level_quality(judged)
    assert (quality["quality_within_slo"], quality["short_quality_within_slo"]) == (1.0, 0.6667)
    assert judged[1].line(SLO, "quote", 1.0)["short_correct"] is False


def test_a_right_answer_too_late_is_right_but_not_within_the_slo() -> None:
    arrival = judge(_record(ttft=501.0), 0, GOLDS["a"], SLO)
    assert (arrival.correct, arrival.within_slo, arrival.good) == (True, False, False)


def test_an_abstention_is_right_only_where_the_gold_passage_was_removed() -> None:
    answer = "I do not know: the sources do not say."
    answerable = judge(_record("a", answer=answer, form="abstain"), 0, GOLDS["a"], SLO)
    removed = judge(_record("r", answer=answer, form="abstain"), 0, GOLDS["r"], SLO)
    assert (answerable.correct, answerable.abstained) == (False, True)
    assert (removed.correct, removed.abstained, removed.good) == (True, True, True)


def test_a_removed_question_answered_with_the_gold_string_found_elsewhere_is_right() -> None:
    arrival = judge(_record("r", answer="It is Paris [2].", form="focused"), 0, GOLDS["r"], SLO)
    assert (arrival.correct, arrival.abstained) == (True, False)


@pytest.mark.parametrize("status", ["rejected", "dropped", "error", "timeout"])
def test_an_arrival_without_an_answer_is_a_miss(status: str) -> None:
    arrival = judge(_record(status=status, answer=None, ttft=None), 3, GOLDS["r"], SLO)
    assert (arrival.correct, arrival.within_slo, arrival.form) == (False, False, "none")
    assert arrival.refused == (status in ("rejected", "dropped"))


def test_records_are_placed_by_their_planned_arrival_and_must_cover_every_one() -> None:
    planned = [0.5, 1.25, 2.0]
    records = [_record(planned=2.0), _record(planned=0.5, ttft=900.0), _record(planned=1.25)]
    judged = judged_level(records, planned, GOLDS, SLO)
    assert [a.arrival for a in judged] == [0, 1, 2]
    assert [a.within_slo for a in judged] == [False, True, True]
    with pytest.raises(ValueError, match="2 records for 3"):
        judged_level(records[:2], planned, GOLDS, SLO)


def test_level_quality_counts_every_arrival() -> None:
    planned = [0.0, 1.0, 2.0, 3.0]
    records = [
        _record(planned=0.0),
        _record(planned=1.0, ttft=800.0),
        _record("r", planned=2.0, answer="I do not know.", form="abstain"),
        _record(planned=3.0, status="rejected", answer=None, ttft=None),
    ]
    quality = level_quality(judged_level(records, planned, GOLDS, SLO))
    assert quality["quality_within_slo"] == 0.5  # the first and the right abstention
    assert quality["attainment"] == 0.5  # the late one and the refused one are not
    assert quality["answer_recall"] == round(2 / 3, 4)  # two of three answerable, late or not
    assert quality["abstention"] == 0.25
    assert quality["refused"] == 0.25
    assert (quality["arrivals"], quality["removed_arrivals"]) == (4, 1)
    assert quality["mode_mix"] == {"abstain": 0.25, "none": 0.25, "quote": 0.5}


def _arrivals(goods: list[bool]) -> list[Arrival]:
    planned = [float(n) for n in range(len(goods))]
    records = [
        _record(planned=float(n), ttft=100.0 if good else 900.0) for n, good in enumerate(goods)
    ]
    return judged_level(records, planned, GOLDS, SLO)


def test_the_envelope_the_oracle_and_the_planner_on_the_same_arrivals() -> None:
    levels = {
        "quote": _arrivals([True, True, False, False]),
        "focused": _arrivals([False, True, True, False]),
        "planner": _arrivals([True, True, True, False]),
    }
    result = rate_comparison(levels, ["quote", "focused"], "planner")
    assert (result["envelope"], result["best_fixed"]) == (0.5, "quote")
    assert result["oracle"] == 0.75
    assert result["oracle_headroom"]["gain"] == 0.25
    assert result["planner"] == 0.75
    assert result["planner_vs_best_fixed"]["gain"] == 0.25
    assert result["planner_within_3_points"] is True


def test_configurations_that_saw_different_arrivals_are_not_compared() -> None:
    levels = {"quote": _arrivals([True]), "focused": _arrivals([True, False])}
    with pytest.raises(ValueError, match="different arrival counts"):
        rate_comparison(levels, ["quote", "focused"], None)


def test_a_paired_gain_interval_holds_the_gain_and_excludes_zero_only_when_clear() -> None:
    clear = paired_gain([True] * 40 + [False] * 10, [False] * 30 + [True] * 20)
    assert clear["ci95_low"] <= clear["gain"] <= clear["ci95_high"]
    assert clear["ci95_low"] > 0
    tie = paired_gain([True, False] * 25, [False, True] * 25)
    assert tie["gain"] == 0.0
    assert tie["ci95_low"] < 0 < tie["ci95_high"]
    with pytest.raises(ValueError, match="paired samples"):
        paired_gain([True], [True, False])


@pytest.mark.parametrize("rate", [0.25, 1.0, 4.0])
def test_each_level_plans_exactly_the_arrivals_asked_for(rate: float) -> None:
    duration, planned = planned_arrivals(rate, 300, seed=0)
    assert len(planned) == 300
    # The load engine draws the same stream for that duration: the same 300 times.
    assert poisson_arrivals(rate, duration, 0) == planned
    assert planned == sorted(planned)
    assert planned[-1] < duration


def test_levels_start_on_their_own_share_of_the_questions() -> None:
    questions = list(range(10))
    assert level_questions(questions, 0, 2)[:3] == [0, 1, 2]
    assert level_questions(questions, 1, 2)[:3] == [5, 6, 7]


def test_the_workload_removes_a_fifth_of_the_evaluation_gold_passages(tmp_path: Path) -> None:
    evaluation = sorted(squad_articles("evaluation"))[0]
    training = sorted(squad_articles("planner_training"))[0]
    scorer = sorted(squad_articles("scorer_training"))[0]
    lines = [
        {
            "_id": f"e{n}",
            "question": f"q{n}?",
            "answers": ["x"],
            "gold_passage_id": f"{evaluation}-{n // 2}",
        }
        for n in range(20)  # ten passages, two questions each
    ]
    lines += [
        {
            "_id": f"t{n}",
            "question": f"t{n}?",
            "answers": ["x"],
            "gold_passage_id": f"{training}-{n}",
        }
        for n in range(4)
    ]
    lines.append(
        {"_id": "s0", "question": "s?", "answers": ["x"], "gold_passage_id": f"{scorer}-0"}
    )
    lines.append(
        {"_id": "u0", "question": "u?", "answers": [], "gold_passage_id": f"{evaluation}-0"}
    )
    questions = tmp_path / "questions.jsonl"
    questions.write_text("".join(json.dumps(line) + "\n" for line in lines))
    work = workload(questions, seed=0, removed_share=0.2, warmup=2, part="evaluation")
    assert sorted(q.question_id for q in work.questions) == sorted(f"e{n}" for n in range(20))
    assert len(work.removed) == 2  # a fifth of the ten gold passages
    removed = {q for q, gold in work.golds.items() if gold.removed}
    assert removed == {q.question_id for q in work.questions if q.gold_passage_id in work.removed}
    assert len(removed) == 4
    assert {q.question_id for q in work.warmup} <= {f"t{n}" for n in range(4)}
    assert len(work.warmup) == 2
    assert (
        workload(questions, seed=0, removed_share=0.2, warmup=2, part="evaluation") == work
    )  # seeded


def test_the_command_line_names_configurations_and_refuses_unknown_ones() -> None:
    parser = build_parser()
    args = parser.parse_args(["--out", "x.json", "--rates", "2,0.5", "--configs", "quote,planner"])
    assert (args.rates, args.slos) == ([0.5, 2.0], [500.0, 3000.0])
    assert [c.name for c in args.configs] == ["quote", "planner"]
    with pytest.raises(SystemExit):
        parser.parse_args(["--out", "x.json", "--rates", "1", "--configs", "deep"])
    with pytest.raises(SystemExit):
        parser.parse_args(["--out", "x.json", "--rates", "0,1"])


def test_each_service_gets_its_configuration_and_no_inherited_answer_setting() -> None:
    base = {"PATH": "/bin", "ANSWER_SGLANG_WORKERS": "http://elsewhere", "ANSWER_TOP_K": "9"}
    extra = {"ANSWER_DEVICE": "cpu"}
    fixed = service_environment(base, CONFIGURATIONS["passages-3"].environment(), extra)
    assert fixed == {
        "PATH": "/bin",
        "ANSWER_ANSWER_CACHE_TTL_S": "0",  # every answer measured is answered afresh
        "ANSWER_PLANNER": "false",
        "ANSWER_MODE": "passages",
        "ANSWER_DEFAULT_TOP_K": "3",
        "ANSWER_RERANKER_MODEL": "",
        "ANSWER_DEVICE": "cpu",
    }
    planner = service_environment(base, CONFIGURATIONS["planner"].environment())
    assert planner["ANSWER_PLANNER"] == "true"
    assert planner["ANSWER_MODE"] == "auto"


def test_the_quote_family_fixes_its_rerank_depth_or_lets_the_planner_buy_it() -> None:
    d10, d30, planner = (CONFIGURATIONS[n] for n in ("quote-d10", "quote-d30", "planner-quote"))
    for config in (d10, d30, planner):
        env = config.environment()
        assert (env["ANSWER_MODE"], env["ANSWER_RERANKER_MODEL"]) == ("quote", "builtin")
        assert config.reranker
    assert (d10.experiment, d30.experiment) == (
        ("fixed_rerank_depth=10",),
        ("fixed_rerank_depth=30",),
    )
    assert d10.environment()["ANSWER_PLANNER"] == "false"
    assert (planner.planner, planner.experiment) == (True, ())
    assert not CONFIGURATIONS["quote"].reranker  # depth 0: no reranker loaded
    assert build_parser().parse_args(["--out", "x", "--rates", "1"]).part == "evaluation"
