"""`POST /v1/responses`: the answer pipeline behind OpenAI's Responses API (the shape
Perplexity's API took), so the official `openai` client's `responses.create` works unchanged.

The query is `input` (a string) or its last user message, after the conversation that
`previous_response_id` names (this key's response, kept an hour: 404 for another key's, an
unknown or an expired one) and the input messages before it; the service's own fields come as
on chat completions (`extra_body`: `ttft_budget_ms`, `top_k`, `tier`, `allow_sources_only`,
`answer_mode`; the tier also from `X-Tenant-Tier`), checked by the same code.

The answer is one `message` output item with one `output_text` part: the text as the pipeline
streamed it (no ` [n]` markers), and a `url_citation` for each source that supports an answer
sentence, `start_index`..`end_index` being the sentence's characters in that text (Python
string indices: code points). The `url` is the section's own where the index knows it (`index
build --source-url`, a canonical link, front matter), else the passage's in this service, `GET
/v1/passages/{id}`, which always resolves; the sources come as `search_results` (title, that
url, snippet).

Status: `completed`; `incomplete` (`incomplete_details.reason` "max_output_tokens") when the
answer ran into its token limit; `failed` with `error` when generation failed after the
answer began. Streaming sends the events the client parses, numbered by `sequence_number`:
`response.created`, `response.in_progress`, `response.output_item.added`,
`response.content_part.added`, then `response.output_text.delta`s with a
`response.output_text.annotation.added` after each cited sentence, then
`response.output_text.done`, `response.content_part.done`, `response.output_item.done` and
`response.completed` (or `response.incomplete`); a failure is an `error` event (the service's
code) and the stream ends with `response.failed`. A failure before the answer began is an
HTTP error, as on the other routes.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Annotated

from fastapi import APIRouter, Header, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse
from fastapi.sse import format_sse_event
from starlette.background import BackgroundTask

from answer_service.errors import NotFoundError
from answer_service.http.answering import (
    Collected,
    ComponentsDep,
    collect_while_connected,
    request_key,
    start_openai_answer,
)
from answer_service.http.passages import passage_url
from answer_service.http.responses_schemas import (
    AnnotationAddedEvent,
    ContentPartEvent,
    IncompleteDetails,
    InputTokensDetails,
    LifecycleEvent,
    LifecycleType,
    MessageStatus,
    OutputItemEvent,
    OutputMessage,
    OutputText,
    ResponseErrorOut,
    ResponseObject,
    ResponsesBody,
    ResponseStatus,
    ResponseUsage,
    SearchResult,
    StreamErrorEvent,
    StreamEvent,
    TextDeltaEvent,
    TextDoneEvent,
    UrlCitation,
)
from answer_service.http.schemas import ErrorResponse, ShortAnswerOut
from answer_service.pipeline.answer_pipeline import AnswerPipeline, PreparedAnswer
from answer_service.pipeline.attribution import Citation
from answer_service.pipeline.events import (
    AnswerStats,
    CitationEvent,
    DoneEvent,
    ErrorEvent,
    PipelineEvent,
    ShortAnswer,
    Source,
    TokenEvent,
)
from answer_service.runtime.conversations import TTL_S, ConversationStore
from retrieval.query_rewrite import Turn

router = APIRouter()

_FINAL_EVENT: dict[ResponseStatus, LifecycleType] = {
    "completed": "response.completed",
    "incomplete": "response.incomplete",
    "failed": "response.failed",
    "in_progress": "response.in_progress",
}


class ResponseShape:
    """What every snapshot of one response carries (its id, time, model and sources), and how
    the service's citations become `url_citation`s."""

    def __init__(
        self,
        trace_id: str,
        model: str,
        sources: Sequence[Source],
        url_of: Callable[[str], str],
        created_at: int | None = None,
        short_answer: ShortAnswer | None = None,
    ) -> None:
        self.id = f"resp_{trace_id}"
        self.item_id = f"msg_{trace_id}"
        self.model = model
        self.created_at = int(time.time()) if created_at is None else created_at
        self._url_of = url_of
        self._sources = {s.number: s for s in sources}
        self._results = [
            SearchResult(title=s.title, url=self._url(s), snippet=s.snippet) for s in sources
        ]
        self._short = ShortAnswerOut.of(short_answer)

    def _url(self, source: Source) -> str:
        """The section's own URL, else the passage's in this service (`url_of`)."""
        return source.url or self._url_of(source.passage_id)

    def annotations(self, citation: Citation) -> list[UrlCitation]:
        """One per source that supports the sentence (none for an unsupported one)."""
        return [
            UrlCitation(
                start_index=citation.start,
                end_index=citation.end,
                url=self._url(source),
                title=source.title,
            )
            for n in citation.sources
            if (source := self._sources.get(n)) is not None
        ]

    def message(self, status: MessageStatus, part: OutputText) -> OutputMessage:
        return OutputMessage(id=self.item_id, status=status, content=[part])

    def snapshot(self, status: ResponseStatus, output: list[OutputMessage]) -> ResponseObject:
        return ResponseObject(
            id=self.id,
            created_at=self.created_at,
            status=status,
            model=self.model,
            output=output,
            search_results=self._results,
            short_answer=self._short,
        )

    def final(
        self, part: OutputText, stats: AnswerStats, error: ErrorEvent | None
    ) -> ResponseObject:
        """The whole response, its status from how the answer ended."""
        status: ResponseStatus = "completed"
        if error is not None:
            status = "failed"
        elif stats.finish_reason == "length":
            status = "incomplete"
        item = self.message("completed" if status == "completed" else "incomplete", part)
        response = self.snapshot(status, [item])
        response.completed_at = int(time.time())
        response.usage = _usage(stats)
        if error is not None:
            response.error = ResponseErrorOut(message=f"{error.code}: {error.message}")
        if status == "incomplete":
            response.incomplete_details = IncompleteDetails()
        return response


