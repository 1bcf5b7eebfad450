"""Documents, and reading a JSONL corpus: one document per line with `_id`, `title` and `text`.

A document read from a file (`retrieval/ingest/`) also carries its sections: consecutive spans
of its text, each with its heading path and location. Passages are cut inside one section.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from retrieval.errors import CorpusFormatError
from retrieval.jsonl import json_objects, unique_id

_CHUNK_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class DocumentSection:
    """`text[start_char:end_char]` of its document, under `heading_path` (page title first).

    `anchor` (an HTML id or Markdown slug) or `page` (1-based, PDF) says where it is in its file;
    `url` links to it when the document's URL is known.
    """

    start_char: int
    end_char: int
    heading_path: tuple[str, ...] = ()
    anchor: str | None = None
    page: int | None = None
    url: str | None = None


@dataclass(frozen=True, slots=True)
class Document:
    """A JSONL line, or a parsed file. `sections` empty: the whole text is one section.

    `path` is the file it came from (as shown to users), `collection` what it was built into,
    `tags` its front matter's `tags:` (else the folders it lies in, below the folder given) and
    `modified` when it last changed (ISO 8601, front matter `date:`/`modified:`, else the
    file's mtime; None for a JSONL line).
    """

    doc_id: str
    title: str
    text: str
    sections: tuple[DocumentSection, ...] = ()
    path: str | None = None
    collection: str = "default"
    tags: tuple[str, ...] = ()
    modified: str | None = None


def read_corpus(path: Path, collection: str = "default") -> Iterator[Document]:
    """Stream documents from `path` (plain or .gz JSONL), refusing bad lines and duplicate ids.

    Blank lines are skipped; a bad line raises `CorpusFormatError` with its 1-based number.
    """
    seen: set[str] = set()
    for line_no, record in json_objects(path):
        doc_id = unique_id(path, line_no, record, seen)
        text = record.get("text")
        title = record.get("title", "")
        if "#" in doc_id:
            raise CorpusFormatError(
                path, line_no, "`_id` must not contain '#' (used in passage ids)"
            )
        if not isinstance(text, str):
            raise CorpusFormatError(path, line_no, "`text` must be a string")
        if not isinstance(title, str):
            raise CorpusFormatError(path, line_no, "`title` must be a string")
        yield Document(doc_id=doc_id, title=title, text=text, collection=collection)


def corpus_checksum(path: Path) -> str:
    """sha256 of the corpus file's bytes, as `sha256:<hex>`."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK_BYTES):
            digest.update(chunk)
    return f"sha256:{digest.hexdigest()}"
