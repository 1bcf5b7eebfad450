"""What flows out of the answer pipeline: the request it answers, the sources, token deltas,
errors and the final statistics, as plain values (the API turns them into SSE payloads)."""

from __future__ import annotations

from dataclasses import dataclass

from retrieval.passage import ScoredPassage


@dataclass(frozen=True, slots=True)
class AnswerRequest:
    query: str
    ttft_budget_ms: int
    top_k: int


@dataclass(frozen=True, slots=True)
class Source:
    number: int
    passage_id: str
    doc_id: str
    title: str
    score: float
    snippet: str


@dataclass(frozen=True, slots=True)
class StageTimings:
    embed_ms: float = 0.0
    search_ms: float = 0.0
    rerank_ms: float = 0.0
    prompt_ms: float = 0.0
    generate_ms: float = 0.0


@dataclass(frozen=True, slots=True)
class AnswerStats:
    trace_id: str
    outcome: str
    ttft_ms: float | None
    ttft_budget_ms: int
    within_budget: bool
    stages: StageTimings
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    finish_reason: str
    passages_in_prompt: int
    passages_dropped: int
    degraded: tuple[str, ...]
    prompt_layout: str = "relevance"
    # The prefix the layout expected the worker to hold (system prompt + continued passages).
    expected_cached_tokens: int = 0
    worker: str = ""


@dataclass(frozen=True, slots=True)
class Retrieved:
    passages: list[ScoredPassage]
    timings: StageTimings
    degraded: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class SourcesEvent:
    sources: tuple[Source, ...]


@dataclass(frozen=True, slots=True)
class TokenEvent:
    text: str


@dataclass(frozen=True, slots=True)
class ErrorEvent:
    stage: str
    code: str
    message: str


@dataclass(frozen=True, slots=True)
class DoneEvent:
    stats: AnswerStats


PipelineEvent = SourcesEvent | TokenEvent | ErrorEvent | DoneEvent
