"""`/metrics` as Prometheus reads it, from answers built the way the pipeline reports them:
answers by form and mode, how they ended, unsupported sentences, and first tokens per form
beside the all-forms TTFT histogram that dashboards already read."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from answer_service.pipeline.events import AnswerStats, PlanRecord
from answer_service.runtime.observability.metrics import ServiceMetrics
from budget.planner import Knobs, StageTimes

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def _answer(
    *,
    form: str,
    mode: str = "auto",
    tier: str = "standard",
    outcome: str = "ok",
    ttft_ms: float | None = 900.0,
    finish_reason: str = "stop",
    unsupported: int = 0,
    from_cache: bool = False,
) -> tuple[AnswerStats, PlanRecord]:
    stats = AnswerStats(
        trace_id="ab" * 16,
        outcome=outcome,
        ttft_ms=ttft_ms,
        ttft_budget_ms=2000,
        within_budget=ttft_ms is not None and ttft_ms <= 2000,
        stages=StageTimes(),
        prompt_tokens=0,
        cached_tokens=0,
        completion_tokens=0,
        finish_reason=finish_reason,
        passages_in_prompt=0,
        passages_dropped=0,
        degraded=(),
        from_cache=from_cache,
        form=form,
        form_reason="test",
        unsupported_sentences=unsupported,
    )
    plan = PlanRecord(
        planner=True,
        tier=tier,
        budget_ms=2000,
        knobs=Knobs(0, 3, 10),
        initial=Knobs(0, 3, 10),
        quality=0.9,
        predicted_ms=StageTimes(),
        actual_ms=StageTimes(),
        cuts=(),
        queue_wait_ms=0.0,
        worker="",
        form=form,
        mode=mode,
        form_reason="test",
    )
    return stats, plan


def _samples(metrics: ServiceMetrics) -> Samples:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(metrics.exposition().decode())
        for sample in family.samples
    }


def _help(metrics: ServiceMetrics, name: str) -> str:
    families = text_string_to_metric_families(metrics.exposition().decode())
    return next(f.documentation for f in families if f.name == name)


def test_answers_are_counted_by_form_and_mode_with_how_they_ended() -> None:
    metrics = ServiceMetrics()
    metrics.answered(*_answer(form="quote", mode="quote", finish_reason="quote", ttft_ms=20.0))
    metrics.answered(*_answer(form="focused", finish_reason="repetition"))
    metrics.answered(*_answer(form="passages", finish_reason="unsupported", unsupported=1))
    metrics.answered(*_answer(form="passages", unsupported=2, tier="premium"))
    metrics.answered(
        *_answer(form="abstain", outcome="abstained", finish_reason="abstained", ttft_ms=15.0)
    )
    metrics.answered(
        *_answer(form="sources_only", outcome="sources_only", finish_reason="", ttft_ms=None)
    )
    metrics.answered(*_answer(form="passages", from_cache=True, ttft_ms=3.0))

    samples = _samples(metrics)

    def forms(tier: str, mode: str, form: str) -> float:
        key = ("answer_forms_total", (("form", form), ("mode", mode), ("tier", tier)))
        return samples.get(key, 0.0)

    assert forms("standard", "quote", "quote") == 1
    assert forms("standard", "auto", "focused") == 1
    assert forms("standard", "auto", "passages") == 1
    assert forms("premium", "auto", "passages") == 1
    assert forms("standard", "auto", "abstain") == 1
    assert forms("standard", "auto", "sources_only") == 1
    assert forms("standard", "auto", "cached") == 1  # not counted as a passages answer
    finish = {
        labels: value for (name, labels), value in samples.items() if name == "answer_finish_total"
    }
    assert finish == {
        (("reason", "quote"), ("tier", "standard")): 1,
        (("reason", "repetition"), ("tier", "standard")): 1,
        (("reason", "unsupported"), ("tier", "standard")): 1,
        (("reason", "stop"), ("tier", "premium")): 1,
        (("reason", "abstained"), ("tier", "standard")): 1,
        (("reason", "none"), ("tier", "standard")): 1,  # no finish reason reported
        (("reason", "stop"), ("tier", "standard")): 1,
    }
    unsupported = "answer_unsupported_sentences_total"
    assert samples[(unsupported, (("tier", "standard"),))] == 1
    assert samples[(unsupported, (("tier", "premium"),))] == 2
    assert "without the model" in _help(metrics, "answer_forms")
    assert "repetition" in _help(metrics, "answer_finish")


def test_first_tokens_are_timed_per_form_and_all_together() -> None:
    metrics = ServiceMetrics()
    metrics.answered(*_answer(form="quote", ttft_ms=4.0))
    metrics.answered(*_answer(form="passages", ttft_ms=3000.0))
    metrics.answered(*_answer(form="passages", from_cache=True, ttft_ms=2.0))
    metrics.answered(*_answer(form="sources_only", outcome="sources_only", ttft_ms=None))

    samples = _samples(metrics)

    def bucket(form: str, le: str) -> float:
        labels = (("form", form), ("le", le), ("tier", "standard"))
        return samples[("answer_form_ttft_seconds_bucket", labels)]

    # A quote's milliseconds land in buckets of their own, below the model's.
    assert bucket("quote", "0.0025") == 0
    assert bucket("quote", "0.005") == 1
    assert bucket("cached", "0.0025") == 1
    assert bucket("passages", "2.0") == 0
    assert bucket("passages", "3.0") == 1
    count = "answer_form_ttft_seconds_count"
    assert (count, (("form", "sources_only"), ("tier", "standard"))) not in samples
    # The existing histogram keeps its name and its one label, over all forms.
    assert samples[("answer_ttft_seconds_count", (("tier", "standard"),))] == 3
    assert samples[("answer_ttft_seconds_sum", (("tier", "standard"),))] == pytest.approx(3.006)
