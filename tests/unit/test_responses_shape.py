"""The Responses shape of an answer (answer_service/http/responses.py), from the events of a
pipeline built from fakes: every streamed event and the whole response validate against the
official `openai` client's own types, the annotations index the text exactly as sent, the
stream and the non-streaming response agree, and an answer that ran out of tokens or failed
ends as the client expects. Plus what `POST /v1/responses` takes as its query."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest
from openai.types.responses import (
    Response,
    ResponseOutputMessage,
    ResponseOutputText,
    ResponseStreamEvent,
)
from openai.types.responses.response_output_text import AnnotationURLCitation
from pydantic import TypeAdapter, ValidationError

from answer_service.http.answering import Collected
from answer_service.http.responses import ResponseEvents, ResponseShape, whole_response
from answer_service.http.responses_schemas import ResponsesBody
from answer_service.pipeline.events import (
    AnswerRequest,
    CitationEvent,
    DoneEvent,
    ErrorEvent,
    PipelineEvent,
    SourcesEvent,
    TokenEvent,
)
from budget import Deadline
from budget.forms import AnswerMode
from tests.builders import make_index, make_pipeline
from tests.fakes.scripted_generation import ScriptedGeneration, words

ANSWER = "Green tea steeps for two minutes. Mount Etna is a volcano on Sicily."
STREAM_EVENT: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_index(tmp_path_factory.mktemp("responses"))


async def pipeline_events(
    index_dir: Path, query: str, answer_mode: AnswerMode = "passages"
) -> list[PipelineEvent]:
    generation = ScriptedGeneration(words(ANSWER))
    pipeline, _ = make_pipeline(index_dir, workers=[generation], answer_mode=answer_mode)
    prepared = await pipeline.prepare(AnswerRequest(query, 5_000, 3), Deadline.after_ms(5_000))
    return [event async for event in pipeline.events(prepared)]


def url_of(passage_id: str) -> str:
    return f"http://answers.test/v1/passages/{passage_id}"


def shape_of(events: list[PipelineEvent]) -> ResponseShape:
    sources = next(e for e in events if isinstance(e, SourcesEvent)).sources
    done = events[-1]
    assert isinstance(done, DoneEvent)
    return ResponseShape(done.stats.trace_id, "test/scripted", sources, url_of, created_at=1)


def stream(events: list[PipelineEvent]) -> list[dict[str, Any]]:
    """The streamed events as the client gets them, each validated by its own types."""
    writer = ResponseEvents(shape_of(events))
    out = [*writer.start(), *(e for event in events for e in writer.feed(event))]
    dumped = [e.model_dump(mode="json") for e in out]
    for event in dumped:
        STREAM_EVENT.validate_python(event)
    assert [e["sequence_number"] for e in dumped] == list(range(len(dumped)))
    return dumped


def collected(events: list[PipelineEvent]) -> Collected:
    text = "".join(e.text for e in events if isinstance(e, TokenEvent))
    citations = tuple(e.citation for e in events if isinstance(e, CitationEvent))
    errors = [e for e in events if isinstance(e, ErrorEvent)]
    done = events[-1]
    assert isinstance(done, DoneEvent)
    return Collected(text, errors[0] if errors else None, done.stats, citations)


def text_part(response: Response) -> tuple[ResponseOutputMessage, ResponseOutputText]:
    """The one message item and its one text part."""
    (item,) = response.output
    assert isinstance(item, ResponseOutputMessage)
    (part,) = item.content
    assert isinstance(part, ResponseOutputText)
    return item, part


def check_annotations(response: Response) -> list[str]:
    """The cited spans of the text as sent (which holds no ` [n]` marker)."""
    _, part = text_part(response)
    assert not re.search(r"\[\d+\]", part.text)
    spans = []
    for annotation in part.annotations:
        assert isinstance(annotation, AnnotationURLCitation)
        span = part.text[annotation.start_index : annotation.end_index]
        assert span
        assert span == span.strip()
        assert annotation.url.startswith("http://answers.test/v1/passages/")
        spans.append(span)
    return spans


async def test_a_generated_answer_streams_its_text_then_each_sentence_s_citations(
    index_dir: Path,
) -> None:
    events = await pipeline_events(index_dir, "How long does green tea steep?")
    streamed = stream(events)
    types = [e["type"] for e in streamed]
    assert types[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert types[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    text = "".join(e["delta"] for e in streamed if e["type"] == "response.output_text.delta")
    assert text == ANSWER
    added = [e for e in streamed if e["type"] == "response.output_text.annotation.added"]
    assert [e["annotation_index"] for e in added] == list(range(len(added)))
    # An annotation comes once its sentence has been sent, not before.
    for event in added:
        at = streamed.index(event)
        sent = "".join(
            e["delta"] for e in streamed[:at] if e["type"] == "response.output_text.delta"
        )
        assert len(sent) >= event["annotation"]["end_index"]

    final = Response.model_validate(streamed[-1]["response"])
    assert final.status == "completed"
    assert final.output_text == ANSWER
    spans = check_annotations(final)
    assert "Green tea steeps for two minutes." in spans
    assert [a["annotation"] for a in added] == [
        a.model_dump() for a in text_part(final)[1].annotations
    ]
    sources = next(e for e in events if isinstance(e, SourcesEvent)).sources
    assert [r["url"] for r in (final.model_extra or {})["search_results"]] == [
        url_of(s.passage_id) for s in sources
    ]
    assert final.usage is not None
    assert final.usage.output_tokens > 0
    assert final.usage.total_tokens == final.usage.input_tokens + final.usage.output_tokens

    whole = whole_response(shape_of(events), collected(events)).model_dump(mode="json")
    Response.model_validate(whole)
    assert {**whole, "completed_at": None} == {**streamed[-1]["response"], "completed_at": None}


async def test_a_quote_cites_every_sentence_and_uses_no_model_tokens(index_dir: Path) -> None:
    events = await pipeline_events(index_dir, "Where is Mount Etna?", answer_mode="quote")
    response = Response.model_validate(stream(events)[-1]["response"])
    assert response.status == "completed"
    spans = check_annotations(response)
    quoted = [e.citation for e in events if isinstance(e, CitationEvent)]
    assert quoted
    assert spans == [response.output_text[c.start : c.end] for c in quoted]
    assert any("Mount Etna is an active volcano on the island of Sicily" in s for s in spans)
    assert response.usage is not None
    assert response.usage.output_tokens == 0


async def test_an_answer_cut_by_its_token_limit_is_incomplete(index_dir: Path) -> None:
    events = await pipeline_events(index_dir, "How long does green tea steep?")
    done = events[-1]
    assert isinstance(done, DoneEvent)
    cut = [*events[:-1], DoneEvent(dataclasses.replace(done.stats, finish_reason="length"))]
    streamed = stream(cut)
    assert streamed[-1]["type"] == "response.incomplete"
    response = Response.model_validate(streamed[-1]["response"])
    assert response.status == "incomplete"
    assert response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"
    assert text_part(response)[0].status == "incomplete"


async def test_a_failure_mid_answer_is_an_error_event_then_a_failed_response(
    index_dir: Path,
) -> None:
    events = await pipeline_events(index_dir, "How long does green tea steep?")
    failed = [*events[:3], ErrorEvent("generate", "generation_timeout", "too slow"), events[-1]]
    streamed = stream(failed)
    (error,) = [e for e in streamed if e["type"] == "error"]
    assert (error["code"], error["message"]) == ("generation_timeout", "too slow")
    assert streamed[-1]["type"] == "response.failed"
    response = Response.model_validate(streamed[-1]["response"])
    assert response.status == "failed"
    assert response.error is not None
    assert response.error.message == "generation_timeout: too slow"
    whole = whole_response(shape_of(failed), collected(failed))
    assert whole.status == "failed"
    assert collected(failed).status_code == 504


@pytest.mark.parametrize(
    ("given", "query"),
    [
        ({"input": "  What is green tea?"}, "  What is green tea?"),
        (
            {
                "input": [
                    {"role": "user", "content": "earlier"},
                    {
                        "type": "message",
                        "role": "assistant",
                        "id": "msg_1",
                        "status": "completed",
                        "content": [{"type": "output_text", "text": "ok", "annotations": []}],
                    },
                    {"role": "user", "content": [{"type": "input_text", "text": "Tea?"}]},
                    {"role": "developer", "content": "be brief"},
                ],
                "instructions": "accepted, not used",
                "tools": [],
                "tool_choice": "none",
            },
            "Tea?",
        ),
    ],
)
def test_the_query_is_the_input_or_its_last_user_message(given: dict[str, Any], query: str) -> None:
    assert ResponsesBody.model_validate(given).query() == query


def test_what_cannot_be_honoured_is_refused_by_name() -> None:
    tool = {"type": "function", "name": "f", "parameters": {}}
    with pytest.raises(ValidationError, match="`tools` is not supported"):
        ResponsesBody.model_validate({"input": "q", "tools": [tool]})
    with pytest.raises(ValidationError, match="`conversation` is not supported"):
        ResponsesBody.model_validate({"input": "q", "conversation": "conv_1"})
    continued = ResponsesBody.model_validate({"input": "q", "previous_response_id": "resp_1"})
    assert continued.previous_response_id == "resp_1"
    with pytest.raises(ValidationError, match="Extra inputs"):
        ResponsesBody.model_validate({"input": "q", "frobnicate": 1})
    with pytest.raises(ValidationError, match="input_text"):
        ResponsesBody.model_validate(
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}
        )
