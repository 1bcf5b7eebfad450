"""The `GenerationClient` contract (generation/client.py), for `SGLangClient` against a real
SGLang server (tiny random-weights model) and the scripted fake."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from budget import Deadline
from generation.client import GenerationClient, SamplingParams, StreamTimeouts
from generation.server.launch import SGLangServer
from generation.sglang_client import SGLangClient
from tests.fakes.scripted_generation import ScriptedGeneration, words

pytestmark = pytest.mark.integration


@pytest.fixture(params=["sglang", "scripted"])
async def client(
    request: pytest.FixtureRequest, tiny_sglang: SGLangServer
) -> AsyncIterator[GenerationClient]:
    if request.param == "scripted":
        yield ScriptedGeneration(words("one two three four five six seven eight nine ten"))
        return
    async with httpx.AsyncClient() as http:
        real = SGLangClient(http, tiny_sglang.url)
        yield real
        await real.drain()


def _timeouts() -> StreamTimeouts:
    return StreamTimeouts(Deadline.after_ms(60_000), connect_s=5.0, next_token_s=30.0)


async def test_deltas_add_up_to_the_result(client: GenerationClient) -> None:
    stream = await client.open_stream("Say something.", SamplingParams(8), _timeouts())
    deltas = [delta async for delta in stream]
    assert deltas
    result = stream.result
    assert result is not None
    assert "".join(d.text for d in deltas) == result.text
    counts = [d.completion_tokens for d in deltas]
    assert counts == sorted(counts)
    assert 0 < result.completion_tokens <= 8
    assert result.prompt_tokens > 0
    assert result.finish_reason in ("stop", "length")
    assert result.rid == stream.rid


async def test_max_new_tokens_bounds_the_answer(client: GenerationClient) -> None:
    stream = await client.open_stream("Count.", SamplingParams(3), _timeouts())
    _ = [delta async for delta in stream]
    assert stream.result is not None
    assert stream.result.completion_tokens <= 3


async def test_a_stream_closed_early_is_aborted_with_what_it_had(client: GenerationClient) -> None:
    stream = await client.open_stream("Talk.", SamplingParams(64, ignore_eos=True), _timeouts())
    async for _ in stream:
        break
    stream.close_nowait()
    assert stream.result is not None
    assert stream.result.finish_reason == "abort"
    assert stream.result.completion_tokens < 64
    await client.drain()


async def test_it_is_healthy_and_names_its_model(client: GenerationClient) -> None:
    assert await client.health()
    assert await client.model_path()
    assert client.base_url.startswith("http")
