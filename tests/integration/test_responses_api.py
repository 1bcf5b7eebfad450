"""`POST /v1/responses` with the official `openai` client's `responses.create`, streaming and
not, over real HTTP (real index and embedder; the real tiny SGLang, random weights: the shape,
not the words), and `GET /v1/passages/{id}`, where every cited URL leads. Failures mid-answer
and clients that leave come from a fake SGLang that fails on cue."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import openai
import pytest
from openai.types.responses import (
    Response,
    ResponseCompletedEvent,
    ResponseCreatedEvent,
    ResponseErrorEvent,
    ResponseFailedEvent,
    ResponseIncompleteEvent,
    ResponseOutputMessage,
    ResponseOutputText,
    ResponseOutputTextAnnotationAddedEvent,
    ResponseTextDeltaEvent,
)
from openai.types.responses.response_output_text import AnnotationURLCitation

from tests.fakes.fake_sglang import FakeSGLangState, create_fake_sglang
from tests.integration.conftest import TINY_ANSWERS, ServiceFactory
from tests.support import post_and_leave, serve_in_thread

pytestmark = pytest.mark.integration

QUESTION = "Which NFL team represented the AFC at Super Bowl 50?"
FIRST_PASSAGE = "Super_Bowl_50-0#0"


@pytest.fixture(scope="module")
def url(tiny_service: ServiceFactory) -> Iterator[str]:
    with tiny_service() as base:
        yield base


def client_of(base: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture
def client(url: str) -> openai.OpenAI:
    return client_of(url)


def text_part(response: Response) -> ResponseOutputText:
    """The answer: one message item holding one text part."""
    (item,) = response.output
    assert isinstance(item, ResponseOutputMessage)
    assert item.role == "assistant"
    (part,) = item.content
    assert isinstance(part, ResponseOutputText)
    return part


def search_results(response: Response) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = (response.model_extra or {})["search_results"]
    return results


def cited(response: Response) -> list[tuple[str, AnnotationURLCitation]]:
    """Each annotation with the span it cites; every one indexes the text as sent and leads
    to a passage that is one of the sources."""
    part = text_part(response)
    urls = [r["url"] for r in search_results(response)]
    out = []
    for annotation in part.annotations:
        assert isinstance(annotation, AnnotationURLCitation)
        assert 0 <= annotation.start_index < annotation.end_index <= len(part.text)
        assert annotation.url in urls
        out.append((part.text[annotation.start_index : annotation.end_index], annotation))
    return out


def check_status(response: Response) -> None:
    """Random weights seldom stop: an answer that ran into its token limit is incomplete."""
    assert response.usage is not None
    if response.status == "incomplete":
        assert response.incomplete_details is not None
        assert response.incomplete_details.reason == "max_output_tokens"
        assert response.usage.output_tokens == TINY_ANSWERS["max_new_tokens"]
    else:
        assert response.status == "completed"


@pytest.mark.sglang
def test_a_response_with_its_sources_usage_and_cited_spans(url: str, client: openai.OpenAI) -> None:
    response = client.responses.create(
        model="anything",
        instructions="accepted, not used: the service has its own prompt",
        input=[
            {"role": "user", "content": "an earlier question"},
            {"role": "assistant", "content": "an earlier answer"},
            {"role": "user", "content": [{"type": "input_text", "text": QUESTION}]},
        ],
        extra_body={"ttft_budget_ms": 10_000, "top_k": 3},
    )
    assert response.object == "response"
    assert response.id.startswith("resp_")
    assert response.output_text
    assert "[1]" not in response.output_text  # the annotations are the citations
    check_status(response)
    results = search_results(response)
    assert len(results) == 3
    assert results[0]["url"] == f"{url}/v1/passages/{quote(FIRST_PASSAGE, safe='')}"
    assert results[0]["title"] == "Super Bowl 50"
    assert results[0]["snippet"]
    cited(response)  # random words are seldom supported; any annotation must still hold
    usage = response.usage
    assert usage is not None
    assert 0 < usage.output_tokens <= TINY_ANSWERS["max_new_tokens"]
    assert usage.input_tokens > 0
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert usage.input_tokens_details.cached_tokens >= 0


@pytest.mark.sglang
def test_a_quote_cites_every_sentence_and_each_url_resolves(
    url: str, client: openai.OpenAI
) -> None:
    response = client.responses.create(
        model="anything", input=QUESTION, extra_body={"answer_mode": "quote", "top_k": 3}
    )
    assert response.status == "completed"
    spans = cited(response)
    assert spans
    # The text is the quoted sentences, each one cited: nothing else, no marker.
    assert " ".join(span for span, _ in spans) == response.output_text
    for span, annotation in spans:
        passage = httpx.get(annotation.url, timeout=10)
        assert passage.status_code == 200, passage.text
        body = passage.json()
        assert set(body) == {"id", "doc_id", "title", "text"}
        assert span in body["text"], "a quote is the passage's own words"
        assert body["title"] == annotation.title
        assert body["id"].startswith(f"{body['doc_id']}#")
    usage = response.usage
    assert usage is not None
    assert usage.output_tokens == 0, "a quote asks no model"


@pytest.mark.sglang
def test_a_streamed_response_in_the_events_the_client_parses(client: openai.OpenAI) -> None:
    events = list(
        client.responses.create(
            model="anything",
            input=QUESTION,
            stream=True,
            extra_headers={"X-Tenant-Tier": "premium"},
        )
    )
    types = [e.type for e in events]
    assert types[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert types[-4:-1] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    created, last = events[0], events[-1]
    assert isinstance(created, ResponseCreatedEvent)
    assert created.response.status == "in_progress"
    assert isinstance(last, ResponseCompletedEvent | ResponseIncompleteEvent)
    final = last.response
    assert last.type == f"response.{final.status}"
    assert final.id == created.response.id
    check_status(final)
    text = "".join(e.delta for e in events if isinstance(e, ResponseTextDeltaEvent))
    assert text
    assert text == final.output_text
    assert search_results(final) == search_results(created.response)
    assert final.usage is not None
    assert 0 < final.usage.output_tokens <= TINY_ANSWERS["max_new_tokens"]


@pytest.mark.sglang
def test_a_streamed_quote_adds_each_annotation_after_its_sentence(client: openai.OpenAI) -> None:
    events = list(
        client.responses.create(
            model="anything", input=QUESTION, stream=True, extra_body={"answer_mode": "quote"}
        )
    )
    last = events[-1]
    assert isinstance(last, ResponseCompletedEvent)
    final = last.response
    sent = ""
    added = []
    for event in events:
        if isinstance(event, ResponseTextDeltaEvent):
            sent += event.delta
        elif isinstance(event, ResponseOutputTextAnnotationAddedEvent):
            assert isinstance(event.annotation, dict)
            assert event.annotation["end_index"] <= len(sent), "sent after its sentence"
            added.append(event.annotation)
    assert added
    assert added == [a.model_dump() for a in text_part(final).annotations]
    assert final.usage is not None
    assert final.usage.output_tokens == 0


@pytest.mark.sglang
def test_bad_requests_are_clear_4xx(url: str, client: openai.OpenAI) -> None:
    with pytest.raises(openai.UnprocessableEntityError, match="answer_mode"):
        client.responses.create(model="m", input=QUESTION, extra_body={"answer_mode": "loud"})
    with pytest.raises(openai.UnprocessableEntityError, match="no user message"):
        client.responses.create(model="m", input=[{"role": "system", "content": "only this"}])
    with pytest.raises(openai.UnprocessableEntityError, match="the query, is empty"):
        client.responses.create(model="m", input="   ")
    with pytest.raises(openai.UnprocessableEntityError, match="`tools` is not supported"):
        client.responses.create(
            model="m",
            input=QUESTION,
            tools=[{"type": "function", "name": "f", "parameters": {}, "strict": True}],
        )
    with pytest.raises(openai.NotFoundError, match="no response this key can continue"):
        client.responses.create(model="m", input=QUESTION, previous_response_id="resp_1")
    with pytest.raises(openai.UnprocessableEntityError, match="`conversation` is not supported"):
        client.responses.create(model="m", input=QUESTION, extra_body={"conversation": "c_1"})
    with pytest.raises(openai.UnprocessableEntityError, match="unknown tenant tier"):
        client.responses.create(model="m", input=QUESTION, extra_body={"tier": "gold"})
    with pytest.raises(openai.UnprocessableEntityError, match="input_text"):
        client.responses.create(
            model="m",
            input=[
                {
                    "role": "user",
                    "content": [{"type": "input_image", "image_url": "x", "detail": "auto"}],
                }
            ],
        )
    refused = httpx.post(f"{url}/v1/responses", json={"input": QUESTION, "top_k": 10**6})
    assert refused.status_code == 422
    assert "`top_k` is 1000000; the limit is" in refused.json()["error"]["message"]


@pytest.mark.sglang
def test_a_passage_by_its_encoded_id_and_a_clear_404(url: str) -> None:
    found = httpx.get(f"{url}/v1/passages/{quote(FIRST_PASSAGE, safe='')}")
    assert found.status_code == 200
    assert found.json()["id"] == FIRST_PASSAGE
    assert found.json()["doc_id"] == "Super_Bowl_50-0"
    assert found.json()["title"] == "Super Bowl 50"
    assert "Denver Broncos" in found.json()["text"]
    for sent, meant in [
        ("Super_Bowl_50-0%23999", "Super_Bowl_50-0#999"),
        ("a%2Fb%23c", "a/b#c"),  # a slash in an id reaches the route whole
        # An unencoded '#' starts the URL's fragment: the client never sends it.
        ("Super_Bowl_50-0#0", "Super_Bowl_50-0"),
    ]:
        missing = httpx.get(f"{url}/v1/passages/{sent}")
        assert missing.status_code == 404
        assert missing.json()["error"] == {
            "code": "not_found",
            "message": f"the index holds no passage {meant!r}",
        }


# Failures mid-answer and clients that leave: a fake SGLang that fails on cue.


@pytest.fixture(scope="module")
def fake(chatml_tokenizer_dir: Path) -> Iterator[tuple[str, FakeSGLangState]]:
    state = FakeSGLangState(model_path=str(chatml_tokenizer_dir))
    with serve_in_thread(create_fake_sglang(state)) as fake_url:
        yield fake_url, state


@pytest.fixture
def state(fake: tuple[str, FakeSGLangState]) -> FakeSGLangState:
    fake[1].mode, fake[1].token_delay_s = "ok", 0.01
    fake[1].aborted.clear()
    fake[1].requests.clear()
    return fake[1]


@pytest.fixture(scope="module")
def failing_url(service: ServiceFactory, fake: tuple[str, FakeSGLangState]) -> Iterator[str]:
    with service(sglang_url=fake[0], planner="off") as base:
        yield base


def test_a_failure_mid_answer_is_an_error_event_then_a_failed_response(
    failing_url: str, state: FakeSGLangState
) -> None:
    state.mode = "error_chunk"
    events = list(client_of(failing_url).responses.create(model="m", input=QUESTION, stream=True))
    (error,) = [e for e in events if isinstance(e, ResponseErrorEvent)]
    assert error.code == "generation_failed"
    assert "scheduler crashed" in error.message
    failed = events[-1]
    assert isinstance(failed, ResponseFailedEvent)
    assert failed.response.status == "failed"
    assert failed.response.error is not None
    assert failed.response.error.message.startswith("generation_failed: ")
    assert failed.response.output_text == "The answer"  # what was sent before it failed

    with pytest.raises(openai.InternalServerError, match="scheduler crashed") as raised:
        client_of(failing_url).responses.create(model="m", input=QUESTION)
    assert raised.value.status_code == 502


def test_a_client_that_leaves_stops_the_work(failing_url: str, state: FakeSGLangState) -> None:
    state.mode = "slow"
    body = {"input": QUESTION, "stream": True}
    with httpx.stream("POST", f"{failing_url}/v1/responses", json=body, timeout=10) as response:
        for line in response.iter_lines():
            if line == "event: response.output_text.delta":
                break
    assert state.last_aborted_within(1.0), "the service aborted its SGLang request within a second"

    state.aborted.clear()
    state.requests.clear()
    body = {"input": QUESTION}
    post_and_leave(f"{failing_url}/v1/responses", body, until=lambda: bool(state.requests))
    assert state.last_aborted_within(1.0), "a non-streaming request is aborted too"
