"""What the answer endpoints share (`POST /v1/answer` and the OpenAI-shaped ones, chat
completions and responses): the request checks, readiness, and running a prepared answer while
watching for the client to go."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request, Response
from pydantic import ValidationError

from answer_service.errors import (
    ForbiddenError,
    InvalidRequestError,
    NotReadyError,
    PayloadTooLargeError,
)
from answer_service.http.schemas import (
    MAX_HISTORY_BYTES,
    MAX_HISTORY_TURNS,
    AnswerBody,
    FiltersIn,
    ServiceFields,
    TurnIn,
)
from answer_service.pipeline.answer_pipeline import AnswerPipeline, PreparedAnswer
from answer_service.pipeline.attribution import Citation, with_markers
from answer_service.pipeline.events import (
    AnswerRequest,
    AnswerStats,
    CitationEvent,
    DoneEvent,
    ErrorEvent,
    ShortAnswer,
    TokenEvent,
)
from answer_service.runtime.components import Components
from answer_service.runtime.keys.auth import ApiKey
from answer_service.runtime.settings import Settings
from budget import Deadline
from retrieval.query_rewrite import Role, Turn
from retrieval.retriever import Retriever
from retrieval.search.filters import PassageFilter

logger = logging.getLogger(__name__)

ERROR_STATUS = {"generation_timeout": 504, "generation_unavailable": 503}
_DISCONNECT_POLL_S = 0.2


async def get_components(request: Request) -> Components:
    """Async so that FastAPI calls it on the event loop (a sync dependency is a thread hop,
    ~0.3 ms of every request)."""
    components: Components = request.app.state.components
    return components


ComponentsDep = Annotated[Components, Depends(get_components)]


def request_tier(http_request: Request, settings: Settings, asked: str | None) -> str:
    """The request's tenant tier: its API key's (asking for another is refused), else the
    one asked for in X-Tenant-Tier (or the body), else the default."""
    key = request_key(http_request)
    asked = asked.strip() if asked is not None else None
    if key is not None:
        if asked is not None and asked != key.tier:
            raise ForbiddenError(f"key {key.key_id!r} is for tier {key.tier!r}, not {asked!r}")
        return key.tier
    tier = asked if asked is not None else settings.default_tier
    if tier not in settings.tier_weights:
        raise InvalidRequestError(
            f"unknown tenant tier {tier!r} in X-Tenant-Tier; tiers: {sorted(settings.tier_weights)}"
        )
    return tier


def checked_query(raw: str, settings: Settings) -> str:
    """The query stripped, refused when blank or over `max_query_chars`."""
    query = raw.strip()
    if not query:
        raise InvalidRequestError("`query` must contain non-whitespace text")
    if len(query) > settings.max_query_chars:
        raise InvalidRequestError(
            f"`query` is {len(query)} characters; the limit is {settings.max_query_chars}"
        )
    return query


def request_key(http_request: Request) -> ApiKey | None:
    """The API key the request came with (set by the access middleware), if keys are on."""
    key: ApiKey | None = getattr(http_request.state, "api_key", None)
    return key


def passage_filter(asked: FiltersIn | None, key: ApiKey | None) -> PassageFilter | None:
    """What a request may retrieve: its filters within its key's collections (None: every
    passage). A collection named that the key may not read is refused (403), so a client
    learns why it got nothing rather than an empty answer; left unnamed, the key's own."""
    readable = key.collections if key is not None else None
    if asked is None:
        return None if readable is None else PassageFilter(collections=readable)
    named = asked.collections
    outside = sorted(named - readable) if named is not None and readable is not None else []
    if key is not None and outside:
        raise ForbiddenError(
            f"key {key.key_id!r} may not read collection(s) {outside}; "
            f"it reads {sorted(readable or ())}"
        )
    tags = frozenset(asked.tags) if asked.tags else None
    return PassageFilter(named, asked.path_prefix, tags).within(readable)


