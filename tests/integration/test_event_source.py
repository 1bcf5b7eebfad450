"""`POST /v1/answer` consumed as an EventSource client would, with httpx-sse: named events,
JSON data, a text/event-stream content type, and the stream's order."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from httpx_sse import connect_sse

from tests.fakes.fake_sglang import FakeSGLangState, create_fake_sglang
from tests.integration.conftest import ServiceFactory
from tests.support import serve_in_thread

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def url(service: ServiceFactory, chatml_tokenizer_dir: Path) -> Iterator[str]:
    state = FakeSGLangState(model_path=str(chatml_tokenizer_dir))
    with serve_in_thread(create_fake_sglang(state)) as sglang, service(sglang_url=sglang) as base:
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
    # Five deltas, then the one sentence's citation once the stream ends.
    assert names[2:-1] == ["token"] * 5 + ["citation"]
    assert names[-1] == "done"
    assert len(events[1][1]["sources"]) == 3
    assert "".join(data["text"] for name, data in events if name == "token") == (
        "The answer is here."
    )
    assert events[-1][1]["outcome"] == "ok"
    assert events[0][1]["passages"] <= 3
