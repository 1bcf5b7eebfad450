"""The dashboard's rolling figures, from request summaries built the way the service builds
them (from `AnswerStats` and `PlanRecord`)."""

from __future__ import annotations

import json

import pytest

from answer_service.pipeline.events import AnswerStats, Cut, PlanRecord
from answer_service.runtime.observability.dashboard_stats import (
    cache_status,
    percentile,
    prompt_bucket,
    snapshot,
)
from answer_service.runtime.observability.request_log import RequestLog, RequestSummary
from budget.planner import Knobs, StageTimes

NOW = 1_800_000_000.0


def _answered(
    *,
    tier: str = "standard",
    outcome: str = "ok",
    ttft_ms: float | None = 800.0,
    budget_ms: int = 1000,
    prompt_tokens: int = 900,
    cached_tokens: int = 100,
    worker: str = "http://w0",
    cuts: tuple[Cut, ...] = (),
    passages: int = 3,
    mode: str = "auto",
    form: str = "passages",
    finish_reason: str = "stop",
    unsupported: int = 0,
    from_cache: bool = False,
) -> tuple[AnswerStats, PlanRecord]:
    within = ttft_ms is not None and ttft_ms <= budget_ms
    stats = AnswerStats(
        trace_id="ab" * 16,
        outcome=outcome,
        ttft_ms=ttft_ms,
        ttft_budget_ms=budget_ms,
        within_budget=within,
        stages=StageTimes(embed=10.0),
        prompt_tokens=prompt_tokens,
        cached_tokens=cached_tokens,
        completion_tokens=20,
        finish_reason=finish_reason,
        passages_in_prompt=passages,
        passages_dropped=0,
        degraded=(),
        worker=worker,
        from_cache=from_cache,
        form=form,
        form_reason=f"answer_mode {mode} asked for",
        unsupported_sentences=unsupported,
    )
    plan = PlanRecord(
        planner=True,
        tier=tier,
        budget_ms=budget_ms,
        knobs=Knobs(0, passages, 10),
        initial=Knobs(0, 5, 10),
        quality=0.9,
        predicted_ms=StageTimes(embed=12.0, search=5.0, prompt=3.0, first_token=600.0),
        actual_ms=StageTimes(embed=10.0, search=6.0, prompt=2.0, first_token=700.0),
        cuts=cuts,
        queue_wait_ms=4.0,
        worker=worker,
        form=form,
        mode=mode,
        form_reason=f"answer_mode {mode} asked for",
    )
    return stats, plan


def _log(clock: list[float]) -> RequestLog:
    return RequestLog(100, replica="r1", clock=lambda: clock[0])


def test_percentiles_are_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == 50.0
    assert percentile(values, 95) == 95.0
    assert percentile(values, 99) == 99.0
    assert percentile([7.0], 99) == 7.0
    assert percentile([], 50) is None


@pytest.mark.parametrize(
    ("tokens", "bucket"),
    [(0, "<512"), (511, "<512"), (512, "512-1k"), (2047, "1k-2k"), (9000, ">=2k")],
)
def test_prompt_buckets(tokens: int, bucket: str) -> None:
    assert prompt_bucket(tokens) == bucket


def test_slo_attainment_counts_admitted_requests_over_rolling_windows() -> None:
    clock = [NOW - 600]  # ten minutes ago: in the 15-minute window only
    log = _log(clock)
    log.answered(*_answered(ttft_ms=2000.0))  # missed
    clock[0] = NOW - 30
    log.answered(*_answered(ttft_ms=500.0))  # met
    log.answered(*_answered(ttft_ms=None, outcome="error"))  # failed: not met
    log.answered(*_answered(ttft_ms=900.0, cuts=(Cut("passages", "slot wait", 5, 3),)))
    log.refused(trace_id="cd" * 16, tier="standard", code="overloaded", budget_ms=1000)

    snap = snapshot(log.since(NOW - 900), now=NOW, source="memory")

    windows = {w["window_s"]: w for w in snap["slo"]["windows"]}
    assert windows[60] == {"window_s": 60, "answered": 3, "met": 2, "attainment": 0.6667}
    assert windows[900]["answered"] == 4
    assert windows[900]["met"] == 2
    assert sum(b["answered"] for b in snap["slo"]["series"]) == 4
    assert snap["counts"] == {
        "answered": 4,
        "ok": 3,
        "degraded": 1,
        "rejected": 1,
        "errored": 1,
        "cancelled": 0,
        "sources_only": 0,
        "abstained": 0,
    }
    newest = snap["requests"][0]
    assert newest["outcome"] == "overloaded"
    assert newest["stages"] == []
    assert newest["knobs"] is None
    cut = snap["requests"][1]
    assert cut["cuts"] == [{"stage": "passages", "reason": "slot wait", "planned": 5, "done": 3}]
    assert [s["stage"] for s in cut["stages"]] == [
        "embed",
        "search",
        "rerank",
        "sentences",
        "prompt",
        "first_token",
    ]
    assert cut["stages"][-1] == {"stage": "first_token", "planned_ms": 600.0, "actual_ms": 700.0}
    assert len(snap["planner"]) == 4  # the refusal made no plan
    json.dumps(snap)  # what the SSE stream sends


