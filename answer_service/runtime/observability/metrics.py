"""Prometheus metrics of the answers the service gives, served at `GET /metrics`.

One registry per app (tests build several apps in one process). Labelled by tenant tier and, for
stage timings and cuts, by stage; the cached-token counters by SGLang worker, so the cache's
share per worker is `rate(answer_cached_tokens_total[5m]) / rate(answer_prompt_tokens_total[5m])`
and SLO attainment `rate(answer_ttft_budget_total{met="true"}[5m])` over all of it.

Answer forms (form_labels.py): `answer_forms_total{tier, mode, form}` counts answers by
the form that gave them and the `answer_mode` asked for, `answer_finish_total{tier, reason}` how
they ended, `answer_unsupported_sentences_total{tier}` the sentences no source supports, and
`answer_form_ttft_seconds{tier, form}` times the first token per form, so a quote's milliseconds
and the model's seconds are read apart (`answer_ttft_seconds` still holds them all). The
repetition stops among model-served answers:
`rate(answer_finish_total{reason="repetition"}[5m]) /
sum(rate(answer_forms_total{form=~"focused|passages"}[5m]))`.
"""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from answer_service.pipeline.events import AnswerStats, PlanRecord
from answer_service.pipeline.ports import AnswerListener
from answer_service.runtime.observability.form_labels import served_form
from budget.planner import STAGES

# First tokens and stages: from a few ms (a cached prompt on a GPU) to the CPU's tens of seconds.
_SECONDS = (0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 7.5, 10.0, 20.0, 40.0)
# A refusal should take milliseconds: fine steps around the 10 ms it should stay under.
_REFUSAL_SECONDS = (0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.05, 0.1, 0.5)
# First tokens of every form: a quote's or the answer cache's few ms up to the model's seconds.
_FORM_SECONDS = (0.001, 0.0025, 0.005, 0.01, *_SECONDS)


