"""What a prepared answer streams: `plan`, `sources`, then the answer's text as token deltas
with a `citation` after each finished sentence, then `done`; a failure mid-stream adds `error`
before `done`. An answer given without the model (the answer cache, an abstention, sources
only) streams the same events."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from opentelemetry.trace import Status, StatusCode

from answer_service.pipeline.attribution import (
    ABSTENTION,
    SUPPORT_THRESHOLD,
    Attributor,
    Citation,
    SentenceSplitter,
)
from answer_service.pipeline.events import (
    CitationEvent,
    DoneEvent,
    ErrorEvent,
    PipelineEvent,
    PlanEvent,
    SourcesEvent,
    TokenEvent,
)
from answer_service.pipeline.ports import AnswerStore
from answer_service.pipeline.prepared import PreparedAnswer
from answer_service.pipeline.values import error_event
from generation.errors import GenerationError

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class CitationConfig:
    # Answer sentences cite the prompt passages covering this share of their terms.
    threshold: float = SUPPORT_THRESHOLD
    max_sources: int = 2


async def answer_events(
    prepared: PreparedAnswer, config: CitationConfig, store: AnswerStore | None
) -> AsyncIterator[PipelineEvent]:
    yield PlanEvent(prepared.record)
    yield SourcesEvent(prepared.sources)
    if prepared.outcome == "abstained":
        prepared.first_token()
        yield TokenEvent(ABSTENTION)
    if (cached := prepared.cached) is not None:
        prepared.first_token()
        yield TokenEvent(cached.text)
        for citation in cached.citations:
            yield CitationEvent(citation)
    parts: list[str] = []
    citations: list[Citation] = []
    error: ErrorEvent | None = None
    generation = prepared.generation
    generate_started_s = time.perf_counter()
    try:
        if generation is not None:
            attributor = Attributor(
                [(p.number, f"{p.title}\n{p.text}") for p in generation.prompt.passages],
                threshold=config.threshold,
                max_sources=config.max_sources,
            )
            splitter = SentenceSplitter()
            async for delta in generation.stream:
                if prepared.ttft_ms is None:
                    prepared.first_token()
                parts.append(delta.text)
                yield TokenEvent(delta.text)
                for sentence in splitter.feed(delta.text):
                    citations.append(attributor.cite(sentence))
                    yield CitationEvent(citations[-1])
            for sentence in splitter.finish():
                citations.append(attributor.cite(sentence))
                yield CitationEvent(citations[-1])
    except GenerationError as exc:
        error = error_event(exc)
        prepared.outcome = "error"
        assert generation is not None
        generation.span.record_exception(exc)
        generation.span.set_status(Status(StatusCode.ERROR, error.message[:200]))
        logger.warning("generation failed trace_id=%s code=%s", prepared.trace_id, error.code)
    except BaseException:
        prepared.outcome = "cancelled"
        raise
    finally:
        if generation is not None:
            prepared.timings = dataclasses.replace(
                prepared.timings,
                generate_ms=(time.perf_counter() - generate_started_s) * 1000.0,
            )
        prepared.close_nowait()
    if error is not None:
        yield error
    stats = prepared.stats()
    cacheable = prepared.cacheable(stats, "".join(parts), citations) if not error else None
    if store is not None and prepared.cache_key and cacheable is not None:
        store.put(prepared.cache_key, cacheable)
    yield DoneEvent(stats)
