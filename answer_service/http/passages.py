"""`GET /v1/passages/{passage_id}`: a passage of the index the service serves now, so that every
URL an answer cites resolves (the `url_citation`s of `POST /v1/responses` point here).

A passage id is `<doc_id>#<position>`; clients send it percent-encoded (`#` as `%23`, and `/`,
which a document id may hold, as `%2F`), as `passage_url` writes it. Starlette decodes the path
before routing, so the route takes the rest of the path whole (`:path`) and sees the id as the
index holds it.
"""

from __future__ import annotations

from urllib.parse import quote

from fastapi import APIRouter, Request

from answer_service.errors import NotFoundError
from answer_service.http.answering import ComponentsDep, ready_retriever
from answer_service.http.schemas import ErrorResponse, PassageOut

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
async def passage(passage_id: str, components: ComponentsDep) -> PassageOut:
    """A passage by id (`Super_Bowl_50-0%230` for `Super_Bowl_50-0#0`)."""
    found = ready_retriever(components).index.passage_by_id(passage_id)
    if found is None:
        raise NotFoundError(f"the index holds no passage {passage_id!r}")
    return PassageOut.of(found)
