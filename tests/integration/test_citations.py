"""Citations the service attributes (not the model) and its abstention, over real HTTP with a
real SQuAD index and embedder.

The citations are checked against an answer whose every word is known: one sentence copied from
a passage and one no passage supports. No real model writes a chosen unsupported sentence on
demand, so the fake SGLang speaks that answer. Abstention needs no particular words: the real
tiny SGLang answers, and its own log shows whether it was asked."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from httpx_sse import connect_sse

from answer_service.pipeline.attribution import ABSTENTION
from generation.server.launch import SGLangServer
from tests.fakes.fake_sglang import FakeSGLangState, create_fake_sglang
from tests.integration.conftest import ServiceFactory, requests_taken
from tests.support import serve_in_thread

pytestmark = pytest.mark.integration

QUESTION = "Which NFL team represented the AFC at Super Bowl 50?"
ANSWER = (
    "The American Football Conference champion Denver Broncos",
    " defeated the National Football Conference champion Carolina Panthers",
    " to earn their third Super Bowl title. Bananas grow",
    " on purple trees in Antarctica.",
)
GOLD = "Super_Bowl_50-0"
NONSENSE = "How many xylophones does a quasar emit per fortnight?"


@pytest.fixture(scope="module")
def sglang(chatml_tokenizer_dir: Path) -> Iterator[tuple[str, FakeSGLangState]]:
    state = FakeSGLangState(model_path=str(chatml_tokenizer_dir), tokens=ANSWER)
    with serve_in_thread(create_fake_sglang(state)) as url:
        yield url, state


@pytest.fixture(scope="module")
def url(service: ServiceFactory, sglang: tuple[str, FakeSGLangState]) -> Iterator[str]:
    with service(sglang_url=sglang[0]) as base:
        yield base


def _events(url: str, query: str) -> list[tuple[str, dict[str, object]]]:
    body = {"query": query, "ttft_budget_ms": 10_000, "top_k": 3}
    with (
        httpx.Client(timeout=30) as client,
        connect_sse(client, "POST", f"{url}/v1/answer", json=body) as source,
    ):
        return [(event.event, json.loads(event.data)) for event in source.iter_sse()]


def _gold_number(sources: object) -> int:
    assert isinstance(sources, list)
    return next(s["number"] for s in sources if s["doc_id"] == GOLD)


def test_each_sentence_is_cited_when_it_finishes(url: str) -> None:
    events = _events(url, QUESTION)
    names = [name for name, _ in events]
    # The first sentence ends inside the third delta: the delta is sent up to the sentence's
    # end, then its citation, then the rest (so a marker lands right after "title.").
    assert names == [
        *("plan", "sources", "token", "token", "token", "citation"),
        *("token", "token", "citation", "done"),
    ]
    tokens = [str(data["text"]) for name, data in events if name == "token"]
    assert tokens[2].endswith("title.")
    assert tokens[3] == " Bananas grow"
    gold = _gold_number(events[1][1]["sources"])
    first, second = (data for name, data in events if name == "citation")
    answer = "".join(str(data["text"]) for name, data in events if name == "token")
    assert answer[first["start"] : first["end"]].startswith("The American Football")  # type: ignore[misc]
    assert answer[first["start"] : first["end"]].endswith("title.")  # type: ignore[misc]
    assert first["supported"] is True
    assert first["sources"] == [gold]
    assert first["score"] >= 0.8  # type: ignore[operator]
    assert answer[second["start"] : second["end"]] == "Bananas grow on purple trees in Antarctica."  # type: ignore[misc]
    assert second["supported"] is False
    assert second["sources"] == []


def test_the_whole_answer_carries_n_markers_and_every_sentence(url: str) -> None:
    body = {"query": QUESTION, "ttft_budget_ms": 10_000, "top_k": 3, "stream": False}
    response = httpx.post(f"{url}/v1/answer", json=body, timeout=30)
    assert response.status_code == 200, response.text
    out = response.json()
    gold = _gold_number(out["sources"])
    assert out["answer"] == (
        "The American Football Conference champion Denver Broncos defeated the National "
        f"Football Conference champion Carolina Panthers to earn their third Super Bowl title. [{gold}]"
        " Bananas grow on purple trees in Antarctica."
    )
    assert [c["supported"] for c in out["citations"]] == [True, False]


@pytest.mark.sglang
def test_weak_evidence_gets_i_do_not_know_without_asking_the_model(
    tiny_service: ServiceFactory, tiny_sglang: SGLangServer
) -> None:
    # The service's own threshold (the test defaults turn abstention off).
    with tiny_service(abstain_below=None) as base:
        asked = requests_taken(tiny_sglang)
        events = _events(base, NONSENSE)
        assert requests_taken(tiny_sglang) == asked  # SGLang never saw it
    assert [name for name, _ in events] == ["plan", "sources", "token", "done"]
    assert events[2][1]["text"] == ABSTENTION
    assert len(events[1][1]["sources"]) == 3  # type: ignore[arg-type]
    done = events[-1][1]
    assert done["outcome"] == "abstained"
    assert done["within_budget"] is True


@pytest.mark.sglang
def test_abstention_can_be_turned_off(
    tiny_service: ServiceFactory, tiny_sglang: SGLangServer
) -> None:
    with tiny_service(abstain_below=0.0) as base:
        asked = requests_taken(tiny_sglang)
        events = _events(base, NONSENSE)
        assert requests_taken(tiny_sglang) == asked + 1
    assert events[-1][1]["outcome"] == "ok"
    assert "".join(str(d["text"]) for n, d in events if n == "token") != ABSTENTION
