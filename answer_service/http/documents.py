"""Documents over HTTP: `PUT` and `DELETE /v1/collections/{collection}/documents/{id}`,
`GET /v1/collections/{collection}/documents`.

A PUT's body is the document itself (text, Markdown, HTML or PDF, said by its Content-Type);
`title`, `url` and `tags` (comma-separated) may be given as query parameters. The change is
published as a new index generation before the response returns, and this process serves it
from then on (other replicas within `ANSWER_INDEX_WATCH_S`). With API keys, a key writes only
to the collections it was given with `keys add --write`, and lists only those it may read (any
other answers 404, as one that does not exist); without keys the routes are open, as every
route is.
"""

from __future__ import annotations

import asyncio
from typing import Annotated

from fastapi import APIRouter, Query, Request
from pydantic import BaseModel

from answer_service.errors import (
    ConflictError,
    ForbiddenError,
    NotFoundError,
    NotReadyError,
    PayloadTooLargeError,
)
from answer_service.http.answering import ComponentsDep, request_key
from answer_service.http.schemas import ErrorResponse
from answer_service.runtime.components import Components
from answer_service.runtime.document_writer import (
    DOCUMENT_MAX_BYTES,
    DocumentMeta,
    DocumentWriter,
    Written,
    check_collection,
    check_doc_id,
)
from retrieval.errors import RetrievalError

router = APIRouter()

DOCUMENTS_PATH = "/v1/collections/{collection}/documents"
_ERRORS: dict[int | str, dict[str, object]] = {
    code: {"model": ErrorResponse} for code in (403, 404, 409, 413, 415, 422, 503)
}


class WrittenOut(BaseModel):
    id: str
    collection: str
    passages: int
    generation: int
    changed: bool

    @classmethod
    def of(cls, written: Written) -> WrittenOut:
        return cls(
            id=written.doc_id,
            collection=written.collection,
            passages=written.passages,
            generation=written.generation,
            changed=written.changed,
        )


class DocumentOut(BaseModel):
    id: str
    title: str
    path: str | None
    origin: str
    passages: int


class DocumentsOut(BaseModel):
    collection: str
    documents: list[DocumentOut]


def _writer(components: Components) -> DocumentWriter:
    if components.documents is None:
        raise NotReadyError("the service is not ready: warming up", retry_after_s=5)
    return components.documents


def _may_write(http_request: Request, collection: str) -> None:
    check_collection(collection)
    key = request_key(http_request)
    if key is not None and not key.may_write(collection):
        raise ForbiddenError(
            f"key {key.key_id!r} may not write to collection {collection!r} "
            "(`answer-service keys add --write`)"
        )


async def _published(components: Components, written: Written) -> WrittenOut:
    if written.changed and components.index_watcher is not None:
        await components.index_watcher.check()
    return WrittenOut.of(written)


@router.put(DOCUMENTS_PATH + "/{doc_id}", response_model=WrittenOut, responses=_ERRORS)
async def put_document(
    collection: str,
    doc_id: str,
    components: ComponentsDep,
    http_request: Request,
    title: Annotated[str | None, Query(max_length=500)] = None,
    url: Annotated[str | None, Query(max_length=2000, pattern=r"^https?://")] = None,
    tags: Annotated[str | None, Query(max_length=1000, description="a,b,c")] = None,
) -> WrittenOut:
    """Add or replace a document: the body is the file, its Content-Type says which kind."""
    _may_write(http_request, collection)
    check_doc_id(doc_id)
    writer = _writer(components)
    data = await http_request.body()
    if len(data) > DOCUMENT_MAX_BYTES:
        raise PayloadTooLargeError(f"a document is at most {DOCUMENT_MAX_BYTES} bytes")
    meta = DocumentMeta(
        title=title,
        url=url,
        tags=tuple(t.strip() for t in (tags or "").split(",") if t.strip()),
    )
    content_type = http_request.headers.get("content-type", "")
    async with writer.turn:
        try:
            written = await asyncio.to_thread(
                writer.put, collection, doc_id, data, content_type, meta
            )
        except RetrievalError as exc:
            raise ConflictError(f"the index cannot take this change: {exc}") from exc
        return await _published(components, written)


@router.delete(DOCUMENTS_PATH + "/{doc_id}", response_model=WrittenOut, responses=_ERRORS)
async def delete_document(
    collection: str, doc_id: str, components: ComponentsDep, http_request: Request
) -> WrittenOut:
    """Remove a document from every structure of the index (vectors, BM25, sentences)."""
    _may_write(http_request, collection)
    writer = _writer(components)
    async with writer.turn:
        try:
            written = await asyncio.to_thread(writer.delete, collection, doc_id)
        except RetrievalError as exc:
            raise ConflictError(f"the index cannot take this change: {exc}") from exc
        return await _published(components, written)


@router.get(DOCUMENTS_PATH, response_model=DocumentsOut, responses=_ERRORS)
async def list_documents(
    collection: str, components: ComponentsDep, http_request: Request
) -> DocumentsOut:
    """The documents of a collection the key may read, in index order."""
    check_collection(collection)
    key = request_key(http_request)
    if key is not None and not key.may_read(collection):
        raise NotFoundError(f"no collection {collection!r}")
    records = await asyncio.to_thread(_writer(components).listed, collection)
    return DocumentsOut(
        collection=collection,
        documents=[
            DocumentOut(id=r.doc_id, title=r.title, path=r.path, origin=r.origin, passages=r.rows)
            for r in records
        ],
    )
