"""`GET /v1/passages/{passage_id}`: a passage of the index the service serves now, so that every
URL an answer cites resolves (the `url_citation`s of `POST /v1/responses` point here).

A passage id is `<doc_id>#<position>`; clients send it percent-encoded (`#` as `%23`, and `/`,
which a document id may hold, as `%2F`), as `passage_url` writes it. Starlette decodes the path
before routing, so the route takes the rest of the path whole (`:path`) and sees the id as the
index holds it. With API keys, a key fetches only passages of the collections it may read.
"""

from __future__ import annotations

from urllib.parse import quote

from fastapi import APIRouter, Request

from answer_service.errors import NotFoundError
from answer_service.http.answering import ComponentsDep, ready_retriever, request_key
from answer_service.http.schemas import ErrorResponse, PassageOut
from retrieval.search.filters import PassageFilter

router = APIRouter()

PASSAGES_PATH = "/v1/passages/"


def passage_url(http_request: Request, passage_id: str) -> str:
    """The absolute URL of a passage, from the base URL the request came to."""
    base = str(http_request.base_url).rstrip("/")
    return f"{base}{PASSAGES_PATH}{quote(passage_id, safe='')}"


@router.get(
    PASSAGES_PATH + "{passage_id:path}",
    response_model=PassageOut,
    # A passage from JSONL has no URL or heading path: left out, as before sections existed.
    response_model_exclude_none=True,
    responses={404: {"model": ErrorResponse}, 503: {"model": ErrorResponse}},
)
async def passage(passage_id: str, components: ComponentsDep, http_request: Request) -> PassageOut:
    """A passage by id (`Super_Bowl_50-0%230` for `Super_Bowl_50-0#0`). A passage in a
    collection the API key may not read answers 404, word for word as one that does not
    exist, so a key cannot even learn which ids other collections hold."""
    key = request_key(http_request)
    readable = None if key is None else PassageFilter(collections=key.collections)
    found = ready_retriever(components).passage_by_id(passage_id, readable)
    if found is None:
        raise NotFoundError(f"the index holds no passage {passage_id!r}")
    return PassageOut.of(found)
