"""`POST /v1/chat/completions`: the answer pipeline behind OpenAI's chat completions API, so
the official `openai` client works unchanged (Perplexity's shape for the sources).

The last user message is the query. The TTFT budget, `top_k`, the tier and sources-only come
from extra body fields (`ttft_budget_ms`, `top_k`, `tier`, `allow_sources_only`, `answer_mode`; the client's
`extra_body`) or, for the tier, the `X-Tenant-Tier` header. The sources come back as
`search_results` (title, url, snippet) and `citations` (the urls, in source order), and a
quote's `short_answer` (text, start, end: characters of the content) beside them, the url
being the section's own where the index knows it (`index build --source-url`, a canonical link,
front matter), else the passage id; `usage.prompt_tokens_details.cached_tokens` is what SGLang served from its cache.
Streaming sends `chat.completion.chunk`s as `data:` lines: first the role and the sources, then
the text, then the finish reason and the usage, then `[DONE]`; a failure after the stream began
is a `data: {"error": ...}` line before `[DONE]`, as OpenAI streams errors.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Header, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr
from starlette.background import BackgroundTask

from answer_service.errors import InvalidRequestError
from answer_service.http.answering import (
    Collected,
    ComponentsDep,
    collect_while_connected,
    start_openai_answer,
)
from answer_service.http.schemas import ErrorResponse, ServiceFields
from answer_service.pipeline.answer_pipeline import AnswerPipeline, PreparedAnswer
from answer_service.pipeline.events import (
    AnswerStats,
    DoneEvent,
    ErrorEvent,
    ShortAnswer,
    Source,
    TokenEvent,
)

router = APIRouter()


class TextPart(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["text"]
    text: StrictStr


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: StrictStr | list[TextPart] | None = None
    name: StrictStr | None = None

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content)
        return self.content or ""


class StreamOptions(BaseModel):
    include_usage: StrictBool = False


class ChatCompletionBody(ServiceFields):
    """OpenAI's chat completion request, less what an answer engine cannot honour (tools,
    logprobs, n > 1): those are refused by name rather than silently ignored. `max_tokens`,
    `temperature` and `top_p` are accepted for compatibility; the service's own settings
    decide them (`ANSWER_MAX_NEW_TOKENS`; greedy decoding). The service's own fields come
    from `ServiceFields`."""

    model: StrictStr | None = None
    messages: list[ChatMessage] = Field(min_length=1)
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    max_tokens: StrictInt | None = Field(default=None, ge=1)
    max_completion_tokens: StrictInt | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    n: Literal[1] | None = None
    user: StrictStr | None = None

    def query(self) -> str:
        for message in reversed(self.messages):
            if message.role == "user":
                if not message.text().strip():
                    raise InvalidRequestError("the last user message, the query, is empty")
                return message.text()
        raise InvalidRequestError("`messages` has no user message: the last one is the query")

    def history(self) -> list[tuple[str, str]]:
        """The messages before the last user message, as (role, text): the conversation a
        follow-up is made standalone from."""
        last = max((i for i, m in enumerate(self.messages) if m.role == "user"), default=0)
        return [(m.role, m.text()) for m in self.messages[:last]]


def _url(source: Source) -> str:
    return source.url or source.passage_id


def _search_results(sources: tuple[Source, ...]) -> list[dict[str, Any]]:
    return [{"title": s.title, "url": _url(s), "snippet": s.snippet, "date": None} for s in sources]


def _short_answer(short: ShortAnswer | None) -> dict[str, Any]:
    """A quote's short answer (characters start..end of the content), beside the sources in
    every chunk as they are: known before the first token."""
    if short is None:
        return {}
    return {"short_answer": {"text": short.text, "start": short.start, "end": short.end}}


def _usage(stats: AnswerStats) -> dict[str, Any]:
    return {
        "prompt_tokens": stats.prompt_tokens,
        "completion_tokens": stats.completion_tokens,
        "total_tokens": stats.prompt_tokens + stats.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": stats.cached_tokens},
    }


def _finish_reason(stats: AnswerStats) -> str:
    return "length" if stats.finish_reason == "length" else "stop"


class _Completion:
    """What every chunk or the whole completion carries about this request."""

    def __init__(self, prepared: PreparedAnswer, model: str) -> None:
        self.id = f"chatcmpl-{prepared.trace_id}"
        self.created = int(time.time())
        self.model = model
        self.prepared = prepared

    def head(self, kind: str) -> dict[str, Any]:
        sources = self.prepared.sources
        return {
            "id": self.id,
            "object": kind,
            "created": self.created,
            "model": self.model,
            "search_results": _search_results(sources),
            "citations": [_url(s) for s in sources],
            **_short_answer(self.prepared.short_answer),
        }

    def whole(self, collected: Collected) -> dict[str, Any]:
        message = {"role": "assistant", "content": collected.cited_text}
        choice = {"index": 0, "message": message, "finish_reason": _finish_reason(collected.stats)}
        body = {**self.head("chat.completion"), "choices": [choice]}
        body["usage"] = _usage(collected.stats)
        if collected.error is not None:
            body["error"] = _error(collected.error)
        return body

    def chunk(self, delta: dict[str, Any], finish_reason: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "finish_reason": finish_reason}
        return _data({**self.head("chat.completion.chunk"), "choices": [choice]})


def _error(error: ErrorEvent) -> dict[str, Any]:
    return {"message": error.message, "type": error.code, "code": error.code}


def _data(payload: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n".encode()


async def _chunks(
    pipeline: AnswerPipeline, completion: _Completion, include_usage: bool
) -> AsyncIterator[bytes]:
    yield completion.chunk({"role": "assistant", "content": ""})
    error: ErrorEvent | None = None
    stats: AnswerStats | None = None
    async for event in pipeline.events(completion.prepared):
        if isinstance(event, TokenEvent):
            yield completion.chunk({"content": event.text})
        elif isinstance(event, ErrorEvent):
            error = event
        elif isinstance(event, DoneEvent):
            stats = event.stats
    if error is not None:
        yield _data({"error": _error(error)})
    assert stats is not None, "the pipeline always ends with done"
    yield completion.chunk({}, _finish_reason(stats))
    if include_usage:
        yield _data(
            {**completion.head("chat.completion.chunk"), "choices": [], "usage": _usage(stats)}
        )
    yield b"data: [DONE]\n\n"


@router.post(
    "/v1/chat/completions",
    responses={
        200: {"content": {"text/event-stream": {}}, "description": "a completion or its chunks"},
        422: {"model": ErrorResponse},
        503: {"model": ErrorResponse},
    },
)
async def chat_completions(
    body: ChatCompletionBody,
    components: ComponentsDep,
    http_request: Request,
    x_tenant_tier: Annotated[str | None, Header(description="The tenant tier.")] = None,
) -> Response:
    started = await start_openai_answer(
        http_request, components, body.query(), body, x_tenant_tier, body.history()
    )
    if started is None:
        return Response(status_code=499)
    pipeline, prepared = started
    completion = _Completion(prepared, components.served_model or body.model or "answer-service")
    if not body.stream:

        def render(collected: Collected) -> Response:
            return JSONResponse(completion.whole(collected), status_code=collected.status_code)

        return await collect_while_connected(http_request, pipeline, prepared, render)

    async def release() -> None:
        prepared.close_nowait()

    include_usage = body.stream_options is not None and body.stream_options.include_usage
    return StreamingResponse(
        _chunks(pipeline, completion, include_usage),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        background=BackgroundTask(release),
    )
