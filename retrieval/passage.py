"""Passages: the unit that is embedded, searched, shown as a source and put in a prompt."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from retrieval.corpus import Document


@dataclass(frozen=True, slots=True)
class Passage:
    """A window of a document's tokens.

    `passage_id` is `<doc_id>#<position>`, stable for a given corpus and chunking; `position`
    is the window's index in its document and `start_char`/`end_char` its place in the text.
    """

    passage_id: str
    doc_id: str
    position: int
    title: str
    text: str
    start_char: int
    end_char: int


@dataclass(frozen=True, slots=True)
class ScoredPassage:
    passage: Passage
    score: float


class TokenSpanner(Protocol):
    """Splits text into the embedder's tokens, as character spans."""

    def token_spans(self, text: str) -> Sequence[tuple[int, int]]: ...


@dataclass(frozen=True, slots=True)
class ChunkingConfig:
    passage_tokens: int = 200
    overlap_tokens: int = 40

    def __post_init__(self) -> None:
        if self.passage_tokens <= 0:
            raise ValueError("passage_tokens must be positive")
        if not 0 <= self.overlap_tokens < self.passage_tokens:
            raise ValueError("overlap_tokens must be in [0, passage_tokens)")


def split_document(
    document: Document, spanner: TokenSpanner, config: ChunkingConfig
) -> Iterator[Passage]:
    """Windows of `passage_tokens` tokens, each overlapping the previous by `overlap_tokens`.

    A window's text is the exact slice of the document between its first and last token, so
    nothing is re-tokenized or normalised. A document without tokens yields nothing.
    """
    spans = spanner.token_spans(document.text)
    stride = config.passage_tokens - config.overlap_tokens
    start = 0
    position = 0
    while start < len(spans):
        window = spans[start : start + config.passage_tokens]
        start_char, end_char = window[0][0], window[-1][1]
        yield Passage(
            passage_id=f"{document.doc_id}#{position}",
            doc_id=document.doc_id,
            position=position,
            title=document.title,
            text=document.text[start_char:end_char],
            start_char=start_char,
            end_char=end_char,
        )
        if start + config.passage_tokens >= len(spans):
            break
        start += stride
        position += 1
