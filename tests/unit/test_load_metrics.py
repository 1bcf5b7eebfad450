"""The statistics of `answer-eval load` against hand-computed cases, and the engine's pure parts
(arrival schedule, question files)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from eval.lib.latency_stats import (
    LevelRun,
    RequestRecord,
    cached_token_share,
    goodput_rps,
    itl_stats,
    level_metrics,
    percentiles,
    slo_attainment,
    stage_p50_ms,
    sweep_metrics,
)
from eval.lib.load_engine import poisson_arrivals
from eval.lib.questions import read_load_questions


def ok(ttft_ms: float, **fields: Any) -> RequestRecord:
    """A request that finished well, first token after `ttft_ms`."""
    return RequestRecord(
        **{"question_id": "q", "status": "ok", "start_offset_s": 0.0, **fields},
        client_ttft_ms=ttft_ms,
    )


def test_percentiles_interpolate_linearly_between_closest_ranks() -> None:
    # numpy's "linear": the q-th percentile sits at rank q/100 * (n - 1) of the sorted values.
    assert percentiles([4.0, 1.0, 3.0, 2.0]) == {
        "p50": 2.5,  # rank 1.5
        "p90": 3.7,  # rank 2.7
        "p95": 3.85,  # rank 2.85
        "p99": 3.97,  # rank 2.97
    }
    assert percentiles([7.0]) == {"p50": 7.0, "p90": 7.0, "p95": 7.0, "p99": 7.0}
    assert percentiles([]) == {}


def test_attainment_counts_rejected_errored_timed_out_and_dropped_as_misses() -> None:
    records = [
        ok(100.0),  # hit
        ok(200.0),  # hit: on the objective counts as within it
        ok(250.0),  # miss: too late
        RequestRecord("q", "rejected", 0.0, http_status=429),
        RequestRecord("q", "error", 0.0, http_status=500),
        RequestRecord("q", "error", 0.0, client_ttft_ms=50.0),  # failed after its first token
        RequestRecord("q", "timeout", 0.0),
        RequestRecord("q", "dropped", 0.0),
    ]
    assert slo_attainment(records, slo_ms=200.0) == pytest.approx(2 / 8)
    assert slo_attainment([], slo_ms=200.0) is None


def test_goodput_is_the_highest_rate_meeting_ninety_percent() -> None:
    assert goodput_rps([(0.5, 1.0), (1.0, 0.95), (2.0, 0.9), (4.0, 0.6)]) == 2.0
    # Not monotone: the highest rate that meets it wins, as in DistServe's definition.
    assert goodput_rps([(1.0, 0.85), (2.0, 0.95), (4.0, 0.2)]) == 2.0
    assert goodput_rps([(1.0, 0.89), (2.0, None)]) == 0.0
    assert goodput_rps([]) == 0.0


def test_cached_token_share_sums_over_requests_that_reported_tokens() -> None:
    records = [
        ok(1.0, prompt_tokens=100, cached_tokens=50),
        ok(1.0, prompt_tokens=300, cached_tokens=0),
        RequestRecord("q", "rejected", 0.0),  # no done event: left out
    ]
    # (50 + 0) / (100 + 300), not the mean of 0.5 and 0.0.
    assert cached_token_share(records) == pytest.approx(0.125)
    assert cached_token_share([RequestRecord("q", "error", 0.0)]) is None


def test_itl_pools_all_gaps() -> None:
    records = [ok(1.0, itl_ms=(10.0, 20.0)), ok(1.0, itl_ms=(30.0,)), ok(1.0)]
    stats = itl_stats(records)
    # Pooled gaps 10, 20, 30: p95 at rank 1.9 is 20 + 0.9 * 10.
    assert stats == {"count": 3, "p50": 20.0, "p95": 29.0, "mean": 20.0}
    assert itl_stats([ok(1.0)]) == {"count": 0}


def test_stage_medians() -> None:
    records = [
        ok(1.0, stages_ms=(("embed", 2.0), ("search", 1.0))),
        ok(1.0, stages_ms=(("embed", 4.0), ("search", 3.0))),
        ok(1.0, stages_ms=(("embed", 9.0),)),
    ]
    assert stage_p50_ms(records) == {"embed": 4.0, "search": 2.0}


def test_level_metrics_of_an_open_loop_level() -> None:
    records = (
        ok(100.0, e2e_ms=400.0, planned_offset_s=0.0, start_offset_s=0.001, rate_rps=2.0),
        ok(300.0, e2e_ms=800.0, planned_offset_s=0.5, start_offset_s=0.503, rate_rps=2.0),
        RequestRecord("q", "rejected", 1.0, rate_rps=2.0, planned_offset_s=1.0, e2e_ms=5.0),
        RequestRecord("q", "dropped", 1.5, rate_rps=2.0, planned_offset_s=1.5),
    )
    metrics = level_metrics(LevelRun("rate", 2.0, 2.0, 2.5, records), slo_ms=200.0)
    assert metrics["rate"] == 2.0
    assert (metrics["arrivals"], metrics["sent"]) == (4, 3)
    assert (metrics["ok"], metrics["rejected"], metrics["errored"]) == (2, 1, 0)
    assert (metrics["timeouts"], metrics["dropped_by_client"]) == (0, 1)
    assert metrics["slo_attainment"] == 0.25
    assert metrics["offered_rps"] == 2.0  # 4 arrivals over the 2 s duration
    assert metrics["throughput_rps"] == 0.8  # 2 answers over the 2.5 s the level lasted
    assert metrics["ttft_ms"]["p50"] == 200.0
    assert metrics["e2e_ms"] == {
        "count": 2,
        "p50": 600.0,
        "p95": 780.0,
        "p99": 796.0,
        "mean": 600.0,
    }
    # Lags of the three sent requests: 1, 3 and 0 ms.
    assert metrics["schedule_lag_ms"] == {"p50": 1.0, "p99": 2.96, "max": 3.0}


def test_sweep_metrics_layout() -> None:
    fast = LevelRun("rate", 1.0, 1.0, 1.0, (ok(10.0),))
    slow = LevelRun("rate", 2.0, 1.0, 1.0, (ok(10.0), ok(900.0)))
    metrics = sweep_metrics([fast, slow], slo_ms=100.0)
    assert [level["rate"] for level in metrics["rates"]] == [1.0, 2.0]
    assert metrics["goodput_rps"] == 1.0
    assert metrics["slo_ms"] == 100.0
    closed = sweep_metrics([LevelRun("concurrency", 4, 2.0, 2.1, (ok(10.0),) * 6)], 100.0)
    assert closed["concurrency"][0]["concurrency"] == 4
    assert closed["goodput_rps"] == 3.0  # closed loop: 6 requests over 2 s offered


def test_records_survive_a_checkpoint_round_trip() -> None:
    record = ok(
        12.3456,
        itl_ms=(1.5, 2.25),
        stages_ms=(("embed", 1.0),),
        prompt_tokens=10,
        cached_tokens=4,
        rate_rps=3.0,
        planned_offset_s=0.25,
    )
    run = LevelRun("rate", 3.0, 1.0, 1.2, (record,))
    again = LevelRun.from_json(json.loads(json.dumps(run.to_json())))
    assert again.records[0] == RequestRecord(**{**_fields(record), "client_ttft_ms": 12.346})
    assert again.kind == "rate"
    assert again.level == 3.0


def _fields(record: RequestRecord) -> dict[str, object]:
    return {name: getattr(record, name) for name in RequestRecord.__slots__}


def test_poisson_arrivals_are_reproducible_and_inside_the_duration() -> None:
    first = poisson_arrivals(50.0, 20.0, seed=7)
    assert first == poisson_arrivals(50.0, 20.0, seed=7)
    assert first != poisson_arrivals(50.0, 20.0, seed=8)
    assert all(0 < t < 20.0 for t in first)
    assert first == sorted(first)
    # 1000 expected, standard deviation sqrt(1000) ~ 32: 5 sigma either side.
    assert abs(len(first) - 1000) < 160


def test_questions_in_both_layouts(tmp_path: Path) -> None:
    squad = tmp_path / "squad.jsonl"
    squad.write_text(
        '{"_id": "a", "question": "Who?", "answers": ["x"]}\n\n{"_id": "b", "question": "Why?"}\n'
    )
    beir = tmp_path / "beir.jsonl"
    beir.write_text('{"_id": "0", "text": "Claim one."}\n{"text": "No id."}\n')
    assert [(q.question_id, q.question) for q in read_load_questions(squad)] == [
        ("a", "Who?"),
        ("b", "Why?"),
    ]
    assert [(q.question_id, q.question) for q in read_load_questions(beir)] == [
        ("0", "Claim one."),
        ("2", "No id."),
    ]
    many = tmp_path / "many.jsonl"
    many.write_text("".join(json.dumps({"_id": str(i), "text": f"q{i}"}) + "\n" for i in range(20)))
    shuffled = [q.question_id for q in read_load_questions(many, shuffle_seed=1)]
    assert shuffled == [q.question_id for q in read_load_questions(many, shuffle_seed=1)]
    assert sorted(shuffled, key=int) == [str(i) for i in range(20)] != shuffled
