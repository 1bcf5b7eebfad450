"""Documents put and deleted over HTTP, through the machinery `index sync` uses: the change is
parsed, embedded and published as a new generation of the served index directory in one
atomic step (retrieval/index/revision.py), or not at all. The directory's one-writer lock
holds across processes, so a PUT while an `index sync` runs is refused (409), never merged.

Blocking: the routes run these in a thread, one at a time per process.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from answer_service.errors import (
    ConflictError,
    InvalidRequestError,
    NotFoundError,
    UnsupportedMediaError,
)
from retrieval.embedder import Embedder
from retrieval.errors import IndexBusyError, RetrievalError, UnreadableFileError
from retrieval.index.documents import DocumentRecord, document_ingest, read_documents
from retrieval.index.generations import WriterLock, generation_number, served_generation
from retrieval.index.revision import Base, Incoming, clear_staging, incoming_record, revise
from retrieval.ingest.file_source import document_of
from retrieval.ingest.parsers import parser_for

# Bodies up to this size are taken (a long manual page as PDF); larger ones get 413.
DOCUMENT_MAX_BYTES = 32 * 1024 * 1024

_FORMATS: dict[str, Literal["html", "markdown", "text", "pdf"]] = {
    "text/plain": "text",
    "text/markdown": "markdown",
    "text/x-markdown": "markdown",
    "text/html": "html",
    "application/xhtml+xml": "html",
    "application/pdf": "pdf",
}
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


@dataclass(frozen=True, slots=True)
class DocumentMeta:
    title: str | None = None
    url: str | None = None
    tags: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Written:
    """What a PUT or DELETE did: `generation` is the index generation now served (unchanged
    when the document was already as put)."""

    doc_id: str
    collection: str
    passages: int
    generation: int
    changed: bool


def check_collection(name: str) -> None:
    if not _NAME.fullmatch(name):
        raise InvalidRequestError(
            f"collection {name!r}: 1-64 letters, digits, '_', '.' or '-', starting with a "
            "letter or digit"
        )


def check_doc_id(doc_id: str) -> None:
    if not doc_id.strip() or len(doc_id) > 200 or "#" in doc_id:
        raise InvalidRequestError(
            "a document id is 1-200 characters without '#' (passage ids are `<id>#<n>`)"
        )


def format_of_type(content_type: str) -> Literal["html", "markdown", "text", "pdf"]:
    media = content_type.split(";")[0].strip().lower()
    if media not in _FORMATS:
        raise UnsupportedMediaError(
            f"Content-Type {media or '(none)'!r} cannot be indexed; send one of "
            + ", ".join(sorted(_FORMATS))
        )
    return _FORMATS[media]


class DocumentWriter:
    """Puts and deletes documents of the served index, each as one new generation.

    `turn` queues this process's writes, so one waits its turn instead of being refused by the
    directory's lock, which still refuses other processes (a sync, another replica) with 409.
    """

    def __init__(self, index_dir: Path, embedder: Embedder) -> None:
        self.index_dir = index_dir
        self.embedder = embedder
        self.turn = asyncio.Lock()

    def listed(self, collection: str) -> list[DocumentRecord]:
        records = read_documents(served_generation(self.index_dir)) or []
        return [record for record in records if record.collection == collection]

    def put(
        self,
        collection: str,
        doc_id: str,
        data: bytes,
        content_type: str,
        meta: DocumentMeta,
    ) -> Written:
        file_format = format_of_type(content_type)
        if not data:
            raise InvalidRequestError("the body is empty: send the document's bytes")
        try:
            parsed = parser_for(file_format).parse(data, doc_id)
        except UnreadableFileError as exc:
            raise InvalidRequestError(f"the document cannot be parsed: {exc.reason}") from exc
        if not parsed.has_text:
            raise InvalidRequestError("the document holds no text to index")
        document = document_of(
            parsed,
            doc_id=doc_id,
            path=None,
            collection=collection,
            page_url=meta.url or parsed.url,
            tags=meta.tags or parsed.tags or (),
            modified=parsed.modified or datetime.datetime.now(datetime.UTC).isoformat(),
        )
        if meta.title:
            document = dataclasses.replace(document, title=meta.title)
        with self._lock():
            base = Base.read(self.index_dir, self.embedder)
            old = next((r for r in base.records if r.doc_id == doc_id), None)
            if old is not None and old.collection != collection:
                raise ConflictError(f"document id {doc_id!r} is taken in another collection")
            record = incoming_record(
                document,
                origin="api",
                source=None,
                file_hash=None,
                ingest=document_ingest(base.chunking, None),
            )
            if old is not None and old.content_hash == record.content_hash:
                return Written(
                    doc_id, collection, old.rows, generation_number(self.index_dir), False
                )
            keep = [r for r in base.records if r.doc_id != doc_id]
            revision = revise(
                self.index_dir,
                base,
                keep,
                [Incoming(document, record)],
                self.embedder,
                progress=False,
            )
        return Written(
            doc_id,
            collection,
            revision.embedded_passages,
            generation_number(self.index_dir),
            True,
        )

    def delete(self, collection: str, doc_id: str) -> Written:
        with self._lock():
            base = Base.read(self.index_dir, self.embedder)
            old = next((r for r in base.records if r.doc_id == doc_id), None)
            if old is None or old.collection != collection:
                raise NotFoundError(f"collection {collection!r} holds no document {doc_id!r}")
            keep = [r for r in base.records if r.doc_id != doc_id]
            try:
                revise(self.index_dir, base, keep, [], self.embedder, progress=False)
            except RetrievalError as exc:  # the last document
                raise ConflictError(f"cannot delete {doc_id!r}: {exc}") from exc
        return Written(doc_id, collection, 0, generation_number(self.index_dir), True)

    def _lock(self) -> WriterLock:
        return _Refusing(self.index_dir)


class _Refusing(WriterLock):
    """The writer lock, its refusal as a 409 and its leftovers cleared."""

    def __enter__(self) -> WriterLock:
        try:
            super().__enter__()
        except IndexBusyError as exc:
            raise ConflictError(str(exc), retry_after_s=5) from exc
        clear_staging(self.index_dir)
        return self
