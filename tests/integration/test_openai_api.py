"""`POST /v1/chat/completions` with the official `openai` client, streaming and not, over real
HTTP (real index and embedder; the real tiny SGLang, random weights: the shape, not the words)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest

from tests.integration.conftest import TINY_ANSWERS, ServiceFactory

pytestmark = [pytest.mark.integration, pytest.mark.sglang]

QUESTION = "Which NFL team represented the AFC at Super Bowl 50?"


@pytest.fixture(scope="module")
def url(tiny_service: ServiceFactory) -> Iterator[str]:
    with tiny_service() as base:
        yield base


@pytest.fixture
def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60)


def test_a_completion_with_its_sources_and_cached_tokens(client: openai.OpenAI) -> None:
    completion = client.chat.completions.create(
        model="anything",
        messages=[
            {"role": "system", "content": "ignored: the service has its own"},
            {"role": "user", "content": "an earlier question"},
            {"role": "assistant", "content": "an earlier answer"},
            {"role": "user", "content": QUESTION},
        ],
        extra_body={"ttft_budget_ms": 10_000, "top_k": 3},
    )
    assert completion.object == "chat.completion"
    assert completion.choices[0].message.role == "assistant"
    assert completion.choices[0].message.content
    assert completion.choices[0].finish_reason in {"stop", "length"}
    extra = completion.model_extra or {}
    results = extra["search_results"]
    assert len(results) == 3
    assert results[0]["url"] == "Super_Bowl_50-0#0"
    assert results[0]["title"] == "Super Bowl 50"
    assert results[0]["snippet"]
    assert extra["citations"] == [r["url"] for r in results]
    usage = completion.usage
    assert usage is not None
    assert 0 < usage.completion_tokens <= TINY_ANSWERS["max_new_tokens"]
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert usage.prompt_tokens_details is not None
    assert usage.prompt_tokens_details.cached_tokens is not None


def test_a_streamed_completion(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model="anything",
        messages=[{"role": "user", "content": QUESTION}],
        stream=True,
        stream_options={"include_usage": True},
        extra_headers={"X-Tenant-Tier": "premium"},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert (chunks[0].model_extra or {})["search_results"][0]["url"] == "Super_Bowl_50-0#0"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] in {"stop", "length"}
    assert set(finishes[:-1]) <= {None}
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None
    assert 0 < chunks[-1].usage.completion_tokens <= TINY_ANSWERS["max_new_tokens"]
    assert len({c.id for c in chunks}) == 1


def test_bad_requests_are_clear_4xx(url: str, client: openai.OpenAI) -> None:
    with pytest.raises(openai.UnprocessableEntityError, match="no user message"):
        client.chat.completions.create(
            model="m", messages=[{"role": "system", "content": "only a system message"}]
        )
    with pytest.raises(openai.UnprocessableEntityError, match="tools"):
        client.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": QUESTION}],
            tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}],
        )
    with pytest.raises(openai.UnprocessableEntityError, match="unknown tenant tier"):
        client.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": QUESTION}],
            extra_body={"tier": "gold"},
        )
    refused = httpx.post(
        f"{url}/v1/chat/completions",
        json={"messages": [{"role": "user", "content": QUESTION}], "ttft_budget_ms": 50},
    )
    # 50 ms is under what even an idle worker needs: the request's problem, not the load's.
    assert refused.status_code == 422
    assert "even an idle worker takes about" in refused.json()["error"]["message"]
