"""The HTTP API: `POST /v1/answer` (SSE or JSON), health, readiness and recent traces.

Settings and components are built in the lifespan, so tests can hand in their own settings.
A request's deadline is born here, at arrival, and carried into the pipeline.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import asdict
from typing import Annotated, Any

from fastapi import APIRouter, FastAPI, Header, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse
from fastapi.sse import EventSourceResponse, format_sse_event
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.background import BackgroundTask

from answer_service.errors import (
    InvalidRequestError,
    ServiceError,
    StageTimeoutError,
)
from answer_service.http.access import AccessMiddleware
from answer_service.http.answering import (
    Collected,
    ComponentsDep,
    answer_request,
    checked_query,
    collect_while_connected,
    passage_filter,
    ready_retriever,
    request_key,
    request_tier,
    start_answer,
)
from answer_service.http.dashboard import mount_static
from answer_service.http.dashboard import router as dashboard_router
from answer_service.http.documents import router as documents_router
from answer_service.http.openai_chat import router as openai_router
from answer_service.http.openapi_limits import document_limits
from answer_service.http.page import router as page_router
from answer_service.http.passages import router as passages_router
from answer_service.http.responses import router as responses_router
from answer_service.http.schemas import (
    AnswerBody,
    AnswerOut,
    CitationPayload,
    DonePayload,
    ErrorPayload,
    ErrorResponse,
    ModesOut,
    PlanPayload,
    ReadyOut,
    RetrieveBody,
    RetrievedOut,
    RetrieveOut,
    ShortAnswerOut,
    SourceOut,
    SourcesPayload,
    TokenPayload,
)
from answer_service.mcp.http_mount import McpMount
from answer_service.pipeline.answer_pipeline import AnswerPipeline, PreparedAnswer
from answer_service.pipeline.events import (
    CitationEvent,
    DoneEvent,
    ErrorEvent,
    PipelineEvent,
    PlanEvent,
    ShortAnswerEvent,
    SourcesEvent,
    TokenEvent,
)
from answer_service.runtime.components import Components
from answer_service.runtime.configs import SHIPPED, Experiment
from answer_service.runtime.settings import Settings
from budget import Deadline
from retrieval.errors import RetrievalTimeoutError

logger = logging.getLogger(__name__)


router = APIRouter()


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz", response_model=ReadyOut, responses={503: {"model": ReadyOut}})
async def readyz(components: ComponentsDep) -> JSONResponse:
    down = await components.workers_down()
    reasons = await components.not_ready_reasons(down)
    retriever = components.retriever
    body = ReadyOut(
        ready=not reasons,
        reasons=reasons,
        index_passages=len(retriever.index) if retriever else None,
        sglang_url=components.sglang.base_url,
        model=components.served_model,
        reranker=components.reranker_status,
        redis=await components.redis_status(),
        workers_down=down if len(components.workers) > 1 else [],
        calibrated_floor_ms=components.calibrated_floor_ms,
        calibrated_stages=components.calibrated_stages,
        generation_slots=components.generation_slots(),
    )
    return JSONResponse(body.model_dump(), status_code=503 if reasons else 200)


def _sse(event: PipelineEvent) -> bytes:
    match event:
        case PlanEvent(record, searched_query):
            payload: Any = PlanPayload.of(record, searched_query)
            name = "plan"
        case SourcesEvent(sources):
            payload, name = SourcesPayload(sources=[SourceOut.of(s) for s in sources]), "sources"
        case TokenEvent(text):
            payload, name = TokenPayload(text=text), "token"
        case CitationEvent(citation):
            payload, name = CitationPayload.of(citation), "citation"
        case ErrorEvent():
            payload, name = ErrorPayload.of(event), "error"
        case ShortAnswerEvent(short):
            payload, name = ShortAnswerOut.of(short), "short_answer"
        case DoneEvent(stats, short):
            payload, name = DonePayload.of(stats, short), "done"
    return format_sse_event(data_str=payload.model_dump_json(), event=name)


async def _stream(pipeline: AnswerPipeline, prepared: PreparedAnswer) -> AsyncIterator[bytes]:
    async for event in pipeline.events(prepared):
        yield _sse(event)


@router.post(
    "/v1/answer",
    response_model=AnswerOut,
    responses={
        200: {"content": {"text/event-stream": {}}, "description": "SSE or one JSON object"},
        403: {"model": ErrorResponse},
        422: {"model": ErrorResponse},
        503: {"model": ErrorResponse},
        504: {"model": ErrorResponse},
    },
)
async def answer(
    body: AnswerBody,
    components: ComponentsDep,
    http_request: Request,
    x_tenant_tier: Annotated[str | None, Header(description="The tenant tier.")] = None,
) -> Any:
    tier = request_tier(http_request, components.settings, x_tenant_tier)
    request = answer_request(body, components.settings, tier, request_key(http_request))
    started = await start_answer(http_request, components, request)
    if started is None:
        return Response(status_code=499)
    pipeline, prepared = started
    if not body.stream:

        def render(collected: Collected) -> Response:
            out = AnswerOut(
                answer=collected.cited_text,
                plan=PlanPayload.of(prepared.record, prepared.queries.searched),
                sources=[SourceOut.of(s) for s in prepared.sources],
                citations=[CitationPayload.of(c) for c in collected.citations],
                short_answer=ShortAnswerOut.of(collected.short_answer),
                done=DonePayload.of(collected.stats, collected.short_answer),
                error=ErrorPayload.of(collected.error) if collected.error else None,
            )
            return JSONResponse(out.model_dump(), status_code=collected.status_code)

        return await collect_while_connected(http_request, pipeline, prepared, render)

    async def release() -> None:
        # Runs even when the client went away before the stream started.
        prepared.close_nowait()

    return EventSourceResponse(
        _stream(pipeline, prepared),
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        background=BackgroundTask(release),
    )


@router.get("/v1/retrieve/modes", response_model=ModesOut)
async def retrieve_modes(components: ComponentsDep) -> ModesOut:
    return ModesOut(modes=list(ready_retriever(components).modes()))


@router.post(
    "/v1/retrieve",
    response_model=RetrieveOut,
    # A passage from JSONL has no URL or heading path: left out, as before sections existed.
    response_model_exclude_none=True,
    responses={403: {"model": ErrorResponse}, 422: {"model": ErrorResponse}},
)
async def retrieve(
    body: RetrieveBody, components: ComponentsDep, http_request: Request
) -> RetrieveOut:
    """The retrieval stage alone: ranked passages for a query, in one mode (the top_k of
    those `filters` and the key's collections allow)."""
    retriever = ready_retriever(components)
    settings = components.settings
    query = checked_query(body.query, settings)
    if body.top_k > settings.max_retrieve_k:
        raise InvalidRequestError(
            f"`top_k` is {body.top_k}; the limit is {settings.max_retrieve_k}"
        )
    allowed = passage_filter(body.filters, request_key(http_request))
    mode = body.mode or settings.retrieval_mode
    if mode not in retriever.modes():
        raise InvalidRequestError(f"the index offers no {mode!r} retrieval: {retriever.modes()}")
    deadline = Deadline.after_ms(settings.default_ttft_budget_ms * settings.ttft_timeout_factor)
    try:
        found = await retriever.retrieve(
            query, body.top_k, deadline, mode=mode, passage_filter=allowed
        )
    except RetrievalTimeoutError as exc:
        raise StageTimeoutError(str(exc)) from exc
    passages = [RetrievedOut.of(p.passage, p.score) for p in found.passages]
    timings = {"embed": found.embed_ms, "search": found.search_ms}
    return RetrieveOut(mode=mode, passages=passages, timings_ms=timings)


@router.get("/metrics", response_class=Response)
async def metrics(components: ComponentsDep) -> Response:
    """Prometheus exposition: request outcomes, TTFT and stage histograms, SLO attainment,
    cuts and cached tokens, by tier, stage and worker (answer_service/runtime/observability/metrics.py)."""
    return Response(components.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)


@router.get("/v1/traces")
async def recent_traces(
    components: ComponentsDep,
    http_request: Request,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
) -> list[dict[str, Any]]:
    """Recent finished requests with their stage spans (the dashboard reads this). With API
    keys, a key sees its own requests' traces; an admin key (`keys add --admin`) that reads
    every collection sees all (one limited to some collections sees only its own: the others'
    may name passages of collections it may not read)."""
    key = request_key(http_request)
    if key is None or (key.admin and key.collections is None):
        found = components.recent.recent(limit)
    else:
        found = components.recent.recent(
            limit, where=lambda t: t.root.attributes.get("answer.key_id") == key.key_id
        )
    return [asdict(trace) for trace in found]


def _error_response(status: int, code: str, message: str, **extra: Any) -> JSONResponse:
    headers = {}
    if (retry_after := extra.pop("retry_after_s", None)) is not None:
        headers["Retry-After"] = str(retry_after)
    body = {"error": {"code": code, "message": message, **extra}}
    return JSONResponse(body, status_code=status, headers=headers)


async def _service_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ServiceError)
    if exc.status_code >= 500:
        logger.warning("request failed code=%s error=%s", exc.code, exc.message)
    return _error_response(exc.status_code, exc.code, exc.message, retry_after_s=exc.retry_after_s)


