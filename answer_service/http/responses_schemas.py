"""Pydantic models of `POST /v1/responses`: the request as the official `openai` client's
`responses.create` sends it, and the `Response` object and streaming events it parses
(openai/types/responses/), plus Perplexity's `search_results`."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    model_validator,
)

from answer_service.errors import InvalidRequestError
from answer_service.http.schemas import ServiceFields, ShortAnswerOut

# Parameters of `responses.create` an answer engine cannot honour: refused by name, with why,
# rather than silently ignored. Other unknown fields are refused as unknown.
_UNSUPPORTED = {
    "tools": "the service answers from its own index, without tools",
    "tool_choice": "the service answers from its own index, without tools",
    "conversation": "conversation objects are not kept: send `previous_response_id`, or the "
    "conversation in `input`",
    "background": "answers are streamed or returned, not run in the background",
    "include": "nothing extra can be included",
    "text": "the answer is plain text; no other output format is offered",
    "reasoning": "the service's model does not reason",
}
_HARMLESS: dict[str, tuple[object, ...]] = {
    "tool_choice": ("none", "auto"),
    "text": ({"format": {"type": "text"}},),
}


class InputText(BaseModel):
    """Text content of an input message; `output_text` is an earlier answer sent back as
    history (its annotations are read past)."""

    model_config = ConfigDict(extra="ignore")

    type: Literal["input_text", "output_text"]
    text: StrictStr


class InputMessage(BaseModel):
    """A message item of `input` (an easy input message, or an output message sent back)."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["message"] | None = None
    role: Literal["user", "assistant", "system", "developer"]
    content: StrictStr | list[InputText]
    id: StrictStr | None = None
    status: StrictStr | None = None
    phase: StrictStr | None = None

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content)
        return self.content


class ResponsesStreamOptions(BaseModel):
    include_obfuscation: StrictBool | None = None


class ResponsesBody(ServiceFields):
    """OpenAI's response request, less what an answer engine cannot honour (`_UNSUPPORTED`).
    The query is `input` (a string) or its last user message; the messages before it, after
    those of `previous_response_id`'s conversation (kept an hour per API key), are its history.
    `instructions`, like a system message on chat completions, is accepted and not used: the
    service has its own prompt. `max_output_tokens`, `temperature` and `top_p` are accepted
    for compatibility; the service's settings decide them. Every response's conversation is
    kept to be continued (`store` is accepted and not used)."""

    model: StrictStr | None = None
    input: StrictStr | list[InputMessage]
    instructions: StrictStr | None = None
    stream: StrictBool = False
    stream_options: ResponsesStreamOptions | None = None
    max_output_tokens: StrictInt | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    store: StrictBool | None = None
    metadata: dict[str, StrictStr] | None = None
    user: StrictStr | None = None
    previous_response_id: StrictStr | None = None

    @model_validator(mode="before")
    @classmethod
    def _refuse_unsupported(cls, data: Any) -> Any:
        """A parameter the service cannot honour is refused by name; one that asks for nothing
        (`tools: []`, `tool_choice: "none"`, a plain-text `text` format) is dropped."""
        if not isinstance(data, dict):
            return data
        kept = dict(data)
        for name, why in _UNSUPPORTED.items():
            if name not in kept:
                continue
            value = kept.pop(name)
            if value not in (None, False, [], {}) and value not in _HARMLESS.get(name, ()):
                raise ValueError(f"`{name}` is not supported: {why}")
        return kept

    def query(self) -> str:
        if isinstance(self.input, str):
            if not self.input.strip():
                raise InvalidRequestError("`input`, the query, is empty")
            return self.input
        for message in reversed(self.input):
            if message.role == "user":
                if not message.text().strip():
                    raise InvalidRequestError("the last user message, the query, is empty")
                return message.text()
        raise InvalidRequestError("`input` has no user message: the last one is the query")

    def history(self) -> list[tuple[str, str]]:
        """The input messages before the last user message, as (role, text)."""
        if isinstance(self.input, str):
            return []
        last = max((i for i, m in enumerate(self.input) if m.role == "user"), default=0)
        return [(m.role, m.text()) for m in self.input[:last]]


