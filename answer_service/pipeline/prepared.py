"""One request once it is prepared: an immutable outcome (`PreparedAnswer`: the plan as prepare
left it, the sources, and the quote, cached answer or abstention that answers without the model)
and one handle (`AnswerHandle`) that owns what must be released, the generation's worker place,
slot, stream and span, and keeps what its stream did. `close_nowait()` is the one place all of
it is released and the request accounted for, without awaiting, so it is safe from any
`finally`, even under cancellation."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field

from opentelemetry.trace import Span, Status, StatusCode

from answer_service.errors import StageTimeoutError
from answer_service.pipeline.admission import Slot
from answer_service.pipeline.attribution import Citation
from answer_service.pipeline.events import (
    AnswerRequest,
    AnswerStats,
    CachedAnswer,
    PlanRecord,
    Queries,
    ShortAnswer,
    Source,
)
from answer_service.pipeline.planning import RequestPlanning
from answer_service.pipeline.ports import AnswerListener
from answer_service.pipeline.values import end_generate_span, plan_attributes
from budget import CacheEstimator, Deadline
from budget.request_plan import RequestPlan
from generation.client import TokenStream
from generation.prefix_routing import PrefixRouter
from generation.prompt_layout import Prompt
from retrieval.sentences.quote import QuotedSentence


@dataclass(frozen=True, slots=True)
class Generation:
    """The open stream of a request that has a prompt, and where it runs."""

    prompt: Prompt
    stream: TokenStream
    span: Span
    worker: str
    slot: Slot
    # Prefill work (tokens) ahead of and including this prompt when it was sent, and when.
    prefill_tokens: float
    sent_s: float = field(default_factory=time.perf_counter)
    # This prompt's tokens the worker was expected not to hold (what it prefills).
    uncached_tokens: float = 0.0


class SentAhead:
    """A prompt sent to SGLang as soon as its passages were final (`RequestPlan.sends_ahead`),
    before the sentences are scored and the evidence and the form decided, so that its prefill
    runs while they are. Taken when the answer is generated over those passages; else
    abandoned: the SGLang request is aborted (on the workers behind a router too), its slot and
    worker place given back, and its uncached prompt tokens counted as wasted prefill. A prompt
    that could not be sent fails the request only where it is taken (an answer without the
    model never needed it), but for one that got no answer by the request's hard deadline: no
    time is left for anything else."""

    def __init__(self) -> None:
        self.sent = False
        self._opened: tuple[Generation, RequestPlan] | None = None
        self._error: Exception | None = None

    async def send(self, opening: Awaitable[tuple[Generation, RequestPlan]]) -> None:
        self.sent = True
        try:
            self._opened = await opening
        except StageTimeoutError:  # not even SGLang's headers by the hard deadline: no time left
            raise
        except Exception as exc:  # kept for `take`; a cancellation goes on as one
            self._error = exc

    def take(self) -> tuple[Generation, RequestPlan]:
        """The open stream and its plan, or the error opening it met, raised now."""
        opened, error = self._opened, self._error
        self.sent, self._opened, self._error = False, None, None
        if error is not None:
            raise error
        if opened is None:
            raise RuntimeError("nothing was sent ahead")
        return opened

    def abandon(self, router: PrefixRouter) -> float:
        """Abort what was sent (without awaiting: safe in any `finally`); the prompt tokens sent
        to be prefilled for nothing."""
        opened = self._opened
        self.sent, self._opened, self._error = False, None, None
        if opened is None:  # it failed before SGLang took it: nothing wasted
            return 0.0
        generation, _ = opened
        generation.stream.close_nowait()
        router.release(generation.worker)
        generation.slot.release()
        generation.span.set_attribute("answer.abandoned", True)
        end_generate_span(generation.span, generation.stream.result)
        return generation.uncached_tokens


@dataclass(slots=True)
class AnswerHandle:
    """What a prepared request holds and what its stream did: the one mutable part of a
    request, written by the answer stream and read once, when it is closed."""

    plan: RequestPlan
    outcome: str
    router: PrefixRouter | None = None
    generation: Generation | None = None
    ttft_ms: float | None = None
    # Whether the model's first token has come (its slot freed, its time learned).
    prefilled: bool = False
    # Why the service ended a generated answer early (repetition, unsupported), if it did.
    stopped: str | None = None
    sentences: int = 0
    unsupported_sentences: int = 0
    closed: bool = False

    def release(self) -> None:
        """Give back the stream, the worker's place and the slot (idempotent)."""
        generation = self.generation
        if generation is None:
            return
        generation.stream.close_nowait()
        if self.router is not None:
            self.router.release(generation.worker)
            self.router = None
        generation.slot.release()


