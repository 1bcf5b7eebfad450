"""Small conversions the answer pipeline makes: retrieved passages into prompt passages and
numbered sources, generation results into span attributes, generation errors into `error`
events, and a refused request's root span."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from opentelemetry.trace import Span, Status, StatusCode

from answer_service.errors import ServiceError
from answer_service.pipeline.events import ErrorEvent, PlanRecord, Source
from budget.planner import STAGES
from generation.client import GenerationResult
from generation.errors import GenerationError, GenerationTimeoutError, SGLangUnavailableError
from generation.prompt_layout import ContextPassage, Prompt
from retrieval.passage import Passage, ScoredPassage


def end_generate_span(span: Span, result: GenerationResult | None) -> None:
    if result is not None:
        span.set_attributes(
            {
                "gen_ai.usage.input_tokens": result.prompt_tokens,
                "gen_ai.usage.output_tokens": result.completion_tokens,
                "gen_ai.usage.cache_read.input_tokens": result.cached_tokens,
                "gen_ai.response.finish_reasons": (result.finish_reason,),
                "gen_ai.response.id": result.rid,
            }
        )
    span.end()


def generate_attributes(
    model: str, max_tokens: int, temperature: float
) -> dict[str, str | int | float]:
    """The `generate` span's request attributes (GenAI semantic conventions)."""
    return {
        "gen_ai.operation.name": "text_completion",
        "gen_ai.system": "sglang",
        "gen_ai.request.model": model,
        "gen_ai.request.max_tokens": max_tokens,
        "gen_ai.request.temperature": temperature,
    }


def context_passages(scored: Sequence[ScoredPassage]) -> list[ContextPassage]:
    """Retrieved passages as the prompt shows them, numbered in retrieval order (the layout
    renumbers them by position)."""
    return [
        ContextPassage(n, sp.passage.passage_id, sp.passage.title, sp.passage.text)
        for n, sp in enumerate(scored, start=1)
    ]


def passage_lookup(find: Callable[[str], Passage | None]) -> Callable[[str], ContextPassage | None]:
    """The index's passages by id, as the prompt shows them (for passages a remembered prefix
    brings along)."""

    def lookup(passage_id: str) -> ContextPassage | None:
        found = find(passage_id)
        return None if found is None else ContextPassage(0, passage_id, found.title, found.text)

    return lookup


def numbered_sources(
    scored: Sequence[ScoredPassage],
    prompt: Prompt,
    snippet_chars: int,
    find: Callable[[str], Passage | None],
) -> tuple[Source, ...]:
    """The prompt's passages as sources, numbered as the prompt numbers them ([n] in the answer
    is source n). Passages retrieved but not given to the model are not sources of this
    answer. A passage a remembered prefix brought along (adopted: retrieval did not rank it
    for this question) has score 0."""
    by_id = {sp.passage.passage_id: sp for sp in scored}
    for passage_id in prompt.adopted:
        if (found := find(passage_id)) is not None:
            by_id.setdefault(passage_id, ScoredPassage(found, 0.0))
    return tuple(
        _source(p.number, by_id[p.source_id], snippet_chars)
        for p in prompt.passages
        if p.source_id in by_id
    )


def ranked_sources(
    scored: Sequence[ScoredPassage], top_k: int, snippet_chars: int
) -> tuple[Source, ...]:
    """Sources in retrieval order, for an answer that has no prompt."""
    return tuple(_source(n, sp, snippet_chars) for n, sp in enumerate(scored[:top_k], start=1))


def plan_attributes(plan: PlanRecord) -> dict[str, str | bool | float | int]:
    """The plan on the root span: knobs, predicted and actual ms per stage, cuts."""
    attributes: dict[str, str | bool | float | int] = {
        "plan.planner": plan.planner,
        "plan.tier": plan.tier,
        "plan.rerank_depth": plan.knobs.rerank_depth,
        "plan.passages": plan.knobs.passages,
        "plan.retrieve_k": plan.knobs.retrieve_k,
        "plan.initial.rerank_depth": plan.initial.rerank_depth,
        "plan.initial.passages": plan.initial.passages,
        "plan.quality": plan.quality,
        "plan.queue_wait_ms": plan.queue_wait_ms,
        "plan.cuts": len(plan.cuts),
    }
    for stage in STAGES:
        attributes[f"plan.predicted_ms.{stage}"] = round(getattr(plan.predicted_ms, stage), 2)
        attributes[f"plan.actual_ms.{stage}"] = round(getattr(plan.actual_ms, stage), 2)
    for n, cut in enumerate(plan.cuts):
        attributes[f"plan.cut.{n}"] = f"{cut.stage}: {cut.planned}->{cut.done} ({cut.reason})"
    return attributes


def _source(number: int, scored: ScoredPassage, snippet_chars: int) -> Source:
    passage = scored.passage
    return Source(
        number=number,
        passage_id=passage.passage_id,
        doc_id=passage.doc_id,
        title=passage.title,
        score=round(scored.score, 4),
        snippet=passage.text[:snippet_chars],
        url=passage.url,
        heading_path=passage.heading_path,
    )


def error_event(exc: GenerationError) -> ErrorEvent:
    if isinstance(exc, GenerationTimeoutError):
        return ErrorEvent("generate", "generation_timeout", str(exc))
    if isinstance(exc, SGLangUnavailableError):
        return ErrorEvent("generate", "generation_unavailable", str(exc))
    return ErrorEvent("generate", "generation_failed", str(exc))


def end_refused(span: Span, exc: BaseException) -> None:
    """End a request's root span with what ended it before any event. A `ServiceError` is an
    answer (a refusal, a bad request), not a bug: recorded without its traceback, whose
    formatting was ~40% of a refusal's time in the service."""
    if isinstance(exc, ServiceError):
        attributes = {"exception.type": type(exc).__name__, "exception.message": exc.message[:500]}
        span.add_event("exception", attributes)
    else:
        span.record_exception(exc)
    span.set_attribute("answer.outcome", type(exc).__name__)
    span.set_status(Status(StatusCode.ERROR, str(exc)[:200]))
    span.end()