class UrlCitation(BaseModel):
    """Characters `start_index`..`end_index` of the text (a whole answer sentence) are
    supported by the passage at `url` (its section's own URL, else `GET /v1/passages/{id}`)."""

    type: Literal["url_citation"] = "url_citation"
    start_index: int
    end_index: int
    url: str
    title: str


class OutputText(BaseModel):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[UrlCitation]
    logprobs: list[Any] = []


MessageStatus = Literal["in_progress", "completed", "incomplete"]


class OutputMessage(BaseModel):
    type: Literal["message"] = "message"
    id: str
    role: Literal["assistant"] = "assistant"
    status: MessageStatus
    content: list[OutputText]


class InputTokensDetails(BaseModel):
    # What SGLang served from its prefix cache.
    cached_tokens: int
    # The service does not count cache writes (SGLang's radix cache keeps what it can).
    cache_write_tokens: int = 0


class OutputTokensDetails(BaseModel):
    reasoning_tokens: int = 0


class ResponseUsage(BaseModel):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails = OutputTokensDetails()
    total_tokens: int


class ResponseErrorOut(BaseModel):
    # OpenAI's codes; the service's own code is the `error` event's and the message's start.
    code: Literal["server_error"] = "server_error"
    message: str


class IncompleteDetails(BaseModel):
    reason: Literal["max_output_tokens"] = "max_output_tokens"


class SearchResult(BaseModel):
    """A source, as Perplexity lists them; `url` is its section's, else the passage's here."""

    title: str
    url: str
    snippet: str
    date: str | None = None


ResponseStatus = Literal["in_progress", "completed", "incomplete", "failed"]


class ResponseObject(BaseModel):
    """OpenAI's `Response` (what the client requires, and what the service knows) with the
    sources as `search_results`."""

    id: str
    object: Literal["response"] = "response"
    created_at: int
    completed_at: int | None = None
    status: ResponseStatus
    model: str
    output: list[OutputMessage]
    error: ResponseErrorOut | None = None
    incomplete_details: IncompleteDetails | None = None
    instructions: None = None
    parallel_tool_calls: bool = False
    tool_choice: Literal["none"] = "none"
    tools: list[Any] = []
    usage: ResponseUsage | None = None
    search_results: list[SearchResult]
    # A quote's short answer: characters start..end of the output text.
    short_answer: ShortAnswerOut | None = None


LifecycleType = Literal[
    "response.created",
    "response.in_progress",
    "response.completed",
    "response.incomplete",
    "response.failed",
]


class LifecycleEvent(BaseModel):
    type: LifecycleType
    sequence_number: int
    response: ResponseObject


class OutputItemEvent(BaseModel):
    type: Literal["response.output_item.added", "response.output_item.done"]
    sequence_number: int
    item: OutputMessage
    output_index: int = 0


class InPart(BaseModel):
    """Where in the response an event lands: the service's one message item (output 0) and
    its one text part (content 0)."""

    item_id: str
    output_index: int = 0
    content_index: int = 0


class ContentPartEvent(InPart):
    type: Literal["response.content_part.added", "response.content_part.done"]
    sequence_number: int
    part: OutputText


class TextDeltaEvent(InPart):
    type: Literal["response.output_text.delta"] = "response.output_text.delta"
    sequence_number: int
    delta: str
    logprobs: list[Any] = []


class TextDoneEvent(InPart):
    type: Literal["response.output_text.done"] = "response.output_text.done"
    sequence_number: int
    text: str
    logprobs: list[Any] = []


class AnnotationAddedEvent(InPart):
    type: Literal["response.output_text.annotation.added"] = "response.output_text.annotation.added"
    sequence_number: int
    annotation_index: int
    annotation: UrlCitation


class StreamErrorEvent(BaseModel):
    type: Literal["error"] = "error"
    sequence_number: int
    code: str
    message: str
    param: str | None = None


StreamEvent = (
    LifecycleEvent
    | OutputItemEvent
    | ContentPartEvent
    | TextDeltaEvent
    | TextDoneEvent
    | AnnotationAddedEvent
    | StreamErrorEvent
)