@dataclass(frozen=True, slots=True)
class PreparedAnswer:
    request: AnswerRequest
    # The question as searched (the `plan` event's `searched_query`) and as read.
    queries: Queries
    deadline: Deadline
    root: Span
    # The plan when the request was prepared (the handle's is the latest).
    plan: RequestPlan
    planning: RequestPlanning
    listener: AnswerListener
    handle: AnswerHandle
    cache: CacheEstimator | None = None
    sources: tuple[Source, ...] = ()
    # A complete answer from the answer cache (no retrieval, no generation), or the key this
    # answer is cached under when it completes.
    cached: CachedAnswer | None = None
    cache_key: str | None = None
    # A quoted answer: the sentences streamed with their citations, no model.
    quote: tuple[QuotedSentence, ...] = ()
    # The words of the quote's first sentence that answer, where the span head is sure.
    short_answer: ShortAnswer | None = None
    # Prompt tokens sent ahead to be prefilled and aborted: the answer did not need the model.
    wasted_prefill_tokens: float = 0.0

    @property
    def trace_id(self) -> str:
        return format(self.root.get_span_context().trace_id, "032x")

    @property
    def generation(self) -> Generation | None:
        return self.handle.generation

    @property
    def record(self) -> PlanRecord:
        return self.handle.plan.record(self.planning.config.quality)

    def shown(self) -> None:
        """The client is sent the answer's first text: its time to first token."""
        handle = self.handle
        if handle.ttft_ms is not None:
            return
        handle.ttft_ms = self.deadline.elapsed_ms()
        if handle.generation is not None:
            handle.generation.span.add_event("first_token", {"answer.ttft_ms": handle.ttft_ms})

    def stats(self) -> AnswerStats:
        handle = self.handle
        generation = handle.generation
        result = generation.stream.result if generation else None
        prompt = generation.prompt if generation else None
        cached = self.cached
        return AnswerStats(
            trace_id=self.trace_id,
            outcome=handle.outcome,
            ttft_ms=handle.ttft_ms,
            ttft_budget_ms=self.request.ttft_budget_ms,
            within_budget=handle.ttft_ms is not None
            and handle.ttft_ms <= self.request.ttft_budget_ms,
            stages=handle.plan.actual,
            prompt_tokens=result.prompt_tokens if result else 0,
            cached_tokens=result.cached_tokens if result else 0,
            completion_tokens=result.completion_tokens
            if result
            else (cached.completion_tokens if cached else 0),
            finish_reason=handle.stopped
            or (
                result.finish_reason
                if result
                else (cached.finish_reason if cached else self._finish_without_model())
            ),
            passages_in_prompt=len(prompt.passages) if prompt else 0,
            passages_dropped=prompt.dropped_passages if prompt else 0,
            degraded=self.plan.degraded(),
            prompt_layout=prompt.layout if prompt else "none",
            expected_cached_tokens=prompt.expected_cached_tokens if prompt else 0,
            worker=generation.worker if generation else "",
            from_cache=cached is not None,
            form=self.form,
            form_reason=handle.plan.form_reason,
            sentences=handle.sentences,
            unsupported_sentences=handle.unsupported_sentences,
            wasted_prefill_tokens=round(self.wasted_prefill_tokens),
        )

    def _finish_without_model(self) -> str:
        outcome = self.handle.outcome
        return "quote" if self.quote and outcome == "ok" else outcome

    @property
    def form(self) -> str:
        """The form that answered: the plan's, or why the model was not asked."""
        outcome = self.handle.outcome
        if outcome in ("abstained", "sources_only"):
            return "abstain" if outcome == "abstained" else "sources_only"
        return self.handle.plan.form

    def cacheable(
        self, stats: AnswerStats, text: str, citations: Sequence[Citation]
    ) -> CachedAnswer | None:
        """This answer as the cache keeps it, if it is complete: generated, not cut, not
        degraded, not cut short."""
        complete = stats.outcome == "ok" and stats.finish_reason in ("stop", "length")
        if self.generation is None or not complete or stats.degraded or self.plan.cuts:
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
        """Release what the request holds and account for it, once."""
        handle = self.handle
        if handle.closed:
            return
        handle.closed = True
        generation = handle.generation
        handle.release()
        if generation is not None:
            end_generate_span(generation.span, generation.stream.result)
            if not handle.prefilled and handle.outcome == "error":
                # No first token: it took at least this long.
                elapsed_ms = (time.perf_counter() - generation.sent_s) * 1000.0
                self.planning.observe(
                    "first_token", generation.prefill_tokens, elapsed_ms, generation.worker
                )
                handle.plan = handle.plan.first_token_at(elapsed_ms)
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
