"""The service over real HTTP, real index and embedder, against a fake SGLang with scripted
failures: bad input, SGLang down or dying mid-stream, and a client that goes away. (A normal
answer, streamed or as one JSON object, comes from the real tiny SGLang: test_event_source.py.)"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from generation.prompt_layout import SYSTEM_PROMPT
from retrieval.embedder import DEFAULT_EMBEDDER, resolve_model_path
from tests.fakes.fake_sglang import FakeSGLangState, create_fake_sglang
from tests.integration.conftest import ServiceFactory
from tests.support import (
    free_port,
    parse_sse,
    post_and_leave,
    post_answer,
    serve_in_thread,
)

pytestmark = pytest.mark.integration

QUESTION = "Which NFL team represented the AFC at Super Bowl 50?"


@pytest.fixture(scope="module")
def fake(chatml_tokenizer_dir: Path) -> Iterator[tuple[str, FakeSGLangState]]:
    state = FakeSGLangState(model_path=str(chatml_tokenizer_dir))
    with serve_in_thread(create_fake_sglang(state)) as url:
        yield url, state


@pytest.fixture
def state(fake: tuple[str, FakeSGLangState]) -> FakeSGLangState:
    fake[1].mode, fake[1].token_delay_s, fake[1].healthy = "ok", 0.01, True
    fake[1].aborted.clear()
    fake[1].requests.clear()
    return fake[1]


@pytest.fixture(scope="module")
def url(service: ServiceFactory, fake: tuple[str, FakeSGLangState]) -> Iterator[str]:
    # A fixed configuration: these tests script generation failures under budgets (200 ms)
    # the planner would refuse outright; planning is tested in test_planner_service.py.
    # A body limit above the schema's 100,000-character query, to reach the schema's check
    # (the body limit itself: test_access.py).
    with service(
        sglang_url=fake[0],
        max_query_chars=500,
        max_top_k=10,
        planner="off",
        max_body_bytes=200_000,
    ) as base:
        yield base


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"query": ""}, "query: String should have at least 1 character"),
        ({"query": "   \n "}, "`query` must contain non-whitespace text"),
        ({"query": "x" * 501}, "`query` is 501 characters; the limit is 500"),
        ({"query": "x" * 100_001}, "query: String should have at most 100000 characters"),
        ({"query": 42}, "query: Input should be a valid string"),
        ({"query": "q", "top_k": "5"}, "top_k: Input should be a valid integer"),
        ({"query": "q", "top_k": 0}, "top_k: Input should be greater than or equal to 1"),
        ({"query": "q", "top_k": 11}, "`top_k` is 11; the limit is 10"),
        ({"query": "q", "stream": "yes"}, "stream: Input should be a valid boolean"),
        ({"query": "q", "ttft_budget_ms": 0}, "ttft_budget_ms: Input should be greater than 0"),
        ({"query": "q", "ttft_budget_ms": -5}, "ttft_budget_ms: Input should be greater than 0"),
        ({"query": "q", "ttft_budget_ms": 1.5}, "ttft_budget_ms: Input should be a valid integer"),
        ({"query": "q", "ttft_budget_ms": 10**9}, "the limit is 120000"),
        ({"query": "q", "model": "gpt"}, "model: Extra inputs are not permitted"),
        (
            {"query": "q", "answer_mode": "summary"},
            "answer_mode: Input should be 'auto', 'quote', 'focused' or 'passages'",
        ),
        ({}, "query: Field required"),
    ],
)
def test_bad_input_gets_a_4xx_with_a_message(
    url: str, state: FakeSGLangState, body: dict[str, object], message: str
) -> None:
    response = post_answer(url, body)
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["code"] == "invalid_request"
    assert message in error["message"]
    assert state.requests == [] or all(r.get("text") for r in state.requests)


@pytest.mark.parametrize(
    ("content", "message"),
    [(b"{not json", "JSON decode error"), (b"[1, 2]", "valid dictionary"), (b"", "Field required")],
)
def test_malformed_bodies_are_refused(url: str, content: bytes, message: str) -> None:
    response = httpx.post(
        f"{url}/v1/answer", content=content, headers={"content-type": "application/json"}
    )
    assert response.status_code == 422
    assert message in response.json()["error"]["message"]


def test_sglang_dying_mid_stream_gives_an_error_event_after_the_sources(
    url: str, state: FakeSGLangState
) -> None:
    state.mode = "drop"
    started = time.perf_counter()
    response = post_answer(url, {"query": QUESTION})
    assert time.perf_counter() - started < 5
    events = parse_sse(response.text)
    assert [e.event for e in events] == ["plan", "sources", "token", "token", "error", "done"]
    assert events[4].data["code"] == "generation_unavailable"
    assert events[5].data["outcome"] == "error"


def test_sglang_error_chunk_is_an_error_event(url: str, state: FakeSGLangState) -> None:
    state.mode = "error_chunk"
    events = parse_sse(post_answer(url, {"query": QUESTION}).text)
    assert events[-2].event == "error"
    assert "scheduler crashed" in events[-2].data["message"]
    non_stream = post_answer(url, {"query": QUESTION, "stream": False})
    assert non_stream.status_code == 502
    assert non_stream.json()["error"]["code"] == "generation_failed"


def test_no_first_token_in_time_is_an_error_not_a_hang(url: str, state: FakeSGLangState) -> None:
    state.mode = "stall"
    started = time.perf_counter()
    response = post_answer(url, {"query": QUESTION, "ttft_budget_ms": 200})
    elapsed_s = time.perf_counter() - started
    events = parse_sse(response.text)
    assert [e.event for e in events] == ["plan", "sources", "error", "done"]
    assert events[2].data["code"] == "generation_timeout"
    assert elapsed_s < 2.0, "the first-token timeout comes from the budget (x4), not a constant"
    assert state.last_aborted_within(1.0)


def test_an_sglang_that_never_answers_is_given_up_at_the_deadline(
    url: str, state: FakeSGLangState
) -> None:
    """SGLang (or a router) takes /generate and sends nothing, not even headers: the request
    is given up at its hard deadline (the budget x4), SGLang is told to abort it, and the
    generation slot comes free for the next one."""
    state.mode = "silent"
    started = time.perf_counter()
    response = post_answer(url, {"query": QUESTION, "ttft_budget_ms": 200}, timeout_s=20)
    elapsed_s = time.perf_counter() - started
    assert response.status_code == 504, response.text
    assert response.json()["error"]["code"] == "stage_timeout"
    assert "no response from SGLang" in response.json()["error"]["message"]
    assert elapsed_s < 2.0
    assert state.last_aborted_within(1.0)
    state.mode = "ok"
    assert post_answer(url, {"query": QUESTION, "stream": False}).status_code == 200


def test_client_disconnect_aborts_the_sglang_request(url: str, state: FakeSGLangState) -> None:
    state.mode = "slow"
    with httpx.stream("POST", f"{url}/v1/answer", json={"query": QUESTION}, timeout=10) as response:
        for line in response.iter_lines():
            if line == "event: token":
                break
    assert state.last_aborted_within(1.0), "the service aborted its SGLang request within a second"


def test_a_client_gone_before_sglang_answered_aborts_its_request(
    url: str, state: FakeSGLangState
) -> None:
    """The client leaves while the service still waits for SGLang's response headers (an
    SGLang that is slow to answer, or stuck): the SGLang request is aborted too, not only its
    connection dropped."""
    state.mode = "silent"
    body = {"query": QUESTION, "ttft_budget_ms": 10_000}
    post_and_leave(f"{url}/v1/answer", body, until=lambda: bool(state.requests))
    assert state.last_aborted_within(1.5), "the service aborted its SGLang request"


def test_non_streaming_client_disconnect_aborts_too(url: str, state: FakeSGLangState) -> None:
    state.mode = "slow"
    body = {"query": QUESTION, "stream": False}
    post_and_leave(f"{url}/v1/answer", body, until=lambda: bool(state.requests))
    assert state.last_aborted_within(1.0), "the service aborted its SGLang request within a second"


def test_sglang_down_means_not_ready_and_503(
    service: ServiceFactory, chatml_tokenizer_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    with service(sglang_url=dead, tokenizer=str(chatml_tokenizer_dir), ready=False) as base:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            ready = httpx.get(f"{base}/readyz").json()
            if not any("warming up" in r for r in ready["reasons"]):
                break
            time.sleep(0.2)
        readyz = httpx.get(f"{base}/readyz")
        assert readyz.status_code == 503
        assert readyz.json()["reasons"] == [f"SGLang at {dead} is not healthy"]
        assert httpx.get(f"{base}/healthz").status_code == 200
        for stream in (True, False):
            with caplog.at_level(logging.WARNING, logger="generation"):
                response = post_answer(base, {"query": QUESTION, "stream": stream})
            assert response.status_code == 503
            assert response.headers["retry-after"] == "5"
            message = response.json()["error"]["message"]
            assert message.startswith("cannot reach SGLang: ConnectError")
            # The URL is for the operator's log, not for the client.
            assert "127.0.0.1" not in message
    assert any(dead in record.getMessage() for record in caplog.records)


def test_without_sglang_or_tokenizer_the_service_says_it_is_warming_up(
    service: ServiceFactory,
) -> None:
    with service(sglang_url=f"http://127.0.0.1:{free_port()}", ready=False) as base:
        response = post_answer(base, {"query": QUESTION})
        assert response.status_code == 503
        assert "not ready" in response.json()["error"]["message"]
        assert httpx.get(f"{base}/readyz").status_code == 503


def test_missing_index_is_reported_by_readyz(
    service: ServiceFactory, fake: tuple[str, FakeSGLangState], tmp_path: Path
) -> None:
    with service(sglang_url=fake[0], index_dir=tmp_path / "none", ready=False) as base:
        deadline = time.monotonic() + 60
        reasons: list[str] = []
        while time.monotonic() < deadline:
            reasons = httpx.get(f"{base}/readyz").json()["reasons"]
            if any("warm-up failed" in r for r in reasons):
                break
            time.sleep(0.2)
        assert any("no index at" in r for r in reasons), reasons
        response = post_answer(base, {"query": QUESTION})
        assert response.status_code == 503
        assert "no index at" in response.json()["error"]["message"]


def _reasons_once_settled(base: str, settled: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    """/readyz's body once `settled` holds, or after 60 s."""
    deadline = time.monotonic() + 60
    body: dict[str, Any] = {}
    while time.monotonic() < deadline:
        body = httpx.get(f"{base}/readyz").json()
        if settled(body):
            break
        time.sleep(0.2)
    return body


