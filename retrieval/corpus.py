"""Reading a JSONL corpus: one document per line with `_id`, `title` and `text`."""

from __future__ import annotations

import gzip
import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from retrieval.errors import CorpusFormatError

_CHUNK_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class Document:
    doc_id: str
    title: str
    text: str


def _open_text(path: Path) -> IO[str]:
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8")
    return path.open("r", encoding="utf-8")


def _parse_line(path: Path, line_no: int, line: str) -> Document:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise CorpusFormatError(path, line_no, f"not valid JSON ({exc.msg})") from exc
    if not isinstance(record, dict):
        raise CorpusFormatError(path, line_no, "expected a JSON object")
    doc_id = record.get("_id")
    text = record.get("text")
    title = record.get("title", "")
    if not isinstance(doc_id, str) or not doc_id.strip():
        raise CorpusFormatError(path, line_no, "`_id` must be a non-empty string")
    if "#" in doc_id:
        raise CorpusFormatError(path, line_no, "`_id` must not contain '#' (used in passage ids)")
    if not isinstance(text, str):
        raise CorpusFormatError(path, line_no, "`text` must be a string")
    if not isinstance(title, str):
        raise CorpusFormatError(path, line_no, "`title` must be a string")
    return Document(doc_id=doc_id, title=title, text=text)


def read_corpus(path: Path) -> Iterator[Document]:
    """Stream documents from `path` (plain or .gz JSONL), refusing bad lines and duplicate ids.

    Blank lines are skipped; a bad line raises `CorpusFormatError` with its 1-based number.
    """
    seen: set[str] = set()
    with _open_text(path) as lines:
        for line_no, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            document = _parse_line(path, line_no, line)
            if document.doc_id in seen:
                raise CorpusFormatError(path, line_no, f"duplicate `_id` {document.doc_id!r}")
            seen.add(document.doc_id)
            yield document


def corpus_checksum(path: Path) -> str:
    """sha256 of the corpus file's bytes, as `sha256:<hex>`."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK_BYTES):
            digest.update(chunk)
    return f"sha256:{digest.hexdigest()}"