def _usage(stats: AnswerStats) -> ResponseUsage:
    return ResponseUsage(
        input_tokens=stats.prompt_tokens,
        input_tokens_details=InputTokensDetails(cached_tokens=stats.cached_tokens),
        output_tokens=stats.completion_tokens,
        total_tokens=stats.prompt_tokens + stats.completion_tokens,
    )


class ResponseEvents:
    """The streaming events of one response, from the pipeline's events, in order."""

    def __init__(self, shape: ResponseShape) -> None:
        self._shape = shape
        self._sequence = 0
        self.text = ""
        self.annotations: list[UrlCitation] = []
        self._error: ErrorEvent | None = None

    def _number(self) -> int:
        self._sequence += 1
        return self._sequence - 1

    def _part(self) -> OutputText:
        return OutputText(text=self.text, annotations=list(self.annotations))

    def start(self) -> list[StreamEvent]:
        shape = self._shape
        return [
            LifecycleEvent(
                type="response.created",
                sequence_number=self._number(),
                response=shape.snapshot("in_progress", []),
            ),
            LifecycleEvent(
                type="response.in_progress",
                sequence_number=self._number(),
                response=shape.snapshot("in_progress", []),
            ),
            OutputItemEvent(
                type="response.output_item.added",
                sequence_number=self._number(),
                item=OutputMessage(id=shape.item_id, status="in_progress", content=[]),
            ),
            ContentPartEvent(
                type="response.content_part.added",
                sequence_number=self._number(),
                item_id=shape.item_id,
                part=self._part(),
            ),
        ]

    def feed(self, event: PipelineEvent) -> list[StreamEvent]:
        match event:
            case TokenEvent(text) if text:
                self.text += text
                delta = TextDeltaEvent(
                    sequence_number=self._number(), item_id=self._shape.item_id, delta=text
                )
                return [delta]
            case CitationEvent(citation):
                return [self._annotation(a) for a in self._shape.annotations(citation)]
            case ErrorEvent(_, code, message):
                self._error = event
                return [
                    StreamErrorEvent(sequence_number=self._number(), code=code, message=message)
                ]
            case DoneEvent(stats):
                return self._end(stats)
        return []

    def _annotation(self, annotation: UrlCitation) -> AnnotationAddedEvent:
        self.annotations.append(annotation)
        return AnnotationAddedEvent(
            sequence_number=self._number(),
            annotation_index=len(self.annotations) - 1,
            item_id=self._shape.item_id,
            annotation=annotation,
        )

    def _end(self, stats: AnswerStats) -> list[StreamEvent]:
        response = self._shape.final(self._part(), stats, self._error)
        item_id = self._shape.item_id
        return [
            TextDoneEvent(sequence_number=self._number(), item_id=item_id, text=self.text),
            ContentPartEvent(
                type="response.content_part.done",
                sequence_number=self._number(),
                item_id=item_id,
                part=self._part(),
            ),
            OutputItemEvent(
                type="response.output_item.done",
                sequence_number=self._number(),
                item=response.output[0],
            ),
            LifecycleEvent(
                type=_FINAL_EVENT[response.status],
                sequence_number=self._number(),
                response=response,
            ),
        ]


