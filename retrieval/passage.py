"""Passages: the unit that is embedded, searched, shown as a source and put in a prompt."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from retrieval.corpus import Document, DocumentSection

HEADING_SEPARATOR = " \u203a "  # a single right-pointing angle quotation mark


@dataclass(frozen=True, slots=True)
class Passage:
    """A window of a document's tokens.

    `passage_id` is `<doc_id>#<position>`, stable for a given corpus and chunking; `position`
    is the window's index in its document and `start_char`/`end_char` its place in the text.
    A passage lies inside one section of its document: `heading_path` (page title first),
    `path`, `anchor`, `page` and `url` are that section's (all empty for a JSONL document, whose
    passages are stored as they were before sections existed). `collection`, `path`, `tags` and
    `modified` are the document's metadata, which search filters read (retrieval/search/filters.py).
    """

    passage_id: str
    doc_id: str
    position: int
    title: str
    text: str
    start_char: int
    end_char: int
    heading_path: tuple[str, ...] = ()
    path: str | None = None
    anchor: str | None = None
    page: int | None = None
    url: str | None = None
    collection: str = "default"
    # The document's tags (front matter `tags:`, else its folders) and when it last changed
    # (ISO 8601: front matter `date:`/`modified:`, else the file's mtime); what filters read.
    tags: tuple[str, ...] = ()
    modified: str | None = None

    @property
    def heading(self) -> str:
        """What is indexed before the text: the heading path, else the document title."""
        return HEADING_SEPARATOR.join(self.heading_path) if self.heading_path else self.title


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
    """Windows of `passage_tokens` tokens, each overlapping the previous by `overlap_tokens`,
    cut inside each section (a document without sections is one section).

    A window's text is the exact slice of the document between its first and last token, so
    nothing is re-tokenized or normalised. Positions count on across sections. A document
    without tokens yields nothing.
    """
    sections = document.sections or (DocumentSection(0, len(document.text)),)
    position = 0
    for section in sections:
        text = document.text[section.start_char : section.end_char]
        for start_char, end_char in _windows(spanner.token_spans(text), config):
            start_char += section.start_char
            end_char += section.start_char
            yield Passage(
                passage_id=f"{document.doc_id}#{position}",
                doc_id=document.doc_id,
                position=position,
                title=document.title,
                text=document.text[start_char:end_char],
                start_char=start_char,
                end_char=end_char,
                heading_path=section.heading_path,
                path=document.path,
                anchor=section.anchor,
                page=section.page,
                url=section.url,
                collection=document.collection,
                tags=document.tags,
                modified=document.modified,
            )
            position += 1


def _windows(spans: Sequence[tuple[int, int]], config: ChunkingConfig) -> Iterator[tuple[int, int]]:
    stride = config.passage_tokens - config.overlap_tokens
    start = 0
    while start < len(spans):
        window = spans[start : start + config.passage_tokens]
        yield window[0][0], window[-1][1]
        if start + config.passage_tokens >= len(spans):
            break
        start += stride