def checked_history(turns: list[TurnIn]) -> tuple[Turn, ...]:
    """`history` as the pipeline takes it; over `MAX_HISTORY_BYTES` of content is refused
    (413). Its shape, roles and turn count pydantic has checked (422)."""
    size = sum(len(t.content.encode()) for t in turns)
    if size > MAX_HISTORY_BYTES:
        raise PayloadTooLargeError(
            f"`history` holds {size} bytes of content; the limit is {MAX_HISTORY_BYTES} "
            "(send the latest turns)"
        )
    return tuple(Turn(t.role, t.content) for t in turns)


def recent_history(messages: list[tuple[str, str]]) -> list[TurnIn]:
    """An OpenAI-shaped conversation's user and assistant turns (system and developer
    messages read past), its latest ones within the limits of `history`: a client that sends
    a long chat whole is not refused, its oldest turns are left out."""
    kept: list[TurnIn] = []
    size = 0
    for role, content in reversed(messages):
        if role not in ("user", "assistant"):
            continue
        size += len(content.encode())
        if len(kept) == MAX_HISTORY_TURNS or size > MAX_HISTORY_BYTES:
            break
        turn_role: Role = "user" if role == "user" else "assistant"
        kept.append(TurnIn(role=turn_role, content=content))
    return kept[::-1]


def answer_request(
    body: AnswerBody, settings: Settings, tier: str, key: ApiKey | None = None
) -> AnswerRequest:
    query = checked_query(body.query, settings)
    budget_ms = body.ttft_budget_ms or settings.default_ttft_budget_ms
    if budget_ms > settings.max_ttft_budget_ms:
        raise InvalidRequestError(
            f"`ttft_budget_ms` is {budget_ms}; the limit is {settings.max_ttft_budget_ms}"
        )
    top_k = body.top_k or settings.default_top_k
    if top_k > settings.max_top_k:
        raise InvalidRequestError(f"`top_k` is {top_k}; the limit is {settings.max_top_k}")
    return AnswerRequest(
        query=query,
        ttft_budget_ms=budget_ms,
        top_k=top_k,
        tier=tier,
        allow_sources_only=body.allow_sources_only,
        key_id=key.key_id if key is not None else None,
        answer_mode=body.answer_mode,
        passage_filter=passage_filter(body.filters, key),
        history=checked_history(body.history),
    )


def _openai_answer_request(
    http_request: Request,
    settings: Settings,
    query: str,
    fields: ServiceFields,
    header_tier: str | None,
    history: list[tuple[str, str]],
) -> AnswerRequest:
    """An OpenAI-shaped request's answer request: `query` (its last user message) after
    `history` (the messages before it, as (role, text)), with the service's own fields,
    checked as `POST /v1/answer` checks them. A tier in the body wins over X-Tenant-Tier."""
    try:
        body = AnswerBody(
            query=query,
            history=recent_history(history),
            ttft_budget_ms=fields.ttft_budget_ms,
            top_k=fields.top_k,
            allow_sources_only=fields.allow_sources_only,
            answer_mode=fields.answer_mode,
            filters=fields.filters,
        )
    except ValidationError as exc:  # e.g. a query over the body's limit
        problems = "; ".join(str(e["msg"]) for e in exc.errors())
        raise InvalidRequestError(f"the last user message cannot be the query: {problems}") from exc
    tier = request_tier(http_request, settings, fields.tier or header_tier)
    return answer_request(body, settings, tier, request_key(http_request))


def ready_pipeline(components: Components) -> AnswerPipeline:
    if components.pipeline is None:
        reason = components.warm_up_error or "warming up"
        raise NotReadyError(f"the service is not ready: {reason}", retry_after_s=5)
    return components.pipeline


def ready_retriever(components: Components) -> Retriever:
    if components.retriever is None:
        reason = components.warm_up_error or "warming up"
        raise NotReadyError(f"the service is not ready: {reason}", retry_after_s=5)
    return components.retriever