def whole_response(shape: ResponseShape, collected: Collected) -> ResponseObject:
    """The non-streaming response of a collected answer."""
    annotations = [a for c in collected.citations for a in shape.annotations(c)]
    part = OutputText(text=collected.text, annotations=annotations)
    return shape.final(part, collected.stats, collected.error)


def _sse(event: StreamEvent) -> bytes:
    return format_sse_event(data_str=event.model_dump_json(), event=event.type)


async def _stream(
    pipeline: AnswerPipeline,
    prepared: PreparedAnswer,
    shape: ResponseShape,
    answered: Callable[[str], Awaitable[None]],
) -> AsyncIterator[bytes]:
    """The response's events; `answered` gets the whole text of an answer that did not fail."""
    events = ResponseEvents(shape)
    for out in events.start():
        yield _sse(out)
    failed = False
    async for event in pipeline.events(prepared):
        failed = failed or isinstance(event, ErrorEvent)
        if isinstance(event, DoneEvent) and not failed:
            # Kept before the client hears it is complete, so it can be continued at once.
            await answered(events.text)
        for out in events.feed(event):
            yield _sse(out)


async def _earlier_turns(
    store: ConversationStore, key_id: str | None, response_id: str | None
) -> list[tuple[str, str]]:
    """The conversation `previous_response_id` continues, as (role, text); 404 when this key
    has no such response."""
    if response_id is None:
        return []
    turns = await store.turns(key_id, response_id)
    if turns is None:
        raise NotFoundError(
            f"`previous_response_id` {response_id!r} is no response this key can continue: it "
            f"is unknown, expired (responses are kept {TTL_S / 60:.0f} minutes) or another "
            "key's"
        )
    return [(t.role, t.content) for t in turns]


@router.post(
    "/v1/responses",
    response_model=ResponseObject,
    responses={
        200: {"content": {"text/event-stream": {}}, "description": "a response or its events"},
        404: {"model": ErrorResponse},
        422: {"model": ErrorResponse},
        503: {"model": ErrorResponse},
        504: {"model": ErrorResponse},
    },
)
async def create_response(
    body: ResponsesBody,
    components: ComponentsDep,
    http_request: Request,
    x_tenant_tier: Annotated[str | None, Header(description="The tenant tier.")] = None,
) -> Response:
    key = request_key(http_request)
    key_id = key.key_id if key is not None else None
    earlier = await _earlier_turns(components.conversations, key_id, body.previous_response_id)
    query, history = body.query(), [*earlier, *body.history()]
    started = await start_openai_answer(
        http_request, components, query, body, x_tenant_tier, history
    )
    if started is None:
        return Response(status_code=499)
    pipeline, prepared = started
    shape = ResponseShape(
        prepared.trace_id,
        components.served_model or body.model or "answer-service",
        prepared.sources,
        lambda passage_id: passage_url(http_request, passage_id),
        short_answer=prepared.short_answer,
    )

    async def remember(answer: str) -> None:
        turns = [Turn("user" if r == "user" else "assistant", c) for r, c in history]
        turns += [Turn("user", query), Turn("assistant", answer)]
        await components.conversations.remember(key_id, shape.id, turns)

    if not body.stream:
        answers: list[str] = []

        def render(collected: Collected) -> Response:
            out = whole_response(shape, collected)
            if collected.error is None:
                answers.append(collected.text)
            return JSONResponse(out.model_dump(), status_code=collected.status_code)

        response = await collect_while_connected(http_request, pipeline, prepared, render)
        for answer in answers:  # kept before the client has the response
            await remember(answer)
        return response

    async def release() -> None:
        # Runs even when the client went away before the stream started.
        prepared.close_nowait()

    return StreamingResponse(
        _stream(pipeline, prepared, shape, remember),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        background=BackgroundTask(release),
    )
