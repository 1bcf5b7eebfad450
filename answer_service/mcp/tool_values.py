"""What the tools take and give back: pydantic models at the MCP edge. The SDK builds each
tool's input and output JSON Schema from them and validates a call's arguments before the
tool runs (a bad argument is a tool error naming the field, and no call reaches the service).

The limits mirror the service's own request bodies (`http/schemas.py`); the service checks its
configured limits again (`max_retrieve_k`, `max_ttft_budget_ms`) and its refusal comes back as
the tool's error message.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

Name = Annotated[str, StringConstraints(strict=True, min_length=1, max_length=200)]
Query = Annotated[
    str,
    StringConstraints(strict=True, min_length=1, max_length=100_000),
    Field(description="The question or search terms, in natural language."),
]
TopK = Annotated[int, Field(ge=1, description="How many passages to return.")]
BudgetMs = Annotated[
    int | None,
    Field(
        gt=0,
        description="The time-to-first-token budget in milliseconds; the service plans the "
        "answer to fit it (default: the service's, 3,000 ms).",
    ),
]
PassageId = Annotated[
    str,
    StringConstraints(strict=True, min_length=1, max_length=2000),
    Field(description="A passage id as `search` or `answer` gave it, e.g. `guide/vacuum.md#3`."),
]


class SearchFilters(BaseModel):
    """Which passages may be searched; every condition given must hold. With API keys, a key
    reads only its own collections: naming another is refused."""

    model_config = ConfigDict(extra="forbid")

    collection: Name | Annotated[list[Name], Field(min_length=1, max_length=64)] | None = Field(
        default=None, description="A collection, or a list of them: passages in any of them."
    )
    path_prefix: (
        Annotated[str, StringConstraints(strict=True, min_length=1, max_length=1000)] | None
    ) = Field(default=None, description="Passages of documents whose path starts with this.")
    tags: Annotated[list[Name], Field(min_length=1, max_length=64)] | None = Field(
        default=None, description="Passages of documents that carry every one of these tags."
    )

    def body(self) -> dict[str, Any]:
        """The service's `filters` field."""
        return self.model_dump(exclude_none=True)


UrlField = Annotated[
    str,
    Field(
        description="The section's own URL where the index knows it, else the service's "
        "`GET /v1/passages/{id}` for the passage."
    ),
]


class SearchHit(BaseModel):
    id: str = Field(description="The passage id, for `get_passage`.")
    doc_id: str
    title: str
    url: UrlField
    score: float
    text: str
    heading_path: list[str] | None = None


class SearchResult(BaseModel):
    mode: str = Field(description="The search mode that ranked them: dense, lexical or hybrid.")
    passages: list[SearchHit]


class AnswerSource(BaseModel):
    number: int = Field(description="What `[n]` in the answer and `sources` in citations name.")
    id: str
    title: str
    url: UrlField
    snippet: str


class AnswerCitation(BaseModel):
    """Answer sentence `sentence` (characters start..end of `answer`) and the sources that
    support it; `supported` is false when none does."""

    sentence: int
    start: int
    end: int
    sources: list[int]
    supported: bool


class AnswerResult(BaseModel):
    answer: str = Field(
        description="The answer, with ` [n]` after each sentence source n supports."
    )
    short_answer: str | None = Field(
        default=None,
        description="The answer in a few words, found inside the quoted sentence, where the "
        "service is sure of one; else null.",
    )
    sources: list[AnswerSource]
    citations: list[AnswerCitation]
    form: str = Field(
        description="How it was answered: quote, focused, passages, abstain (the sources do not "
        "answer it: 'I do not know') or sources_only."
    )
    ttft_ms: float | None = Field(description="The service's time to the answer's first token.")
    within_budget: bool
    trace_id: str


class PassageResult(BaseModel):
    id: str
    doc_id: str
    title: str
    url: UrlField
    text: str
    heading_path: list[str] | None = None
