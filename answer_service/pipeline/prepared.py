"""One request from its arrival to its `done`: the plan as it stands, the sources, and, when the
model is asked, the open stream and what it holds. `close_nowait()` is the one place all of it
is released, without awaiting, so it is safe from any `finally`, even under cancellation."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from opentelemetry.trace import Span, Status, StatusCode

from answer_service.pipeline.admission import Slot
from answer_service.pipeline.attribution import Citation
from answer_service.pipeline.events import (
    AnswerRequest,
    AnswerStats,
    CachedAnswer,
    PlanRecord,
    Source,
    StageTimings,
)
from answer_service.pipeline.planning import RequestPlanning
from answer_service.pipeline.ports import AnswerListener
from answer_service.pipeline.request_plan import RequestPlan
from answer_service.pipeline.values import end_generate_span, plan_attributes
from budget import CacheEstimator, Deadline
from generation.client import TokenStream
from generation.prefix_routing import PrefixRouter
from generation.prompt_layout import Prompt
from retrieval.sentences.quote import QuotedSentence


@dataclass(slots=True)
class Generation:
    """The open stream of a request that has a prompt, and what it holds while it runs."""

    prompt: Prompt
    stream: TokenStream
    span: Span
    worker: str
    router: PrefixRouter
    slot: Slot
    # Prefill work (tokens) ahead of and including this prompt when it was sent, and when.
    prefill_tokens: float
    sent_s: float = field(default_factory=time.perf_counter)


@dataclass(slots=True)
class PreparedAnswer:
    request: AnswerRequest
    deadline: Deadline
    root: Span
    plan: RequestPlan
    planning: RequestPlanning
    listener: AnswerListener
    cache: CacheEstimator | None = None
    sources: tuple[Source, ...] = ()
    timings: StageTimings = field(default_factory=StageTimings)
    generation: Generation | None = None
    degraded: tuple[str, ...] = ()
    outcome: str = "ok"
    ttft_ms: float | None = None
    # A complete answer from the answer cache (no retrieval, no generation), or the key this
    # answer is cached under when it completes.
    cached: CachedAnswer | None = None
    cache_key: str | None = None
    # A quoted answer: the sentences streamed with their citations, no model.
    quote: tuple[QuotedSentence, ...] = ()
    # Why the service ended a generated answer early (repetition, unsupported), if it did.
    stopped: str | None = None
    sentences: int = 0
    unsupported_sentences: int = 0
    _closed: bool = field(default=False)

    @property
    def trace_id(self) -> str:
        return format(self.root.get_span_context().trace_id, "032x")

    @property
    def record(self) -> PlanRecord:
        return self.plan.record(self.planning.config.quality)

    def first_token(self) -> None:
        """The first token arrived: time it, free the slot, teach the first-token model."""
        self.ttft_ms = self.deadline.elapsed_ms()
        generation = self.generation
        if generation is None:
            return
        generation.span.add_event("first_token", {"answer.ttft_ms": self.ttft_ms})
        generation.slot.prefilled()
        self._observe_first_token(generation)

    def _observe_first_token(self, generation: Generation) -> None:
        elapsed_ms = (time.perf_counter() - generation.sent_s) * 1000.0
        self.planning.observe(
            "first_token", generation.prefill_tokens, elapsed_ms, generation.worker
        )
        self.plan = self.plan.spent(first_token=elapsed_ms)

    def stats(self) -> AnswerStats:
        generation = self.generation
        result = generation.stream.result if generation else None
        prompt = generation.prompt if generation else None
        cached = self.cached
        return AnswerStats(
            trace_id=self.trace_id,
            outcome=self.outcome,
            ttft_ms=self.ttft_ms,
            ttft_budget_ms=self.request.ttft_budget_ms,
            within_budget=self.ttft_ms is not None and self.ttft_ms <= self.request.ttft_budget_ms,
            stages=self.timings,
            prompt_tokens=result.prompt_tokens if result else 0,
            cached_tokens=result.cached_tokens if result else 0,
            completion_tokens=result.completion_tokens
            if result
            else (cached.completion_tokens if cached else 0),
            finish_reason=self.stopped
            or (
                result.finish_reason
                if result
                else (cached.finish_reason if cached else self._finish_without_model())
            ),
            passages_in_prompt=len(prompt.passages) if prompt else 0,
            passages_dropped=prompt.dropped_passages if prompt else 0,
            degraded=self.degraded,
            prompt_layout=prompt.layout if prompt else "none",
            expected_cached_tokens=prompt.expected_cached_tokens if prompt else 0,
            worker=generation.worker if generation else "",
            from_cache=cached is not None,
            form=self.form,
            form_reason=self.plan.form_reason,
            sentences=self.sentences,
            unsupported_sentences=self.unsupported_sentences,
        )

    def _finish_without_model(self) -> str:
        return "quote" if self.quote and self.outcome == "ok" else self.outcome

    @property
    def form(self) -> str:
        """The form that answered: the plan's, or why the model was not asked."""
        if self.outcome in ("abstained", "sources_only"):
            return "abstain" if self.outcome == "abstained" else "sources_only"
        return self.plan.form

    def cacheable(
        self, stats: AnswerStats, text: str, citations: Sequence[Citation]
    ) -> CachedAnswer | None:
        """This answer as the cache keeps it, if it is complete: generated, not cut, not
        degraded, not cut short."""
        complete = stats.outcome == "ok" and stats.finish_reason in ("stop", "length")
        if self.generation is None or not complete or self.degraded or self.plan.cuts:
            return None
        return CachedAnswer(
            text,
            self.sources,
            tuple(citations),
            stats.completion_tokens,
            stats.finish_reason,
            self.plan.form,
        )

    def close_nowait(self) -> None:
        if self._closed:
            return
        self._closed = True
        generation = self.generation
        if generation is not None:
            generation.stream.close_nowait()
            end_generate_span(generation.span, generation.stream.result)
            generation.router.release(generation.worker)
            if not generation.slot.released:
                generation.slot.release()
                if self.outcome == "error":  # no first token: at least this long
                    self._observe_first_token(generation)
        stats = self.stats()
        if self.cache is not None and generation and generation.stream.result is not None:
            self.cache.observe(
                generation.worker,
                stats.prompt_tokens,
                stats.expected_cached_tokens,
                stats.cached_tokens,
            )
        record = self.record
        self.listener.answered(stats, record)
        self.root.set_attributes(
            {
                **plan_attributes(record),
                "answer.outcome": stats.outcome,
                "answer.within_budget": stats.within_budget,
                "answer.ttft_ms": stats.ttft_ms if stats.ttft_ms is not None else -1.0,
                "answer.degraded": stats.degraded,
            }
        )
        if stats.outcome not in ("ok", "cancelled", "sources_only"):
            self.root.set_status(Status(StatusCode.ERROR, stats.outcome))
        self.root.end()
