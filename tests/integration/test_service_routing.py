"""The service routing over several SGLang workers itself (ANSWER_SGLANG_WORKERS)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.fakes.fake_sglang import FakeSGLangState, create_fake_sglang
from tests.integration.conftest import ServiceFactory
from tests.support import post_answer, serve_in_thread

pytestmark = pytest.mark.integration

QUESTIONS = (
    "Which NFL team represented the AFC at Super Bowl 50?",
    "What is the capital of Warsaw's Masovian Voivodeship?",
    "Who was the Norman leader?",
)


def test_repeated_passages_go_to_the_same_worker(
    service: ServiceFactory, chatml_tokenizer_dir: Path
) -> None:
    states = [FakeSGLangState(model_path=str(chatml_tokenizer_dir)) for _ in range(2)]
    with (
        serve_in_thread(create_fake_sglang(states[0])) as w0,
        serve_in_thread(create_fake_sglang(states[1])) as w1,
        service(sglang_workers=[w0, w1]) as url,
    ):
        first = {}
        for question in QUESTIONS:
            done = post_answer(url, {"query": question, "stream": False}).json()["done"]
            first[question] = done["worker"]
            assert done["worker"] in (w0, w1)
            assert done["prompt_layout"] == "cache_aware"
        assert set(first.values()) == {w0, w1}, "new prefixes spread over idle workers"
        for question in QUESTIONS * 2:
            done = post_answer(url, {"query": question, "stream": False}).json()["done"]
            assert done["worker"] == first[question]
            assert done["expected_cached_tokens"] > 0.8 * done["prompt_tokens"]
        assert len(states[0].requests) + len(states[1].requests) == 9

        # One worker down: readiness says which, and stays ready (the other answers).
        states[1].healthy = False
        ready = httpx.get(f"{url}/readyz", timeout=10)
        assert ready.status_code == 200
        assert ready.json()["workers_down"] == [w1]
        states[0].healthy = False  # none left: not ready
        ready = httpx.get(f"{url}/readyz", timeout=10)
        assert ready.status_code == 503
        assert any(w1 in reason for reason in ready.json()["reasons"])


def test_round_robin_alternates(service: ServiceFactory, chatml_tokenizer_dir: Path) -> None:
    states = [FakeSGLangState(model_path=str(chatml_tokenizer_dir)) for _ in range(2)]
    with (
        serve_in_thread(create_fake_sglang(states[0])) as w0,
        serve_in_thread(create_fake_sglang(states[1])) as w1,
        service(sglang_workers=[w0, w1], sglang_routing="round_robin") as url,
    ):
        workers = [
            post_answer(url, {"query": QUESTIONS[0], "stream": False}).json()["done"]["worker"]
            for _ in range(4)
        ]
    assert workers == [w0, w1, w0, w1]
