"""A real SGLang server with a tiny random-weights Llama: wire format, the service's client on
it, abort, cache, stop.

Needs SGLang's own venv and the converted SmolLM2 tokenizer under the default cache dir
(built on first use: minutes). The server is started once for the module.
"""

from __future__ import annotations

import json
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from budget import Deadline
from generation.server.launch import (
    SGLangServer,
    SGLangServerConfig,
    ensure_smollm2_model,
    write_tiny_model,
)
from generation.sglang_client import SamplingParams, SGLangClient, StreamTimeouts

pytestmark = [pytest.mark.integration, pytest.mark.sglang]

PROMPT = "The quick brown fox jumps over the lazy dog. " * 12


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SGLangServer]:
    cache_dir = SGLangServerConfig().cache_dir
    tiny = write_tiny_model(tmp_path_factory.mktemp("tiny-llama"), ensure_smollm2_model(cache_dir))
    config = SGLangServerConfig(
        port=_free_port(),
        cache_dir=cache_dir,
        model_dir=tiny,
        load_format="dummy",
        max_total_tokens=4096,
        startup_timeout_s=240.0,
        device="cpu",
        log_path=tmp_path_factory.mktemp("logs") / "sglang.log",
    )
    running = SGLangServer(config)
    running.start()
    yield running
    running.stop()


def _events(lines: Iterator[str]) -> Iterator[dict[str, Any] | None]:
    """Parse `data: {json}` events, each followed by a blank line; None stands for [DONE]."""
    expect_blank = False
    for line in lines:
        if expect_blank:
            assert line == "", f"event not followed by a blank line: {line!r}"
            expect_blank = False
            continue
        assert line.startswith("data: "), line
        payload = line.removeprefix("data: ")
        expect_blank = True
        yield None if payload == "[DONE]" else json.loads(payload)


def _stream_body(rid: str, max_new_tokens: int) -> dict[str, Any]:
    return {
        "text": PROMPT,
        "rid": rid,
        "stream": True,
        "sampling_params": {
            "max_new_tokens": max_new_tokens,
            "temperature": 0.0,
            "ignore_eos": True,
        },
    }


def test_start_is_idempotent(server: SGLangServer) -> None:
    pid_before = server.pid_path.read_text()

    assert server.start() == server.url
    assert server.pid_path.read_text() == pid_before
    assert server.is_healthy()


def test_streamed_generate_wire_format(server: SGLangServer) -> None:
    rid = uuid.uuid4().hex
    chunks: list[dict[str, Any]] = []
    done = False
    with (
        httpx.Client(base_url=server.url, timeout=60.0) as client,
        client.stream("POST", "/generate", json=_stream_body(rid, 12)) as response,
    ):
        assert response.status_code == 200
        for event in _events(response.iter_lines()):
            if event is None:
                done = True
                continue
            assert not done, "data after [DONE]"
            chunks.append(event)

    assert done
    assert chunks
    previous_ids: list[int] = []
    for chunk in chunks[:-1]:
        assert chunk["meta_info"]["finish_reason"] is None
        # Cumulative: every chunk repeats all earlier output.
        assert chunk["output_ids"][: len(previous_ids)] == previous_ids
        previous_ids = chunk["output_ids"]
    last = chunks[-1]
    meta = last["meta_info"]
    assert meta["id"] == rid
    assert meta["finish_reason"]["type"] == "length"
    assert meta["completion_tokens"] == 12
    assert len(last["output_ids"]) == 12
    assert meta["prompt_tokens"] > 0
    assert "cached_tokens" in meta
    assert "e2e_latency" in meta
    assert isinstance(last["text"], str)


async def test_the_client_reassembles_the_real_stream(server: SGLangServer) -> None:
    """What tests/unit/test_sglang_client.py checks on the fake's known words, on the real
    server's: the deltas join to the result's text, and its counts are the server's."""
    rid = uuid.uuid4().hex
    async with httpx.AsyncClient() as http:
        client = SGLangClient(http, server.url)
        stream = await client.open_stream(
            PROMPT,
            SamplingParams(max_new_tokens=12),
            StreamTimeouts(first_token=Deadline.after_ms(60_000)),
            rid=rid,
        )
        deltas = [delta.text async for delta in stream]
        await client.drain()
    result = stream.result
    assert result is not None
    assert result.rid == rid
    assert "".join(deltas) == result.text
    assert 0 < len(deltas) <= result.completion_tokens <= 12
    assert result.finish_reason in {"length", "stop"}
    assert result.completion_tokens == 12 or result.finish_reason == "stop"
    assert result.prompt_tokens > 100
    assert result.ttft_ms is not None
    assert 0 < result.ttft_ms <= result.elapsed_ms


async def test_the_server_applies_the_logit_bias_it_is_sent(server: SGLangServer) -> None:
    """The copy bias's wire form (`SamplingParams.logit_bias`, token ids as strings) is what
    SGLang reads: with the random-weights model's logits small beside the bias, every token
    generated is one of the biased ones."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(
        str(ensure_smollm2_model(SGLangServerConfig().cache_dir))
    )
    words = [" fox", " dog"]
    ids = [tokenizer(word, add_special_tokens=False)["input_ids"][0] for word in words]
    async with httpx.AsyncClient() as http:
        client = SGLangClient(http, server.url)
        stream = await client.open_stream(
            PROMPT,
            SamplingParams(max_new_tokens=8, logit_bias=tuple((i, 100.0) for i in ids)),
            StreamTimeouts(first_token=Deadline.after_ms(60_000)),
        )
        text = "".join([delta.text async for delta in stream])
        await client.drain()
    assert text.split()
    assert set(text.split()) <= {"fox", "dog"}


def test_repeated_prompt_hits_prefix_cache(server: SGLangServer) -> None:
    body = {"text": PROMPT, "sampling_params": {"max_new_tokens": 2, "temperature": 0.0}}
    with httpx.Client(base_url=server.url, timeout=60.0) as client:
        client.post("/generate", json=body).raise_for_status()
        second = client.post("/generate", json=body)
    second.raise_for_status()
    meta = second.json()["meta_info"]

    assert meta["cached_tokens"] >= meta["prompt_tokens"] - 2


def test_abort_request_ends_stream(server: SGLangServer) -> None:
    rid = uuid.uuid4().hex
    finish: dict[str, Any] | None = None
    received = 0
    with (
        httpx.Client(base_url=server.url, timeout=60.0) as client,
        client.stream("POST", "/generate", json=_stream_body(rid, 2000)) as response,
    ):
        for event in _events(response.iter_lines()):
            if event is None:
                break
            received += 1
            if received == 1:
                with httpx.Client(base_url=server.url, timeout=10.0) as other:
                    other.post("/abort_request", json={"rid": rid}).raise_for_status()
            finish = event["meta_info"]["finish_reason"]
            if finish is not None:
                break

    assert finish is not None
    assert finish["type"] == "abort"


def test_stop_ends_the_process_group(server: SGLangServer) -> None:
    pid = int(server.pid_path.read_text())

    assert server.stop() is True
    assert not server.pid_path.exists()
    assert not Path(f"/proc/{pid}").exists() or _is_zombie(pid)
    assert not server.is_healthy()
    assert server.stop() is False


def _is_zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[-1].split()[0] == "Z"