async def _validation_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    details = [
        {"loc": list(err.get("loc", ())), "msg": err.get("msg", ""), "type": err.get("type", "")}
        for err in exc.errors()
    ]
    summary = "; ".join(
        f"{'.'.join(str(part) for part in d['loc'][1:]) or 'body'}: {d['msg']}" for d in details
    )
    return _error_response(422, "invalid_request", summary or "invalid request", details=details)


def create_app(settings: Settings | None = None, experiment: Experiment = SHIPPED) -> FastAPI:
    """The app; `experiment` only where an eval or a test varies what the service fixes."""
    settings = settings or Settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        assert settings is not None
        components = Components.create(settings, experiment)
        app.state.components = components
        components.start_warm_up()
        try:
            async with mcp.running():
                yield
        finally:
            await components.aclose()

    app = FastAPI(
        title="answer-service",
        version="0.1.0",
        summary="Streamed, sourced answers inside a time-to-first-token budget.",
        lifespan=lifespan,
    )
    app.include_router(router)
    app.include_router(openai_router)
    app.include_router(responses_router)
    app.include_router(passages_router)
    app.include_router(documents_router)
    document_limits(app, settings)
    app.include_router(dashboard_router)
    app.include_router(page_router)
    mount_static(app)
    mcp = McpMount(app)
    app.add_middleware(AccessMiddleware)
    if cors := settings.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=cors,
            allow_methods=["GET", "POST"],
            allow_headers=["authorization", "content-type", "x-api-key", "x-tenant-tier"],
            expose_headers=["retry-after"],
            max_age=600,
        )
    app.add_exception_handler(ServiceError, _service_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    return app
