"""The answer cache ahead of retrieval and the query-embedding cache, over real HTTP with a
real Redis shared by two replicas, and in-process while Redis is down. Answers come from the
real tiny SGLang; a failed one (an error chunk mid-stream) from the fake."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from generation.server.launch import SGLangServer
from tests.fakes.fake_sglang import FakeSGLangState, create_fake_sglang
from tests.integration.conftest import ServiceFactory, requests_taken
from tests.support import free_port, parse_sse, post_answer, serve_in_thread

pytestmark = [pytest.mark.integration, pytest.mark.sglang]

REDIS_URL = "redis://127.0.0.1:6379/0"
QUESTION = "Which NFL team represented the AFC at Super Bowl 50?"


@pytest.fixture
def fake(chatml_tokenizer_dir: Path) -> Iterator[tuple[str, FakeSGLangState]]:
    state = FakeSGLangState(model_path=str(chatml_tokenizer_dir))
    with serve_in_thread(create_fake_sglang(state)) as url:
        yield url, state


def _settings(**extra: Any) -> dict[str, Any]:
    return {
        "redis_url": REDIS_URL,
        "redis_prefix": f"test-{uuid.uuid4().hex[:8]}:",
        "answer_cache_ttl_s": 60,
        **extra,
    }


def _answer(url: str, query: str = QUESTION, top_k: int = 3) -> list[Any]:
    response = post_answer(url, {"query": query, "ttft_budget_ms": 10_000, "top_k": top_k})
    assert response.status_code == 200, response.text
    return parse_sse(response.text)


def _embed_cache_hits(url: str) -> list[bool]:
    traces = httpx.get(f"{url}/v1/traces", params={"limit": 50}, timeout=10).json()
    return [
        bool(span["attributes"]["embedding.cache_hit"])
        for trace in reversed(traces)
        for span in trace["spans"]
        if span["name"] == "embed"
    ]


def test_a_repeated_question_is_answered_from_the_cache_by_any_replica(
    tiny_service: ServiceFactory, tiny_sglang: SGLangServer
) -> None:
    settings = _settings()
    with tiny_service(**settings) as first, tiny_service(**settings) as second:
        before = requests_taken(tiny_sglang)
        fresh = _answer(first)
        asked = requests_taken(tiny_sglang) - before
        # Another replica, other spacing, case and punctuation: the same question.
        again = _answer(second, "  which NFL team represented the afc at super bowl 50  ")
        other_k = _answer(second, top_k=2)
        reached = requests_taken(tiny_sglang) - before
    assert asked == 1
    assert reached == 2  # only the top_k=2 request reached SGLang
    names = [e.event for e in again]
    # The whole cached text in one delta, then its citations as they were.
    assert names[:3] == ["plan", "sources", "token"]
    assert names[3:-1] == ["citation"] * (len(names) - 4)
    assert names[-1] == "done"
    assert [e.data for e in again if e.event == "citation"] == [
        e.data for e in fresh if e.event == "citation"
    ]
    done = again[-1].data
    assert done["from_cache"] is True
    assert done["outcome"] == "ok"
    assert done["ttft_ms"] < 500
    assert again[1].data == fresh[1].data  # the same sources
    text = "".join(e.data["text"] for e in fresh if e.event == "token")
    assert again[2].data["text"] == text
    assert fresh[-1].data["from_cache"] is False
    assert other_k[-1].data["from_cache"] is False


def test_query_embeddings_are_cached(tiny_service: ServiceFactory) -> None:
    with tiny_service(**_settings(answer_cache_ttl_s=0)) as url:
        _answer(url)
        _answer(url, top_k=2)  # not the answer cache (off), but the same query vector
        hits = _embed_cache_hits(url)
    assert hits == [False, True]


def test_the_caches_work_in_process_while_redis_is_down(
    tiny_service: ServiceFactory, tiny_sglang: SGLangServer
) -> None:
    dead = _settings(redis_url=f"redis://127.0.0.1:{free_port()}/0")
    with tiny_service(**dead) as url:
        before = requests_taken(tiny_sglang)
        _answer(url)
        again = _answer(url)
        reached = requests_taken(tiny_sglang) - before
    assert again[-1].data["from_cache"] is True
    assert reached == 1


def test_an_answer_that_failed_is_not_cached(
    service: ServiceFactory, fake: tuple[str, FakeSGLangState]
) -> None:
    # A real server gives no error chunk on demand: the fake does.
    state = fake[1]
    state.mode = "error_chunk"
    with service(**_settings(sglang_url=fake[0])) as url:
        failed = _answer(url)
        state.mode = "ok"
        retried = _answer(url)
    assert "error" in [e.event for e in failed]
    assert retried[-1].data["from_cache"] is False
    assert len(state.requests) == 2
