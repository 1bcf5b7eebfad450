"""Prometheus metrics of the answers the service gives, served at `GET /metrics`.

One registry per app (tests build several apps in one process). Labelled by tenant tier and, for
stage timings and cuts, by stage; the cached-token counters by SGLang worker, so the cache's
share per worker is `rate(answer_cached_tokens_total[5m]) / rate(answer_prompt_tokens_total[5m])`
and SLO attainment `rate(answer_ttft_budget_total{met="true"}[5m])` over all of it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from answer_service.pipeline.events import AnswerStats, PlanRecord
from budget.planner import STAGES

# First tokens and stages: from a few ms (a cached prompt on a GPU) to the CPU's tens of seconds.
_SECONDS = (0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 7.5, 10.0, 20.0, 40.0)
# A refusal should take milliseconds: fine steps around the 10 ms it should stay under.
_REFUSAL_SECONDS = (0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.05, 0.1, 0.5)


class RequestListener(Protocol):
    """Something else that wants every finished or refused request (the dashboard's log)."""

    def answered(self, stats: AnswerStats, plan: PlanRecord) -> None: ...

    def refused(self, *, trace_id: str, tier: str, code: str, budget_ms: float) -> None: ...


class ServiceMetrics:
    def __init__(self, listeners: Sequence[RequestListener] = ()) -> None:
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
        self.refusal = Histogram(
            "answer_refusal_seconds",
            "Time from a request reaching the service to its refusal (429 or 503, with "
            "Retry-After) handed to the HTTP server, by status: the service's part of what a "
            "refused client waits.",
            ("status",),
            buckets=_REFUSAL_SECONDS,
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
        if stats.worker:
            self.prompt_tokens.labels(stats.worker).inc(stats.prompt_tokens)
            self.cached_tokens.labels(stats.worker).inc(stats.cached_tokens)

    def refused(self, *, trace_id: str, tier: str, code: str, budget_ms: float) -> None:
        """A request that ended with an HTTP error before any event was sent."""
        for listener in self.listeners:
            listener.refused(trace_id=trace_id, tier=tier, code=code, budget_ms=budget_ms)
        self.requests.labels(tier, code).inc()

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