def _copy_tokenizer(source: Path, target: Path) -> Path:
    shutil.copytree(source, target)
    return target


@pytest.mark.usefixtures("state")  # the shared fake answers normally
def test_an_unexpected_warm_up_failure_is_reported_not_left_warming_up(
    service: ServiceFactory,
    fake: tuple[str, FakeSGLangState],
    chatml_tokenizer_dir: Path,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A tokenizer file cut short makes transformers raise a KeyError, neither a retrieval nor
    a generation error: /readyz says so with its type, and the log has the traceback."""
    broken = _copy_tokenizer(chatml_tokenizer_dir, tmp_path / "tokenizer")
    (broken / "tokenizer.json").write_text('{"version": "1.0", "model": {"type": "Nope"}}')
    with (
        caplog.at_level(logging.ERROR, logger="answer_service"),
        service(sglang_url=fake[0], tokenizer=str(broken), ready=False) as base,
    ):
        body = _reasons_once_settled(
            base, lambda b: not any("warming up" in r for r in b["reasons"])
        )
        response = post_answer(base, {"query": QUESTION})
    assert body["reasons"] == ["warm-up failed: KeyError: 'added_tokens'"]
    assert response.status_code == 503
    assert "KeyError: 'added_tokens'" in response.json()["error"]["message"]
    failed = [r for r in caplog.records if "warm-up failed" in r.getMessage()]
    assert failed
    assert failed[0].exc_info is not None


@pytest.mark.usefixtures("state")  # the shared fake answers normally
def test_an_unexpected_reranker_failure_is_reported(
    service: ServiceFactory,
    fake: tuple[str, FakeSGLangState],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Weights cut short (a partial download) make safetensors raise its own error: the
    service answers without the reranker and /readyz says why, instead of `loading` forever."""
    model = _copy_tokenizer(Path(resolve_model_path(DEFAULT_EMBEDDER)), tmp_path / "reranker")
    weights = model / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:4096])
    with (
        caplog.at_level(logging.ERROR, logger="answer_service"),
        service(sglang_url=fake[0], reranker_model=str(model)) as base,
    ):
        body = _reasons_once_settled(base, lambda b: not b["reranker"].startswith("loading"))
        answer = post_answer(base, {"query": QUESTION, "stream": False})
    assert body["reranker"].startswith("failed: SafetensorError: "), body["reranker"]
    assert answer.status_code == 200
    failed = [r for r in caplog.records if "reranker failed" in r.getMessage()]
    assert failed
    assert failed[0].exc_info is not None


def test_a_model_whose_template_takes_no_system_message_is_answered(
    service: ServiceFactory, no_system_tokenizer_dir: Path
) -> None:
    """Gemma's template raises on a system message: the system prompt goes into the user
    turn, found at warm-up, instead of every request failing behind a green /readyz."""
    state = FakeSGLangState(model_path=str(no_system_tokenizer_dir))
    with (
        serve_in_thread(create_fake_sglang(state)) as sglang,
        service(sglang_url=sglang, abstain_below=0) as base,
    ):
        response = post_answer(base, {"query": QUESTION, "stream": False})
    assert response.status_code == 200, response.text
    assert response.json()["answer"] == "The answer is here."
    assert state.requests[-1]["text"].startswith(f"<start_of_turn>user\n{SYSTEM_PROMPT}\n\n")
