"""Small conversions the answer pipeline makes: retrieved passages into numbered sources,
generation results into span attributes, generation errors into `error` events."""

from __future__ import annotations

from collections.abc import Callable

from opentelemetry.trace import Span, Status, StatusCode

from answer_service.errors import (
    InvalidRequestError,
    RoutedWorkerLostError,
    ServiceError,
    StageTimeoutError,
    UpstreamError,
    UpstreamUnavailableError,
)
from answer_service.pipeline.events import ErrorEvent, PlanRecord, Source
from generation.errors import (
    GenerationError,
    GenerationTimeoutError,
    PromptTooLongError,
    SGLangRequestError,
    SGLangUnavailableError,
    WorkerLostError,
)
from generation.prefix_order import PrefixTree, PromptLayout
from generation.prompt_layout import ChatTemplate, ContextPassage, Prompt, build_prompt
from generation.sglang_client import (
    GenerationResult,
    GenerationStream,
    SamplingParams,
    SGLangClient,
    StreamTimeouts,
)
from retrieval.index.ann import SearchDepth
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
    model: str, max_tokens: int, temperature: float, prompt: Prompt
) -> dict[str, str | int | float]:
    """The `generate` span's request attributes (GenAI semantic conventions) and the prompt's."""
    return {
        "gen_ai.operation.name": "text_completion",
        "gen_ai.system": "sglang",
        "gen_ai.request.model": model,
        "gen_ai.request.max_tokens": max_tokens,
        "gen_ai.request.temperature": temperature,
        "answer.prompt.passages": len(prompt.passages),
        "answer.prompt.tokens_estimate": prompt.prompt_tokens,
        "answer.prompt.layout": prompt.layout,
        "answer.prompt.expected_cached_tokens": prompt.expected_cached_tokens,
    }


def depth_attributes(depth: SearchDepth | None) -> dict[str, int]:
    if depth is None:
        return {}
    attributes = {"retrieval.nprobe": depth.nprobe, "retrieval.ef_search": depth.ef_search}
    return {key: value for key, value in attributes.items() if value is not None}


def laid_out_prompt(
    question: str,
    scored: list[ScoredPassage],
    template: ChatTemplate,
    tree: PrefixTree,
    *,
    limit: int,
    max_prompt_tokens: int,
    layout: PromptLayout,
    slack: int,
    adopt: int,
    find: Callable[[str], Passage | None],
) -> Prompt:
    """A prompt of the best `limit` of `scored` (not yet remembered in `tree`: it may not be
    sent); passages adopted from a remembered prefix are found by id in the index (`find`)."""

    def lookup(passage_id: str) -> ContextPassage | None:
        found = find(passage_id)
        return None if found is None else ContextPassage(0, passage_id, found.title, found.text)

    passages = [
        ContextPassage(n, sp.passage.passage_id, sp.passage.title, sp.passage.text)
        for n, sp in enumerate(scored, start=1)
    ]
    return build_prompt(
        question,
        passages,
        template,
        max_prompt_tokens=max_prompt_tokens,
        layout=layout,
        tree=tree,
        limit=limit,
        slack=slack,
        adopt=adopt,
        lookup=lookup,
        remember=False,
    )


def numbered_sources(
    scored: list[ScoredPassage],
    prompt: Prompt,
    top_k: int,
    snippet_chars: int,
    find: Callable[[str], Passage | None],
) -> tuple[Source, ...]:
    """Sources numbered as the prompt numbers them ([n] in the answer is source n), in prompt
    order; passages of the best `top_k` that are not in the prompt (they did not fit, or a
    cached one took their place) follow in retrieval order. A passage a remembered prefix
    brought along (adopted: retrieval did not rank it for this question) has score 0."""
    in_prompt = {p.source_id: p.number for p in prompt.passages}
    left_out = (sp for sp in scored[:top_k] if sp.passage.passage_id not in in_prompt)
    by_id = {sp.passage.passage_id: sp for sp in scored}
    for passage_id in prompt.adopted:
        if (found := find(passage_id)) is not None:
            by_id.setdefault(passage_id, ScoredPassage(found, 0.0))
    placed = [(p.number, by_id[p.source_id]) for p in prompt.passages if p.source_id in by_id]
    placed += [(n, sp) for n, sp in enumerate(left_out, start=len(placed) + 1)]
    return tuple(_source(n, sp, snippet_chars) for n, sp in placed)


def ranked_sources(
    scored: list[ScoredPassage], top_k: int, snippet_chars: int
) -> tuple[Source, ...]:
    """Sources in retrieval order, for an answer that has no prompt (sources only)."""
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
    for stage in ("embed", "search", "rerank", "prompt", "first_token"):
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
    )


def error_event(exc: GenerationError) -> ErrorEvent:
    if isinstance(exc, GenerationTimeoutError):
        return ErrorEvent("generate", "generation_timeout", str(exc))
    if isinstance(exc, SGLangUnavailableError):
        return ErrorEvent("generate", "generation_unavailable", str(exc))
    return ErrorEvent("generate", "generation_failed", str(exc))


async def open_stream(
    sglang: SGLangClient, prompt: str, params: SamplingParams, timeouts: StreamTimeouts
) -> GenerationStream:
    """SGLang's stream for a prompt, its failures as the service's errors."""
    try:
        return await sglang.open_stream(prompt, params, timeouts)
    except WorkerLostError as exc:
        raise RoutedWorkerLostError(str(exc), retry_after_s=1) from exc
    except SGLangUnavailableError as exc:
        raise UpstreamUnavailableError(str(exc), retry_after_s=5) from exc
    except PromptTooLongError as exc:
        raise InvalidRequestError(f"the prompt does not fit the model: {exc}") from exc
    except SGLangRequestError as exc:
        raise UpstreamError(str(exc)) from exc
    except GenerationTimeoutError as exc:  # not even the response's headers in time
        raise StageTimeoutError(str(exc)) from exc


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