def test_ttft_splits_by_tier_prompt_length_and_cache_status() -> None:
    clock = [NOW - 10]
    log = _log(clock)
    for ttft in (100.0, 200.0, 300.0):
        log.answered(*_answered(tier="premium", ttft_ms=ttft, prompt_tokens=400, cached_tokens=300))
    log.answered(*_answered(tier="standard", ttft_ms=1500.0, prompt_tokens=1500, cached_tokens=0))

    snap = snapshot(log.since(0), now=NOW, source="memory")

    by_tier = {g["key"]: g for g in snap["ttft"]["by_tier"]}
    assert by_tier["premium"] == {
        "key": "premium",
        "count": 3,
        "p50": 200.0,
        "p95": 300.0,
        "p99": 300.0,
    }
    assert by_tier["standard"]["p50"] == 1500.0
    assert [g["key"] for g in snap["ttft"]["by_prompt_bucket"]] == ["<512", "1k-2k"]
    by_cache = {g["key"]: g["count"] for g in snap["ttft"]["by_cache"]}
    assert by_cache == {"hit": 3, "miss": 1}
    (worker,) = snap["cache_share"]
    assert worker == {
        "worker": "http://w0",
        "prompt_tokens": 2700,
        "cached_tokens": 900,
        "share": 0.3333,
    }


def test_requests_older_than_the_longest_window_are_left_out() -> None:
    clock = [NOW - 901]
    log = _log(clock)
    log.answered(*_answered())
    snap = snapshot(log.since(0), now=NOW, source="memory")
    assert snap["requests"] == []
    assert snap["slo"]["windows"][-1]["answered"] == 0


def test_a_summary_survives_its_json_round_trip() -> None:
    summary = RequestSummary.answered(
        *_answered(cuts=(Cut("rerank", "overran", 20, 0),)), at=NOW, replica="host:1"
    )
    assert RequestSummary.from_json(json.loads(json.dumps(summary.to_json()))) == summary
    refusal = RequestSummary.refusal(
        trace_id="ef" * 16, tier="premium", code="overloaded", budget_ms=800, at=NOW, replica="h:2"
    )
    assert RequestSummary.from_json(refusal.to_json()) == refusal
    assert cache_status(refusal) == "miss"


