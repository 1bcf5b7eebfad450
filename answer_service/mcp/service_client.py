"""The tools' one way to the service: its own HTTP routes, over an `httpx.AsyncClient` whose
transport decides where they run (in-process through the app for `/mcp`, over the network for
the stdio proxy), as httpx's transports do.

- `search`  -> `POST /v1/retrieve`
- `answer`  -> `POST /v1/answer` with `stream: false`
- `passage` -> `GET /v1/passages/{id}`

Each call carries the caller's credentials (`Caller.headers`), so the service applies that
caller's key, tier, limits and collections; an error answer becomes `ServiceCallError` with
the service's own code and message.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import quote

import httpx

from answer_service.mcp.errors import ServiceCallError
from answer_service.mcp.tool_values import (
    AnswerCitation,
    AnswerResult,
    AnswerSource,
    PassageResult,
    SearchFilters,
    SearchHit,
    SearchResult,
)

PASSAGES_PATH = "/v1/passages/"
# A search or a passage is milliseconds of work; this bounds a service that hangs.
LOOKUP_TIMEOUT_S = 30.0
# The service gives up on a first token at its budget x ANSWER_TTFT_TIMEOUT_FACTOR (4 by
# default) and then ends the answer; the client waits that long and a margin for the rest.
ANSWER_TIMEOUT_FACTOR = 4.0
ANSWER_TIMEOUT_MARGIN_S = 30.0
DEFAULT_BUDGET_MS = 3000


@dataclass(frozen=True, slots=True)
class Caller:
    """Who a tool call is for: the headers that carry its key and tier, and the base URL it
    reached the service at (where the passage URLs it is given point)."""

    base_url: str
    headers: Mapping[str, str] = field(default_factory=dict)


class Service(Protocol):
    """What the tools need of the service (`ServiceClient`; the unit tests' fake)."""

    async def search(
        self, caller: Caller, query: str, top_k: int, filters: SearchFilters | None
    ) -> SearchResult: ...

    async def answer(
        self, caller: Caller, query: str, budget_ms: int | None, filters: SearchFilters | None
    ) -> AnswerResult: ...

    async def passage(self, caller: Caller, passage_id: str) -> PassageResult: ...


def passage_url(base_url: str, passage_id: str) -> str:
    return f"{base_url.rstrip('/')}{PASSAGES_PATH}{quote(passage_id, safe='')}"


def _url(caller: Caller, item: Mapping[str, Any]) -> str:
    own = item.get("url")
    return own if isinstance(own, str) and own else passage_url(caller.base_url, item["id"])


class ServiceClient:
    def __init__(self, http: httpx.AsyncClient) -> None:
        self._http = http

    async def search(
        self, caller: Caller, query: str, top_k: int, filters: SearchFilters | None
    ) -> SearchResult:
        body: dict[str, Any] = {"query": query, "top_k": top_k}
        if filters is not None:
            body["filters"] = filters.body()
        found = await self._call(caller, "POST", "/v1/retrieve", body, LOOKUP_TIMEOUT_S)
        hits = [
            SearchHit(
                id=p["id"],
                doc_id=p["doc_id"],
                title=p["title"],
                url=_url(caller, p),
                score=p["score"],
                text=p["text"],
                heading_path=p.get("heading_path"),
            )
            for p in found["passages"]
        ]
        return SearchResult(mode=found["mode"], passages=hits)

    async def answer(
        self, caller: Caller, query: str, budget_ms: int | None, filters: SearchFilters | None
    ) -> AnswerResult:
        body: dict[str, Any] = {"query": query, "stream": False}
        if budget_ms is not None:
            body["ttft_budget_ms"] = budget_ms
        if filters is not None:
            body["filters"] = filters.body()
        timeout_s = (
            budget_ms or DEFAULT_BUDGET_MS
        ) * ANSWER_TIMEOUT_FACTOR / 1000 + ANSWER_TIMEOUT_MARGIN_S
        out = await self._call(caller, "POST", "/v1/answer", body, timeout_s)
        done = out["done"]
        return AnswerResult(
            answer=out["answer"],
            # The service gives no short answer yet; the field is here for when it does.
            short_answer=(out.get("short_answer") or {}).get("text"),
            sources=[
                AnswerSource(
                    number=s["number"],
                    id=s["id"],
                    title=s["title"],
                    url=_url(caller, s),
                    snippet=s["snippet"],
                )
                for s in out["sources"]
            ],
            citations=[
                AnswerCitation(
                    sentence=c["sentence"],
                    start=c["start"],
                    end=c["end"],
                    sources=c["sources"],
                    supported=c["supported"],
                )
                for c in out["citations"]
            ],
            form=done["form"],
            ttft_ms=done["ttft_ms"],
            within_budget=done["within_budget"],
            trace_id=done["trace_id"],
        )

    async def passage(self, caller: Caller, passage_id: str) -> PassageResult:
        path = PASSAGES_PATH + quote(passage_id, safe="")
        found = await self._call(caller, "GET", path, None, LOOKUP_TIMEOUT_S)
        return PassageResult(
            id=found["id"],
            doc_id=found["doc_id"],
            title=found["title"],
            url=_url(caller, found),
            text=found["text"],
            heading_path=found.get("heading_path"),
        )

    async def _call(
        self,
        caller: Caller,
        method: str,
        path: str,
        body: dict[str, Any] | None,
        timeout_s: float,
    ) -> dict[str, Any]:
        try:
            response = await self._http.request(
                method, path, json=body, headers=dict(caller.headers), timeout=timeout_s
            )
        except httpx.HTTPError as exc:
            raise ServiceCallError(f"cannot reach the service: {exc!r}") from exc
        try:
            payload = response.json()
        except ValueError:
            payload = None
        if response.status_code != 200:
            raise _refusal(response, payload)
        if not isinstance(payload, dict):
            raise ServiceCallError(f"the service answered {method} {path} with no JSON object")
        return payload


def _refusal(response: httpx.Response, payload: Any) -> ServiceCallError:
    """The service's `{"error": {"code", "message"}}` (and Retry-After) as an error."""
    error = payload.get("error") if isinstance(payload, dict) else None
    if isinstance(error, dict):
        code, message = str(error.get("code", "error")), str(error.get("message", ""))
    else:
        code, message = "error", response.text[:500] or response.reason_phrase
    if (retry_after := response.headers.get("retry-after")) is not None:
        message = f"{message} (retry after {retry_after} s)"
    return ServiceCallError(message, status=response.status_code, code=code)
