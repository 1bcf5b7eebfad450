"""`POST /v1/answer` consumed as an EventSource client would, with httpx-sse: named events,
JSON data, a text/event-stream content type, and the stream's order; and the same answer as
one JSON object (`stream: false`). The real tiny SGLang answers."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import httpx
import pytest
from httpx_sse import connect_sse

from retrieval.sentences.splitter import split_sentences
from tests.integration.conftest import TINY_ANSWERS, ServiceFactory
from tests.support import post_answer

pytestmark = [pytest.mark.integration, pytest.mark.sglang]


@pytest.fixture(scope="module")
def url(tiny_service: ServiceFactory) -> Iterator[str]:
    with tiny_service() as base:
        yield base


def test_an_event_source_client_reads_the_answer(url: str) -> None:
    body = {"query": "Who won Super Bowl 50?", "ttft_budget_ms": 10_000, "top_k": 3}
    with (
        httpx.Client(timeout=30) as client,
        connect_sse(client, "POST", f"{url}/v1/answer", json=body) as source,
    ):
        assert source.response.headers["content-type"].startswith("text/event-stream")
        events = [(event.event, json.loads(event.data)) for event in source.iter_sse()]
    names = [name for name, _ in events]
    assert names[:2] == ["plan", "sources"]
    # Token deltas with each finished sentence's citation, the last one's when the stream ends.
    assert names[2] == "token"
    assert set(names[2:-1]) == {"token", "citation"}, names
    assert names[-2] == "citation"
    assert names[-1] == "done"
    assert len(events[1][1]["sources"]) == 3
    done = events[-1][1]
    assert done["outcome"] == "ok"
    assert 0 < names.count("token") <= done["completion_tokens"] <= 8
    assert "".join(data["text"] for name, data in events if name == "token")
    assert events[0][1]["passages"] <= 3


def test_a_non_streaming_answer_is_one_json_object(url: str) -> None:
    query = "Which NFL team represented the AFC at Super Bowl 50?"
    response = post_answer(url, {"query": query, "stream": False, "top_k": 3})
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert body["answer"]
    # The sources are what the model saw, numbered as it saw them (the planner may give it
    # fewer than the 3 asked for).
    assert body["plan"]["passages"] <= 3
    in_prompt = body["done"]["passages_in_prompt"]
    assert [s["number"] for s in body["sources"]] == list(range(1, in_prompt + 1))
    assert "Super_Bowl_50-0#0" in {s["id"] for s in body["sources"]}
    done = body["done"]
    assert done["outcome"] == "ok"
    assert 0 < done["completion_tokens"] <= TINY_ANSWERS["max_new_tokens"]
    # Every sentence of the answer (not a code block, as random weights often write) has its
    # citation, in order.
    citations = body["citations"]
    said = re.sub(r" \[\d+\]", "", body["answer"])
    assert len(citations) == sum(span.kind != "code" for span in split_sentences(said))
    assert [c["sentence"] for c in citations] == list(range(len(citations)))
    assert body["error"] is None