def test_forms_are_counted_with_their_stops_and_unsupported_sentences() -> None:
    clock = [NOW - 20]
    log = _log(clock)
    log.answered(*_answered(mode="quote", form="quote", finish_reason="quote", ttft_ms=30.0))
    log.answered(*_answered(form="focused", unsupported=2, finish_reason="unsupported"))
    log.answered(*_answered(form="passages", finish_reason="repetition"))
    log.answered(*_answered(form="passages", unsupported=1))
    log.answered(*_answered(form="passages"))
    log.answered(*_answered(form="abstain", outcome="abstained", finish_reason="abstained"))
    log.answered(
        *_answered(
            form="sources_only", outcome="sources_only", finish_reason="sources_only", ttft_ms=None
        )
    )
    log.answered(*_answered(form="passages", from_cache=True, ttft_ms=5.0))
    log.refused(trace_id="cd" * 16, tier="standard", code="overloaded", budget_ms=1000)

    forms = snapshot(log.since(0), now=NOW, source="memory")["forms"]

    assert forms["answers"] == 8  # the refusal had no form
    mix = {row["form"]: (row["count"], row["share"]) for row in forms["mix"]}
    assert mix == {
        "quote": (1, 0.125),
        "focused": (1, 0.125),
        "passages": (3, 0.375),
        "abstain": (1, 0.125),
        "sources_only": (1, 0.125),
        "cached": (1, 0.125),  # its form was passages, but the model was not asked
    }
    assert [row["form"] for row in forms["mix"]][:3] == ["quote", "focused", "passages"]
    modes = {row["mode"]: row["count"] for row in forms["modes"]}
    assert modes == {"auto": 7, "quote": 1, "focused": 0, "passages": 0}
    # Model-served: the focused answer and the three passages answers not from the cache.
    assert forms["generated"] == 4
    assert forms["repetition_stops"] == 1
    assert forms["unsupported_stops"] == 1
    assert forms["unsupported_sentences"] == 3
    assert forms["unsupported_rate"] == 0.75
    assert forms["answers_with_unsupported"] == 2
    assert forms["unsupported_answer_share"] == 0.5
    finish = {row["reason"]: row["count"] for row in forms["finish"]}
    assert finish == {
        "abstained": 1,
        "quote": 1,
        "repetition": 1,
        "sources_only": 1,
        "stop": 3,  # two passages answers and the cached one
        "unsupported": 1,
    }


def test_ttft_of_model_served_answers_is_kept_apart_from_the_rest() -> None:
    clock = [NOW - 20]
    log = _log(clock)
    for ttft in (900.0, 1200.0):
        log.answered(*_answered(form="passages", ttft_ms=ttft))
    log.answered(*_answered(form="focused", ttft_ms=600.0))
    log.answered(*_answered(form="quote", ttft_ms=25.0))
    log.answered(*_answered(form="abstain", outcome="abstained", ttft_ms=20.0))
    log.answered(*_answered(form="passages", from_cache=True, ttft_ms=4.0))
    log.answered(*_answered(form="sources_only", outcome="sources_only", ttft_ms=None))

    ttft = snapshot(log.since(0), now=NOW, source="memory")["ttft"]

    served = {g["key"]: g for g in ttft["by_served"]}
    assert [g["key"] for g in ttft["by_served"]] == ["model", "without model"]
    assert served["model"] == {
        "key": "model",
        "count": 3,
        "p50": 900.0,
        "p95": 1200.0,
        "p99": 1200.0,
    }
    assert served["without model"]["count"] == 3  # sources only had no first token
    assert served["without model"]["p99"] == 25.0
    by_form = {g["key"]: g["count"] for g in ttft["by_form"]}
    assert by_form == {"quote": 1, "focused": 1, "passages": 2, "abstain": 1, "cached": 1}
    assert list(by_form) == ["quote", "focused", "passages", "abstain", "cached"]  # in order


def test_a_summary_from_an_older_replica_is_read_with_defaults() -> None:
    """A replica from before the answer forms shares the same Redis stream: its summaries lack
    the new fields and must still be read, and counted as an unknown form."""
    new = RequestSummary.answered(*_answered(form="focused"), at=NOW - 5, replica="new:1")
    old_json = new.to_json()
    for field in ("mode", "form", "form_reason", "finish_reason", "unsupported_sentences"):
        del old_json[field]
    del old_json["from_cache"]
    old = RequestSummary.from_json(json.loads(json.dumps(old_json)))
    assert (old.form, old.mode, old.finish_reason, old.unsupported_sentences) == ("", "", "", 0)
    assert old.from_cache is False
    # And a newer replica's extra fields are ignored.
    assert RequestSummary.from_json({**new.to_json(), "added_later": 1}) == new

    snap = snapshot([old, new], now=NOW, source="redis")
    mix = {row["form"]: row["count"] for row in snap["forms"]["mix"]}
    assert mix["unknown"] == 1
    assert mix["focused"] == 1
    assert snap["forms"]["generated"] == 1
    # Neither the model's first tokens nor the rest: it may have been either.
    by_served = {g["key"]: g["count"] for g in snap["ttft"]["by_served"]}
    assert by_served == {"model": 1, "unknown": 1}