class ServiceMetrics:
    def __init__(self, listeners: Sequence[AnswerListener] = ()) -> None:
        self.listeners = tuple(listeners)
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "answer_requests",
            "Answer requests by how they ended: ok, error, cancelled, sources_only, or the error "
            "code they were refused or failed with before streaming (overloaded, stage_timeout, "
            "...).",
            ("tier", "outcome"),
            registry=self.registry,
        )
        self.ttft = Histogram(
            "answer_ttft_seconds",
            "Time from arrival to the first token, answers that had one.",
            ("tier",),
            buckets=_SECONDS,
            registry=self.registry,
        )
        self.budget = Counter(
            "answer_ttft_budget",
            "Answers that started streaming, by whether the first token came within its budget "
            "(`met`): SLO attainment is met=true over all.",
            ("tier", "met"),
            registry=self.registry,
        )
        self.stages = Histogram(
            "answer_stage_seconds",
            "Time spent per stage (embed, search, rerank, prompt, first_token).",
            ("stage", "tier"),
            buckets=_SECONDS,
            registry=self.registry,
        )
        self.cuts = Counter(
            "answer_cuts",
            "Work the plan had that a request did not get (rerank to retrieval order, fewer "
            "passages, sources only).",
            ("stage", "tier"),
            registry=self.registry,
        )
        self.prompt_tokens = Counter(
            "answer_prompt_tokens",
            "Prompt tokens sent to SGLang.",
            ("worker",),
            registry=self.registry,
        )
        self.cached_tokens = Counter(
            "answer_cached_tokens",
            "Prompt tokens SGLang served from its prefix cache.",
            ("worker",),
            registry=self.registry,
        )
        self.wasted_prefill_tokens = Counter(
            "answer_wasted_prefill_tokens",
            "Uncached prompt tokens sent to SGLang before the answer's form was decided (their "
            "prefill overlapping the decision) and aborted when the answer needed no model (an "
            "abstention): prefill spent for nothing, to be read against answer_prompt_tokens.",
            ("tier",),
            registry=self.registry,
        )
        self.refusal = Histogram(
            "answer_refusal_seconds",
            "Time from a request reaching the service to its refusal (429 or 503, with "
            "Retry-After) handed to the HTTP server, by status: the service's part of what a "
            "refused client waits.",
            ("status",),
            buckets=_REFUSAL_SECONDS,
            registry=self.registry,
        )
        self._add_form_metrics()

    def _add_form_metrics(self) -> None:
        self.forms = Counter(
            "answer_forms",
            "Answers by the form that gave them (form) and the answer_mode asked for (mode: "
            "auto, quote, focused, passages): quote (sentences of the sources, no model), "
            "focused or passages (the model, from excerpts or from whole passages), abstain (the "
            "service said it does not know: an answer without the model), sources_only (the "
            "sources alone: no plan made the budget), cached (served whole from the answer "
            "cache).",
            ("tier", "mode", "form"),
            registry=self.registry,
        )
        self.finish = Counter(
            "answer_finish",
            "Answers by how they ended (reason): stop or length (the model ended, or reached "
            "its token limit), repetition (the service stopped a degenerate loop), unsupported "
            "(the service stopped before a sentence no source supports), quote (a quoted "
            "answer), abstained or sources_only (no model asked), or error, cancelled, abort "
            "when the answer did not finish.",
            ("tier", "reason"),
            registry=self.registry,
        )
        self.unsupported = Counter(
            "answer_unsupported_sentences",
            "Sentences of generated answers that no source supports (marked, dropped, or the "
            "one stopped at, by ANSWER_UNSUPPORTED).",
            ("tier",),
            registry=self.registry,
        )
        self.form_ttft = Histogram(
            "answer_form_ttft_seconds",
            "Time from arrival to the first token by the form that answered (quote, focused, "
            "passages, abstain, cached): a quote's milliseconds are not mixed with the model's "
            "seconds. answer_ttft_seconds holds the same first tokens, all forms together.",
            ("tier", "form"),
            buckets=_FORM_SECONDS,
            registry=self.registry,
        )

    def answered(self, stats: AnswerStats, plan: PlanRecord) -> None:
        """A request that got as far as its sources: whatever happened after."""
        tier = plan.tier
        for listener in self.listeners:
            listener.answered(stats, plan)
        self.requests.labels(tier, stats.outcome).inc()
        if stats.ttft_ms is not None:
            self.ttft.labels(tier).observe(stats.ttft_ms / 1000.0)
            self.budget.labels(tier, "true" if stats.within_budget else "false").inc()
        for stage in STAGES:
            elapsed_ms = plan.actual_ms.of(stage)
            if elapsed_ms > 0:
                self.stages.labels(stage, tier).observe(elapsed_ms / 1000.0)
        for cut in plan.cuts:
            self.cuts.labels(cut.stage, tier).inc()
        if stats.wasted_prefill_tokens:
            self.wasted_prefill_tokens.labels(tier).inc(stats.wasted_prefill_tokens)
        if stats.worker:
            self.prompt_tokens.labels(stats.worker).inc(stats.prompt_tokens)
            self.cached_tokens.labels(stats.worker).inc(stats.cached_tokens)
        self._count_form(stats, plan)

    def _count_form(self, stats: AnswerStats, plan: PlanRecord) -> None:
        tier = plan.tier
        form = served_form(stats.form, from_cache=stats.from_cache)
        self.forms.labels(tier, plan.mode, form).inc()
        self.finish.labels(tier, stats.finish_reason or "none").inc()
        # Every tier that answered has the series, at 0 until a sentence is unsupported.
        self.unsupported.labels(tier).inc(stats.unsupported_sentences)
        if stats.ttft_ms is not None:
            self.form_ttft.labels(tier, form).observe(stats.ttft_ms / 1000.0)

    def refused(self, *, trace_id: str, tier: str, code: str, budget_ms: float) -> None:
        """A request that ended with an HTTP error before any event was sent."""
        for listener in self.listeners:
            listener.refused(trace_id=trace_id, tier=tier, code=code, budget_ms=budget_ms)
        self.requests.labels(tier, code).inc()

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
