"""The load engine keeps what the planner benchmarks score: the `plan` event's choices, the
`done` event's passage count and answer form and, when asked, the answer's text; against a small real FastAPI
app over HTTP that streams `plan`, `sources`, `token` and `done` events."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from fastapi import FastAPI, Request, Response
from fastapi.responses import StreamingResponse

from eval.lib.latency_stats import RequestRecord
from eval.lib.load_engine import DedicatedClients, LoadConfig, RequestSlot, send_request
from eval.lib.questions import Question
from tests.support import serve_in_thread

pytestmark = pytest.mark.integration

PLAN = {
    "planner": True,
    "rerank_depth": 10,
    "passages": 4,
    "retrieve_k": 10,
    "cuts": ["rerank", {"stage": "passages", "from": 5}],
    "predicted_ms": {"rerank": 120.0},
    "actual_ms": {"rerank": 131.5},
}
TOKENS = ("The Denver", " Broncos", " [1].")


def _sse(event: str, data: dict[str, Any]) -> str:
    return f"event: {event}\ndata: {json.dumps(data)}\n\n"


def _service() -> FastAPI:
    """The question's first word says what to send: `plain` has no plan event, `broken` ends
    with an `error` event, `odd` sends a plan whose fields have the wrong types. The `done`
    event's form is the request's `answer_mode` (`passages` without one)."""
    app = FastAPI()

    @app.post("/v1/answer")
    async def answer(request: Request) -> Response:
        body = await request.json()
        kind = body["query"].split()[0]
        form = body.get("answer_mode", "passages")

        async def events() -> AsyncIterator[str]:
            if kind == "odd":
                yield _sse("plan", {"rerank_depth": "deep"})
            elif kind != "plain":
                yield _sse("plan", PLAN)
            yield _sse("sources", {"sources": []})
            for text in TOKENS:
                yield _sse("token", {"text": text})
            if kind == "broken":
                yield _sse("error", {"stage": "generate", "code": "generation_failed"})
            done = {
                "outcome": "ok",
                "ttft_ms": 5.0,
                "passages_in_prompt": 4,
                "degraded": [],
                "form": form,
            }
            if form == "quote":
                done["short_answer"] = {"text": "Denver Broncos", "start": 4, "end": 18}
            yield _sse("done", done)

        return StreamingResponse(events(), media_type="text/event-stream")

    return app


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with serve_in_thread(_service()) as base:
        yield base


async def _ask(
    url: str, question: str, *, keep_answers: bool, answer_mode: str | None = None
) -> RequestRecord:
    config = LoadConfig(
        url=url,
        duration_s=1.0,
        request_timeout_s=5.0,
        keep_answers=keep_answers,
        answer_mode=answer_mode,
    )
    clients = DedicatedClients(config)
    try:
        slot = RequestSlot(Question("q1", question), 0.0, rate_rps=1.0)
        return await send_request(clients, config, slot)
    finally:
        await clients.aclose()


async def test_keeps_the_answer_and_the_plan(url: str) -> None:
    record = await _ask(url, "planned question", keep_answers=True)
    assert record.status == "ok"
    assert record.answer == "The Denver Broncos [1]."
    assert record.plan_planner is True
    assert (record.plan_rerank_depth, record.plan_passages, record.plan_retrieve_k) == (10, 4, 10)
    # A cut that is not a string is kept as its JSON text.
    assert record.plan_cuts == ("rerank", '{"from": 5, "stage": "passages"}')
    assert record.passages_in_prompt == 4
    assert record.form == "passages"
    written = json.loads(json.dumps(record.to_json()))
    assert RequestRecord.from_json(written).to_json() == written
    assert RequestRecord.from_json(written).plan_cuts == record.plan_cuts


async def test_keeps_a_quotes_short_answer_with_its_answer(url: str) -> None:
    record = await _ask(url, "planned question", keep_answers=True, answer_mode="quote")
    assert (record.form, record.short_answer) == ("quote", "Denver Broncos")
    written = json.loads(json.dumps(record.to_json()))
    assert RequestRecord.from_json(written).short_answer == "Denver Broncos"
    unkept = await _ask(url, "planned question", keep_answers=False, answer_mode="quote")
    assert unkept.short_answer is None
    assert "short_answer" not in unkept.to_json()


async def test_keeps_no_answer_unless_asked(url: str) -> None:
    record = await _ask(url, "planned question", keep_answers=False)
    assert record.status == "ok"
    assert record.answer is None
    assert "answer" not in record.to_json()
    assert record.plan_passages == 4


async def test_a_stream_without_a_plan_records_none_and_writes_no_plan_fields(url: str) -> None:
    record = await _ask(url, "plain question", keep_answers=True)
    assert record.status == "ok"
    assert record.answer == "".join(TOKENS)
    assert (record.plan_passages, record.plan_rerank_depth, record.plan_cuts) == (None, None, None)
    written = record.to_json()
    assert not [key for key in written if key.startswith("plan_")]
    assert RequestRecord.from_json(written).to_json() == written


async def test_a_failed_answer_keeps_no_text(url: str) -> None:
    record = await _ask(url, "broken question", keep_answers=True)
    assert (record.status, record.error_code, record.answer) == ("error", "generation_failed", None)
    assert record.plan_passages == 4


async def test_a_plan_of_the_wrong_shape_is_a_malformed_event(url: str) -> None:
    record = await _ask(url, "odd question", keep_answers=True)
    assert (record.status, record.error_code, record.answer) == ("error", "malformed_event", None)


async def test_sends_the_answer_mode_and_keeps_the_form_that_answered(url: str) -> None:
    record = await _ask(url, "planned question", keep_answers=False, answer_mode="quote")
    assert (record.status, record.form) == ("ok", "quote")
    assert record.to_json()["form"] == "quote"
    assert RequestRecord.from_json(record.to_json()).form == "quote"
