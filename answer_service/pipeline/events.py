"""What flows out of the answer pipeline: the request it answers, the sources, token deltas,
errors and the final statistics, as plain values (the API turns them into SSE payloads). The
plan's record and its cuts are budget/'s values, named here too for the API's use."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

from answer_service.pipeline.attribution import Citation
from budget.forms import AnswerMode
from budget.planner import StageTimes
from budget.request_plan import Cut, PlanRecord
from retrieval.query_rewrite import Turn
from retrieval.search.filters import PassageFilter

__all__ = [
    "AnswerRequest",
    "AnswerStats",
    "CachedAnswer",
    "CitationEvent",
    "Cut",
    "DoneEvent",
    "ErrorEvent",
    "PipelineEvent",
    "PlanEvent",
    "PlanRecord",
    "Queries",
    "ShortAnswer",
    "ShortAnswerEvent",
    "Source",
    "SourcesEvent",
    "TokenEvent",
]


@dataclass(frozen=True, slots=True)
class AnswerRequest:
    query: str
    ttft_budget_ms: int
    # The most passages the prompt may hold; the planner may give it fewer.
    top_k: int
    tier: str = "standard"
    # When no plan can make the budget: answer with the sources alone instead of refusing.
    allow_sources_only: bool = False
    # The API key that asked (its id, on the root span): whose trace it is.
    key_id: str | None = None
    # quote, focused, passages or auto; None: the service's default (ANSWER_MODE).
    answer_mode: AnswerMode | None = None
    # The passages it may draw on: the request's filters within its key's collections.
    # None: every passage. Retrieval, the prompt, its sources and the answer cache keep to it.
    passage_filter: PassageFilter | None = None
    # The conversation before `query`, oldest first: a follow-up is searched as the rewrite
    # stage makes it (retrieval/query_rewrite.py) and read as asked (`Queries`).
    history: tuple[Turn, ...] = ()


@dataclass(frozen=True, slots=True)
class Queries:
    """The question as retrieval searches it and as reading reads it.

    A question without history is both. A follow-up is searched with the words the rewrite
    carries from earlier turns (they find the page) and read in its own words with the carried
    entities alone (`Rewrite.read`): the sentence scorer, the reader, the form choice and the
    quote's cut weigh those, so that the carried plain words do not pull the quote towards
    sentences about the earlier turn; abstention takes the stronger evidence of the two. The
    prompt and the `plan` event take `searched`; the answer cache's key takes both (two
    requests searched alike but read differently answer differently).
    """

    searched: str
    read: str

    @classmethod
    def of(cls, question: str) -> Queries:
        return cls(question, question)

    @property
    def split(self) -> bool:
        return self.searched != self.read


@dataclass(frozen=True, slots=True)
class Source:
    """A passage an answer draws on, numbered as the answer cites it ([n] is source n).

    `url` is where the passage's section lives (from `--source-url`, a canonical link or front
    matter at build time; None when the document has none) and `heading_path` its section's
    headings, page title first (empty for a JSONL document)."""

    number: int
    passage_id: str
    doc_id: str
    title: str
    score: float
    snippet: str
    url: str | None = None
    heading_path: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class AnswerStats:
    trace_id: str
    outcome: str
    ttft_ms: float | None
    ttft_budget_ms: int
    within_budget: bool
    stages: StageTimes
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
    # Served whole from the answer cache.
    from_cache: bool = False
    # The form that answered (quote, focused, passages, abstain, sources_only) and why.
    form: str = "passages"
    form_reason: str = ""
    # Sentences of a generated answer the service checked, and those no source supports.
    sentences: int = 0
    unsupported_sentences: int = 0
    # Prompt tokens sent ahead to be prefilled while the form was decided, then aborted.
    wasted_prefill_tokens: int = 0


@dataclass(frozen=True, slots=True)
class PlanEvent:
    record: PlanRecord
    # The query retrieval searched: the question, or a follow-up as the rewrite made it.
    searched_query: str = ""


@dataclass(frozen=True, slots=True)
class SourcesEvent:
    sources: tuple[Source, ...]


@dataclass(frozen=True, slots=True)
class TokenEvent:
    text: str


@dataclass(frozen=True, slots=True)
class CitationEvent:
    """An answer sentence has finished: the sources that support it (or none)."""

    citation: Citation


@dataclass(frozen=True, slots=True)
class ErrorEvent:
    stage: str
    code: str
    message: str


@dataclass(frozen=True, slots=True)
class ShortAnswer:
    """The few words of a quote that answer (retrieval/sentences/span.py):
    `quote[start:end] == text`, where the quote is the answer's text as its tokens carry it
    (the first quoted sentence holds it; citation markers come after a sentence, so they do
    not move it)."""

    text: str
    start: int
    end: int


@dataclass(frozen=True, slots=True)
class ShortAnswerEvent:
    """Sent before the quote's first token."""

    short_answer: ShortAnswer


@dataclass(frozen=True, slots=True)
class DoneEvent:
    stats: AnswerStats
    # The quote's short answer again, for a client that reads only the end.
    short_answer: ShortAnswer | None = None


PipelineEvent = (
    PlanEvent
    | SourcesEvent
    | ShortAnswerEvent
    | TokenEvent
    | CitationEvent
    | ErrorEvent
    | DoneEvent
)


@dataclass(frozen=True, slots=True)
class CachedAnswer:
    text: str
    sources: tuple[Source, ...]
    citations: tuple[Citation, ...]
    completion_tokens: int
    finish_reason: str
    # The form that gave it (a cached answer keeps saying how it was made).
    form: str = "passages"

    def to_bytes(self) -> bytes:
        return json.dumps(asdict(self), separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> CachedAnswer:
        raw: dict[str, Any] = json.loads(data)
        return cls(
            text=str(raw["text"]),
            sources=tuple(_source(s) for s in raw["sources"]),
            citations=tuple(
                Citation(**{**c, "sources": tuple(c["sources"])}) for c in raw["citations"]
            ),
            completion_tokens=int(raw["completion_tokens"]),
            finish_reason=str(raw["finish_reason"]),
            form=str(raw.get("form", "passages")),
        )


def _source(raw: dict[str, Any]) -> Source:
    """A cached source; an entry written before sources had a URL and heading path has none."""
    return Source(**{**raw, "heading_path": tuple(raw.get("heading_path", ()))})
