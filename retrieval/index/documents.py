"""The documents an index generation holds, and where their passages are (`documents.json`).

A sync compares what it finds against this table: a file whose bytes hash the same is not
read again, a document whose content hashes the same keeps its passages, vectors and
sentences; anything else is parsed and embedded anew, and what is no longer found is removed.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Literal

from retrieval.corpus import Document
from retrieval.errors import IndexMismatchError
from retrieval.ingest.parsers import PARSER_VERSION
from retrieval.passage import ChunkingConfig, Passage

DOCUMENTS_FILE = "documents.json"
TABLE_VERSION = 1

# files: from `index build`/`index sync` over files and folders; api: put over HTTP (a folder
# sync never removes these).
Origin = Literal["files", "api"]


@dataclass(frozen=True, slots=True)
class DocumentRecord:
    """`first_row` and `rows`: the document's passages are rows [first_row, first_row + rows).

    `source`: the file it was read from, as shown to users (a JSONL file holds many
    documents); `file_hash` its bytes' sha256 when it was read; `content_hash` the
    document's own (title, text, sections); `ingest` the parser, chunking and URL settings
    it was cut with (another value re-parses it)."""

    doc_id: str
    collection: str
    origin: Origin
    source: str | None
    file_hash: str | None
    content_hash: str
    ingest: str
    first_row: int
    rows: int
    title: str = ""
    path: str | None = None

    def moved_to(self, first_row: int) -> DocumentRecord:
        return replace(self, first_row=first_row)


def content_hash(document: Document) -> str:
    """What a document would be indexed as: a change to any of it changes its passages."""
    parts = [
        document.doc_id,
        document.title,
        document.text,
        document.path,
        document.collection,
        list(document.tags),
        [asdict(section) for section in document.sections],
    ]
    return hashlib.sha256(json.dumps(parts, ensure_ascii=False).encode()).hexdigest()


def file_hash(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def rows_of(
    records: dict[str, DocumentRecord], passages: Iterable[Passage]
) -> list[DocumentRecord]:
    """`records` (by document id) with the rows their passages hold, in row order; a document
    that made no passage is left out."""
    found: list[DocumentRecord] = []
    for row, passage in enumerate(passages):
        if found and found[-1].doc_id == passage.doc_id:
            found[-1] = replace(found[-1], rows=found[-1].rows + 1)
            continue
        record = records.get(passage.doc_id)
        if record is None:
            raise IndexMismatchError(f"passage {passage.passage_id} of no known document")
        found.append(replace(record, first_row=row, rows=1))
    return found


def document_ingest(chunking: ChunkingConfig, source_url: str | None) -> str:
    """The settings a document is cut with; a document cut otherwise is parsed again."""
    parts = [PARSER_VERSION, chunking.passage_tokens, chunking.overlap_tokens, source_url]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:16]


def write_documents(directory: Path, records: Iterable[DocumentRecord]) -> None:
    table = {"version": TABLE_VERSION, "documents": [asdict(record) for record in records]}
    (directory / DOCUMENTS_FILE).write_text(json.dumps(table, ensure_ascii=False), "utf-8")


def read_documents(directory: Path) -> list[DocumentRecord] | None:
    """The table, in row order; None for an index built before sync existed."""
    path = directory / DOCUMENTS_FILE
    if not path.is_file():
        return None
    try:
        table = json.loads(path.read_text(encoding="utf-8"))
        if table.get("version") != TABLE_VERSION:
            raise ValueError(f"table version {table.get('version')}, expected {TABLE_VERSION}")
        return [DocumentRecord(**record) for record in table["documents"]]
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise IndexMismatchError(f"unreadable documents table {path}: {exc}") from exc


def table_checksum(records: Sequence[DocumentRecord]) -> str:
    """Of every document's id, collection and content: what a generation's manifest records
    as its corpus checksum (so the answer cache's fingerprint changes with any change)."""
    digest = hashlib.sha256()
    for record in records:
        digest.update(f"{record.doc_id}\n{record.collection}\n{record.content_hash}\n".encode())
    return f"sha256:{digest.hexdigest()}"
