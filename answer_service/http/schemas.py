"""Pydantic models at the HTTP edge: request bodies, SSE payloads and JSON answers."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
)

from answer_service.mcp.tool_values import SearchFilters
from answer_service.pipeline.attribution import Citation
from answer_service.pipeline.events import (
    AnswerStats,
    ErrorEvent,
    PlanRecord,
    ShortAnswer,
    Source,
)
from budget.forms import AnswerMode
from budget.planner import StageTimes
from retrieval.passage import Passage

# Where a passage's section lives, when the index knows (`index build --source-url`, a canonical
# link, front matter), and its headings; null (or left out) for a passage from JSONL.
SectionUrl = Annotated[
    str | None, Field(description="The section's URL; null when the document has none.")
]
HeadingPath = Annotated[
    list[str] | None,
    Field(description="The section's headings, page title first; null when it has none."),
]


def _headings(heading_path: tuple[str, ...]) -> list[str] | None:
    return list(heading_path) or None


class FiltersIn(SearchFilters):
    """Which passages retrieval may draw on; every condition given must hold (docs/collections.md).
    With API keys, a key reads only its own collections: naming another is refused (403). The
    same fields, limits and descriptions as the MCP tools' `filters` (one model, so the two
    edges cannot drift apart)."""

    @property
    def collections(self) -> frozenset[str] | None:
        if self.collection is None:
            return None
        return frozenset([self.collection] if isinstance(self.collection, str) else self.collection)


# A conversation's history on `POST /v1/answer`: at most this many turns and this many bytes
# of content (UTF-8) in all; the rewrite reads only the latest turns.
MAX_HISTORY_TURNS = 50
MAX_HISTORY_BYTES = 32 * 1024


class TurnIn(BaseModel):
    """One earlier message of the conversation."""

    model_config = ConfigDict(extra="forbid")

    role: Literal["user", "assistant"]
    content: StrictStr


class AnswerBody(BaseModel):
    """`POST /v1/answer`. Unknown fields and wrong types are refused, not coerced."""

    model_config = ConfigDict(extra="forbid")

    query: StrictStr = Field(min_length=1, max_length=100_000, description="The question.")
    ttft_budget_ms: StrictInt | None = Field(
        default=None, gt=0, description="Time-to-first-token budget in milliseconds."
    )
    top_k: StrictInt | None = Field(default=None, ge=1, description="Passages to retrieve.")
    stream: StrictBool = Field(default=True, description="Server-Sent Events, or one JSON object.")
    allow_sources_only: StrictBool = Field(
        default=False,
        description="When no plan can make the budget, answer with the sources alone (an "
        "empty answer) instead of refusing with 503.",
    )
    answer_mode: AnswerMode | None = Field(
        default=None,
        description="quote: the sentences of the sources that answer, without the model; "
        "focused: the model answers from those sentences and their neighbours; passages: from "
        "whole passages; auto: the planner picks per request. Default: the service's "
        "(ANSWER_MODE).",
    )
    filters: FiltersIn | None = Field(
        default=None, description="Answer only from the passages these filters allow."
    )
    history: list[TurnIn] = Field(
        default=[],
        max_length=MAX_HISTORY_TURNS,
        description="The conversation before `query`, oldest first: a follow-up is searched "
        "with the earlier questions' salient words (the `plan` event's `searched_query`). At "
        f"most {MAX_HISTORY_TURNS} turns and {MAX_HISTORY_BYTES // 1024} KiB of content.",
    )


class ServiceFields(BaseModel):
    """The answer engine's own fields on the OpenAI-shaped routes (the `openai` client's
    `extra_body`): what `AnswerBody` takes besides the query and `stream`, plus the tier."""

    model_config = ConfigDict(extra="forbid")

    ttft_budget_ms: StrictInt | None = Field(default=None, gt=0)
    top_k: StrictInt | None = Field(default=None, ge=1)
    tier: StrictStr | None = None
    allow_sources_only: StrictBool = False
    answer_mode: AnswerMode | None = None
    filters: FiltersIn | None = None


class PassageOut(BaseModel):
    """`GET /v1/passages/{id}`: a passage of the index the service serves."""

    id: str
    doc_id: str
    title: str
    text: str
    url: SectionUrl = None
    heading_path: HeadingPath = None

    @classmethod
    def of(cls, passage: Passage) -> PassageOut:
        return cls(
            id=passage.passage_id,
            doc_id=passage.doc_id,
            title=passage.title,
            text=passage.text,
            url=passage.url,
            heading_path=_headings(passage.heading_path),
        )


class RetrieveBody(BaseModel):
    """`POST /v1/retrieve`: the retrieval stage alone (for evaluation and debugging)."""

    model_config = ConfigDict(extra="forbid")

    query: StrictStr = Field(min_length=1, max_length=100_000)
    top_k: StrictInt = Field(default=10, ge=1)
    # A search mode the index serves (`GET /v1/retrieve/modes`); default: the service's.
    mode: str | None = Field(default=None, min_length=1, max_length=64)
    filters: FiltersIn | None = Field(
        default=None, description="The top_k of the passages these filters allow."
    )


class RetrievedOut(BaseModel):
    id: str
    doc_id: str
    title: str
    score: float
    text: str
    url: SectionUrl = None
    heading_path: HeadingPath = None

    @classmethod
    def of(cls, passage: Passage, score: float) -> RetrievedOut:
        return cls(
            id=passage.passage_id,
            doc_id=passage.doc_id,
            title=passage.title,
            score=score,
            text=passage.text,
            url=passage.url,
            heading_path=_headings(passage.heading_path),
        )


class RetrieveOut(BaseModel):
    mode: str
    passages: list[RetrievedOut]
    timings_ms: dict[str, float]


class ModesOut(BaseModel):
    modes: list[str]


class SourceOut(BaseModel):
    number: int
    id: str
    doc_id: str
    title: str
    score: float
    snippet: str
    url: SectionUrl = None
    heading_path: HeadingPath = None

    @classmethod
    def of(cls, source: Source) -> SourceOut:
        return cls(
            number=source.number,
            id=source.passage_id,
            doc_id=source.doc_id,
            title=source.title,
            score=source.score,
            snippet=source.snippet,
            url=source.url,
            heading_path=_headings(source.heading_path),
        )


class SourcesPayload(BaseModel):
    sources: list[SourceOut]


class ShortAnswerOut(BaseModel):
    """The words of a quoted answer that answer the question: `text` is characters
    `start`..`end` of the quote (the answer's text as the tokens carry it). The quoted
    sentence stays the evidence and what the citation points at. Absent where the answer is
    not a quote or the span head is not sure of a span."""

    text: str
    start: int
    end: int

    @classmethod
    def of(cls, short: ShortAnswer | None) -> ShortAnswerOut | None:
        return None if short is None else cls(text=short.text, start=short.start, end=short.end)


class TokenPayload(BaseModel):
    text: str


class CitationPayload(BaseModel):
    """Answer sentence `sentence` (characters start..end of the answer) and the sources that
    support it; `supported` is false when none covers enough of it (`score`: the best
    coverage)."""

    sentence: int
    start: int
    end: int
    sources: list[int]
    score: float
    supported: bool

    @classmethod
    def of(cls, citation: Citation) -> CitationPayload:
        return cls(
            sentence=citation.sentence,
            start=citation.start,
            end=citation.end,
            sources=list(citation.sources),
            score=citation.score,
            supported=citation.supported,
        )


class ErrorPayload(BaseModel):
    stage: str
    code: str
    message: str

    @classmethod
    def of(cls, event: ErrorEvent) -> ErrorPayload:
        return cls(stage=event.stage, code=event.code, message=event.message)


class TimingsOut(BaseModel):
    embed: float
    search: float
    rerank: float
    sentences: float
    # The sentence reader's share of the time after `sentences` (0: it did not read).
    read: float = 0.0
    prompt: float
    generate: float


class DonePayload(BaseModel):
    trace_id: str
    outcome: str
    ttft_ms: float | None
    ttft_budget_ms: int
    within_budget: bool
    timings_ms: TimingsOut
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    finish_reason: str
    passages_in_prompt: int
    passages_dropped: int
    degraded: list[str]
    prompt_layout: str
    expected_cached_tokens: int
    worker: str
    # Served whole from the answer cache (no retrieval, no generation).
    from_cache: bool = False
    # The form that answered: quote, focused, passages, abstain or sources_only; and why.
    form: str = "passages"
    form_reason: str = ""
    # Sentences of a generated answer that no source supports.
    unsupported_sentences: int = 0
    # The quote's short answer (also sent before its first token), where there is one.
    short_answer: ShortAnswerOut | None = None
    # Prompt tokens sent to SGLang ahead of the form's decision and aborted when it decided
    # the answer needs no model (an "I do not know").
    wasted_prefill_tokens: int = 0

    @classmethod
    def of(cls, stats: AnswerStats, short: ShortAnswer | None = None) -> DonePayload:
        stages = stats.stages
        return cls(
            trace_id=stats.trace_id,
            outcome=stats.outcome,
            ttft_ms=None if stats.ttft_ms is None else round(stats.ttft_ms, 2),
            ttft_budget_ms=stats.ttft_budget_ms,
            within_budget=stats.within_budget,
            timings_ms=TimingsOut(
                embed=round(stages.embed, 2),
                search=round(stages.search, 2),
                rerank=round(stages.rerank, 2),
                sentences=round(stages.sentences, 2),
                read=round(stages.read, 2),
                prompt=round(stages.prompt, 2),
                generate=round(stages.generate, 2),
            ),
            prompt_tokens=stats.prompt_tokens,
            cached_tokens=stats.cached_tokens,
            completion_tokens=stats.completion_tokens,
            finish_reason=stats.finish_reason,
            passages_in_prompt=stats.passages_in_prompt,
            passages_dropped=stats.passages_dropped,
            degraded=list(stats.degraded),
            prompt_layout=stats.prompt_layout,
            expected_cached_tokens=stats.expected_cached_tokens,
            worker=stats.worker,
            from_cache=stats.from_cache,
            form=stats.form,
            form_reason=stats.form_reason,
            unsupported_sentences=stats.unsupported_sentences,
            short_answer=ShortAnswerOut.of(short),
            wasted_prefill_tokens=stats.wasted_prefill_tokens,
        )


class StageMsOut(BaseModel):
    embed: float
    search: float
    rerank: float
    sentences: float
    prompt: float
    first_token: float

    @classmethod
    def of(cls, times: StageTimes) -> StageMsOut:
        return cls(
            embed=round(times.embed, 2),
            search=round(times.search, 2),
            rerank=round(times.rerank, 2),
            sentences=round(times.sentences, 2),
            prompt=round(times.prompt, 2),
            first_token=round(times.first_token, 2),
        )


class CutOut(BaseModel):
    stage: str
    reason: str
    planned: int
    done: int


class PlanPayload(BaseModel):
    """The `plan` event: what the planner chose, what it predicted, what happened so far."""

    planner: bool
    tier: str
    budget_ms: float
    rerank_depth: int
    passages: int
    retrieve_k: int
    initial_rerank_depth: int
    initial_passages: int
    quality: float
    predicted_ms: StageMsOut
    actual_ms: StageMsOut
    cuts: list[CutOut]
    queue_wait_ms: float
    worker: str
    # The answer_mode asked for, the form chosen for it, and why.
    mode: str = "auto"
    form: str = "passages"
    form_reason: str = ""
    # The smallest generated answer's typical time to a first token on an idle worker, from the
    # stage models (measured here at warm-up): a budget under it gets a quote or a 422.
    floor_ms: float = 0.0
    # The query retrieval searched: the question, or a follow-up made standalone.
    searched_query: str = ""

    @classmethod
    def of(cls, plan: PlanRecord, searched_query: str = "") -> PlanPayload:
        return cls(
            planner=plan.planner,
            tier=plan.tier,
            budget_ms=plan.budget_ms,
            rerank_depth=plan.knobs.rerank_depth,
            passages=plan.knobs.passages,
            retrieve_k=plan.knobs.retrieve_k,
            initial_rerank_depth=plan.initial.rerank_depth,
            initial_passages=plan.initial.passages,
            quality=round(plan.quality, 4),
            predicted_ms=StageMsOut.of(plan.predicted_ms),
            actual_ms=StageMsOut.of(plan.actual_ms),
            cuts=[
                CutOut(stage=c.stage, reason=c.reason, planned=c.planned, done=c.done)
                for c in plan.cuts
            ],
            queue_wait_ms=round(plan.queue_wait_ms, 2),
            worker=plan.worker,
            mode=plan.mode,
            form=plan.form,
            form_reason=plan.form_reason,
            floor_ms=round(plan.floor_ms, 1),
            searched_query=searched_query,
        )


class AnswerOut(BaseModel):
    """The non-streaming answer: what the stream would have carried, in one object."""

    # With ` [n]` after each sentence that source n supports (the service's attribution).
    answer: str
    plan: PlanPayload
    sources: list[SourceOut]
    # One per answer sentence, including those nothing supports.
    citations: list[CitationPayload] = []
    # A quote's short answer: characters start..end of `answer` (markers follow sentences).
    short_answer: ShortAnswerOut | None = None
    done: DonePayload
    error: ErrorPayload | None = None


class ErrorBody(BaseModel):
    code: str
    message: str
    details: list[dict[str, object]] | None = None


class ErrorResponse(BaseModel):
    error: ErrorBody


class ReadyOut(BaseModel):
    ready: bool
    reasons: list[str]
    index_passages: int | None = None
    sglang_url: str
    model: str | None = None
    reranker: str
    # `not configured`, `up`, or `down: <error>`; the service answers either way.
    redis: str = "not configured"
    # SGLang workers that fail their health check while another still answers.
    workers_down: list[str] = []
    # The typical time to a first token of the smallest generated answer on an idle worker, from
    # the stage timings measured here at warm-up (None: not calibrated); a budget under it gets
    # a quote or a 422, never a generated answer.
    calibrated_floor_ms: float | None = None
    # The stage models timed at warm-up (`first_token@<worker>` per worker); a stage not listed
    # plans from the shipped priors.
    calibrated_stages: list[str] = []
    # Prefills each SGLang worker runs at once: measured at warm-up unless configured.
    generation_slots: dict[str, int] = {}
