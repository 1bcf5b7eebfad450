"""End to end with real weights: MiniLM + faiss over SQuAD passages, SGLang serving
SmolLM2-135M-Instruct on the CPU, streamed over HTTP."""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Iterator

import pytest

from generation.server.launch import SGLangServer
from tests.integration.conftest import SQUAD_SUBSET, ServiceFactory
from tests.support import SQUAD_PASSAGES, SQUAD_QUESTIONS, open_text, parse_sse, post_answer

pytestmark = [pytest.mark.integration, pytest.mark.sglang, pytest.mark.smollm2]


@pytest.fixture(scope="module")
def url(service: ServiceFactory, smollm2_sglang: SGLangServer) -> Iterator[str]:
    # A fixed configuration (five passages every time): these tests are about what SGLang and
    # the model do with a given prompt; the planner's choices depend on load and are tested in
    # test_planner_service.py.
    with service(sglang_url=smollm2_sglang.url, max_new_tokens=48, planner="off") as base:
        yield base


def test_a_real_answer_streams_with_its_sources(url: str) -> None:
    response = post_answer(url, {"query": "Who won Super Bowl 50?", "ttft_budget_ms": 5000})
    events = parse_sse(response.text)
    assert [e.event for e in events[:2]] == ["plan", "sources"]
    assert events[-1].event == "done"
    assert "Super_Bowl_50" in events[1].data["sources"][0]["id"]
    answer = "".join(e.data["text"] for e in events if e.event == "token")
    words = re.findall(r"[A-Za-z]+", answer)
    assert len(words) >= 3, answer
    done = events[-1].data
    assert done["outcome"] == "ok"
    assert done["finish_reason"] in {"stop", "length"}
    assert done["completion_tokens"] <= 48
    assert done["prompt_tokens"] > 400
    assert done["ttft_ms"] > 0


def test_repeated_question_reuses_the_kv_cache(url: str) -> None:
    body = {"query": "What color was used to emphasize the 50th anniversary?", "stream": False}
    first = post_answer(url, body).json()
    second = post_answer(url, body).json()
    assert second["done"]["cached_tokens"] >= second["done"]["prompt_tokens"] - 1
    assert second["done"]["cached_tokens"] > first["done"]["cached_tokens"]
    assert second["answer"] == first["answer"], "greedy decoding is deterministic"


def _questions_on_indexed_passages(limit: int) -> list[dict[str, object]]:
    with open_text(SQUAD_PASSAGES) as passages:
        indexed = {json.loads(line)["_id"] for line in itertools.islice(passages, SQUAD_SUBSET)}
    with open_text(SQUAD_QUESTIONS) as questions:
        rows = (json.loads(line) for line in questions)
        return list(itertools.islice((q for q in rows if q["gold_passage_id"] in indexed), limit))


def test_gold_passages_are_retrieved_for_real_questions(url: str) -> None:
    questions = _questions_on_indexed_passages(8)
    hits = 0
    for question in questions:
        body = post_answer(url, {"query": question["question"], "stream": False}).json()
        hits += any(s["doc_id"] == question["gold_passage_id"] for s in body["sources"])
        assert body["done"]["outcome"] == "ok"
    assert hits >= 6, f"gold passage among the 5 sources for only {hits} of {len(questions)}"


def test_the_service_cites_a_real_answer(url: str) -> None:
    """The words are the model's (greedy, so the same on every run here); the citations are the
    service's: each sentence in order, the one naming the winner backed by the gold passage."""
    events = parse_sse(post_answer(url, {"query": "Who won Super Bowl 50?"}).text)
    answer = "".join(e.data["text"] for e in events if e.event == "token")
    assert "Broncos" in answer, answer
    sources = {s["number"]: s["doc_id"] for s in events[1].data["sources"]}
    citations = [e.data for e in events if e.event == "citation"]
    assert [c["sentence"] for c in citations] == list(range(len(citations)))
    assert citations[-1]["end"] == len(answer.rstrip())
    winner = next(c for c in citations if "Broncos" in answer[c["start"] : c["end"]])
    assert winner["supported"] is True
    assert "Super_Bowl_50-0" in {sources[n] for n in winner["sources"]}