@dataclass(frozen=True, slots=True)
class Collected:
    """A whole answer: its text, the error that ended it early (if any), its statistics and
    the service's citations of its sentences."""

    text: str
    error: ErrorEvent | None
    stats: AnswerStats
    citations: tuple[Citation, ...] = ()
    short_answer: ShortAnswer | None = None

    @property
    def cited_text(self) -> str:
        """The text with ` [n]` after each supported sentence."""
        return with_markers(self.text, self.citations)

    @property
    def status_code(self) -> int:
        return 200 if self.error is None else ERROR_STATUS.get(self.error.code, 502)


async def collect(pipeline: AnswerPipeline, prepared: PreparedAnswer) -> Collected:
    parts: list[str] = []
    citations: list[Citation] = []
    error: ErrorEvent | None = None
    done: DoneEvent | None = None
    async for event in pipeline.events(prepared):
        if isinstance(event, TokenEvent):
            parts.append(event.text)
        elif isinstance(event, CitationEvent):
            citations.append(event.citation)
        elif isinstance(event, ErrorEvent):
            error = event
        elif isinstance(event, DoneEvent):
            done = event
    assert done is not None, "the pipeline always ends with done"
    return Collected("".join(parts), error, done.stats, tuple(citations), done.short_answer)


async def prepare_while_connected(
    http_request: Request, pipeline: AnswerPipeline, request: AnswerRequest, deadline: Deadline
) -> PreparedAnswer | None:
    """`pipeline.prepare`, given up (None) when the client goes away first: a request waiting
    for a generation slot leaves the queue instead of taking a slot nobody will read."""
    task = asyncio.create_task(pipeline.prepare(request, deadline))
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=_DISCONNECT_POLL_S)
            if done:
                return task.result()
            if await http_request.is_disconnected():
                logger.info("client disconnected before its answer began")
                task.cancel()
                (outcome,) = await asyncio.gather(task, return_exceptions=True)
                if isinstance(outcome, PreparedAnswer):  # it finished as it was cancelled
                    outcome.close_nowait()
                return None
    finally:
        if not task.done():
            task.cancel()


async def start_answer(
    http_request: Request, components: Components, request: AnswerRequest
) -> tuple[AnswerPipeline, PreparedAnswer] | None:
    """The request's deadline from now, then `prepare`; None when the client went away."""
    deadline = Deadline.after_ms(request.ttft_budget_ms)
    pipeline = ready_pipeline(components)
    prepared = await prepare_while_connected(http_request, pipeline, request, deadline)
    return None if prepared is None else (pipeline, prepared)


async def start_openai_answer(
    http_request: Request,
    components: Components,
    query: str,
    fields: ServiceFields,
    header_tier: str | None,
    history: list[tuple[str, str]] | None = None,
) -> tuple[AnswerPipeline, PreparedAnswer] | None:
    """`start_answer` for an OpenAI-shaped request: `query` (its last user message) after
    `history`, with the service's own fields (see `_openai_answer_request`)."""
    request = _openai_answer_request(
        http_request, components.settings, query, fields, header_tier, history or []
    )
    return await start_answer(http_request, components, request)


async def collect_while_connected(
    request: Request,
    pipeline: AnswerPipeline,
    prepared: PreparedAnswer,
    render: Callable[[Collected], Response],
) -> Response:
    """Collect the whole answer, but stop (and abort SGLang) if the client goes away; the
    prepared answer is released either way."""
    task = asyncio.create_task(collect(pipeline, prepared))
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=_DISCONNECT_POLL_S)
            if done:
                return render(task.result())
            if await request.is_disconnected():
                logger.info("client disconnected trace_id=%s", prepared.trace_id)
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
                return Response(status_code=499)
    finally:
        if not task.done():
            task.cancel()
        prepared.close_nowait()
