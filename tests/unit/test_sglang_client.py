"""The SGLang client against a fake server with the real wire format and scripted failures
(and known words). Its happy path on a real server: tests/integration/test_sglang_server.py."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest

from budget import Deadline
from generation.errors import (
    GenerationTimeoutError,
    PromptTooLongError,
    SGLangRequestError,
    SGLangUnavailableError,
)
from generation.sglang_client import (
    GenerationStream,
    SamplingParams,
    SGLangClient,
    StreamTimeouts,
)
from tests.fakes.fake_sglang import FakeSGLangState, create_fake_sglang
from tests.support import free_port, serve_in_thread


@pytest.fixture(scope="module")
def fake() -> Iterator[tuple[str, FakeSGLangState]]:
    state = FakeSGLangState(model_path="fake-model")
    with serve_in_thread(create_fake_sglang(state)) as url:
        yield url, state


@pytest.fixture
async def client(fake: tuple[str, FakeSGLangState]) -> AsyncIterator[SGLangClient]:
    url, state = fake
    state.mode, state.cached_tokens = "ok", 0
    state.aborted.clear()
    async with httpx.AsyncClient() as http:
        client = SGLangClient(http, url)
        yield client
        await client.drain()


def _timeouts(budget_ms: float = 5_000, next_token_s: float = 5.0) -> StreamTimeouts:
    return StreamTimeouts(first_token=Deadline.after_ms(budget_ms), next_token_s=next_token_s)


async def _drain(stream: GenerationStream) -> list[str]:
    return [delta.text async for delta in stream]


async def test_deltas_reassemble_the_cumulative_text(client: SGLangClient) -> None:
    stream = await client.open_stream("q", SamplingParams(max_new_tokens=8), _timeouts())
    assert await _drain(stream) == ["The", " answer", " is", " here", "."]
    result = stream.result
    assert result is not None
    assert result.text == "The answer is here."
    assert (result.prompt_tokens, result.completion_tokens) == (42, 5)
    assert result.finish_reason == "stop"
    assert result.ttft_ms is not None
    assert result.ttft_ms > 0


async def test_request_carries_rid_and_sampling_params(
    client: SGLangClient, fake: tuple[str, FakeSGLangState]
) -> None:
    stream = await client.open_stream(
        "prompt", SamplingParams(max_new_tokens=7, stop=("\n\n",)), _timeouts(), rid="r-1"
    )
    await _drain(stream)
    sent = fake[1].requests[-1]
    assert sent["rid"] == "r-1"
    assert sent["stream"] is True
    assert sent["text"] == "prompt"
    assert sent["sampling_params"]["max_new_tokens"] == 7
    assert sent["sampling_params"]["stop"] == ["\n\n"]
    assert fake[1].aborted == []


async def test_closing_early_aborts_the_request(
    client: SGLangClient, fake: tuple[str, FakeSGLangState]
) -> None:
    fake[1].mode = "slow"
    stream = await client.open_stream("q", SamplingParams(), _timeouts(), rid="leaver")
    async for _ in stream:
        break
    await stream.aclose()
    await client.drain()
    assert fake[1].aborted == ["leaver"]


async def test_error_chunk_raises(client: SGLangClient, fake: tuple[str, FakeSGLangState]) -> None:
    fake[1].mode = "error_chunk"
    stream = await client.open_stream("q", SamplingParams(), _timeouts())
    with pytest.raises(SGLangRequestError, match="scheduler crashed"):
        await _drain(stream)


async def test_dropped_connection_raises_unavailable(
    client: SGLangClient, fake: tuple[str, FakeSGLangState]
) -> None:
    fake[1].mode = "drop"
    stream = await client.open_stream("q", SamplingParams(), _timeouts())
    with pytest.raises(SGLangUnavailableError, match="stream broke"):
        await _drain(stream)


async def test_no_first_token_within_the_deadline(
    client: SGLangClient, fake: tuple[str, FakeSGLangState]
) -> None:
    fake[1].mode = "stall"
    stream = await client.open_stream("q", SamplingParams(), _timeouts(budget_ms=300), rid="slow")
    started = time.perf_counter()
    with pytest.raises(GenerationTimeoutError, match="no first token"):
        await _drain(stream)
    assert time.perf_counter() - started < 1.0
    await client.drain()
    assert "slow" in fake[1].aborted


async def test_no_response_headers_within_the_deadline(
    client: SGLangClient, fake: tuple[str, FakeSGLangState]
) -> None:
    fake[1].mode = "silent"
    started = time.perf_counter()
    with pytest.raises(GenerationTimeoutError, match="no response from SGLang within"):
        await client.open_stream("q", SamplingParams(), _timeouts(budget_ms=300), rid="mute")
    assert time.perf_counter() - started < 1.0
    await client.drain()
    assert "mute" in fake[1].aborted


async def test_next_token_timeout(client: SGLangClient, fake: tuple[str, FakeSGLangState]) -> None:
    fake[1].mode = "slow"
    stream = await client.open_stream("q", SamplingParams(), _timeouts(next_token_s=0.2))
    with pytest.raises(GenerationTimeoutError, match="no next token"):
        await _drain(stream)


async def test_context_overflow_is_prompt_too_long(
    client: SGLangClient, fake: tuple[str, FakeSGLangState]
) -> None:
    fake[1].mode = "reject"
    with pytest.raises(PromptTooLongError) as caught:
        await client.open_stream("q", SamplingParams(), _timeouts())
    assert caught.value.status_code == 400


async def test_unreachable_server() -> None:
    async with httpx.AsyncClient() as http:
        client = SGLangClient(http, f"http://127.0.0.1:{free_port()}")
        assert not await client.health()
        with pytest.raises(SGLangUnavailableError, match="cannot reach SGLang"):
            await client.open_stream("q", SamplingParams(), _timeouts())


async def test_error_messages_carry_no_address(
    client: SGLangClient, fake: tuple[str, FakeSGLangState], caplog: pytest.LogCaptureFixture
) -> None:
    """What SGLang (or a router) says goes to the caller without the URLs in it (they end up
    in client-facing errors); the log keeps them."""
    state = fake[1]
    state.mode = "reject"
    state.reject_message = "upstream http://10.0.0.7:30001/generate refused: bad input"
    state.error_message = "worker at https://10.0.0.8:30002 crashed"
    try:
        with caplog.at_level(logging.WARNING, logger="generation"):
            with pytest.raises(SGLangRequestError) as refused:
                await client.open_stream("q", SamplingParams(), _timeouts())
            state.mode = "error_chunk"
            stream = await client.open_stream("q", SamplingParams(), _timeouts())
            with pytest.raises(SGLangRequestError) as broke:
                await _drain(stream)
    finally:
        state.reject_message = FakeSGLangState.reject_message
        state.error_message = FakeSGLangState.error_message
    assert str(refused.value) == "SGLang answered 400: upstream <url> refused: bad input"
    assert str(broke.value) == "SGLang answered 500: worker at <url> crashed"
    logged = " ".join(record.getMessage() for record in caplog.records)
    assert "http://10.0.0.7:30001/generate" in logged
    assert "https://10.0.0.8:30002" in logged


async def test_an_unreachable_server_is_not_named_to_the_caller(
    caplog: pytest.LogCaptureFixture,
) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    async with httpx.AsyncClient() as http:
        with (
            caplog.at_level(logging.WARNING, logger="generation"),
            pytest.raises(SGLangUnavailableError) as caught,
        ):
            await SGLangClient(http, url).open_stream("q", SamplingParams(), _timeouts())
    assert str(caught.value).startswith("cannot reach SGLang: ConnectError")
    assert "127.0.0.1" not in str(caught.value)
    assert any(url in record.getMessage() for record in caplog.records)
