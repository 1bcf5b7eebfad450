"""Conversations over real HTTP (issue 42), on the real SQuAD index and embedder with the fake
SGLang: a follow-up's `history` changes what is searched and found; chat completions send the
messages before the last; bad history gets 422 or 413; Responses continue a conversation by
`previous_response_id` under the key that made it, never another key's (404), and, with Redis,
on another replica."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from answer_service.runtime.keys.auth import ApiKey, digest, write_api_keys
from tests.fakes.fake_sglang import FakeSGLangState, create_fake_sglang
from tests.integration.conftest import ServiceFactory
from tests.support import serve_in_thread

pytestmark = pytest.mark.integration

REDIS_URL = "redis://127.0.0.1:6379/0"
FIRST = "Which NFL team represented the AFC at Super Bowl 50?"
FOLLOW_UP = "And who did they beat?"
KEY_A, KEY_B = "ask_conversation-key-a", "ask_conversation-key-b"


@pytest.fixture(scope="module")
def sglang(chatml_tokenizer_dir: Path) -> Iterator[str]:
    state = FakeSGLangState(model_path=str(chatml_tokenizer_dir), tokens=("The Broncos won.",))
    with serve_in_thread(create_fake_sglang(state)) as url:
        yield url


@pytest.fixture(scope="module")
def url(service: ServiceFactory, sglang: str) -> Iterator[str]:
    with service(sglang_url=sglang) as base:
        yield base


@pytest.fixture(scope="module")
def keys_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("keys") / "keys.json"
    write_api_keys(
        path, [ApiKey("a", digest(KEY_A), "standard"), ApiKey("b", digest(KEY_B), "standard")]
    )
    return path


def _answer(url: str, query: str, **fields: Any) -> httpx.Response:
    body = {"query": query, "stream": False, **fields}
    return httpx.post(f"{url}/v1/answer", json=body, timeout=60)


def _doc_ids(response: httpx.Response) -> list[str]:
    return [s["doc_id"] for s in response.json()["sources"]]


def test_history_changes_what_a_follow_up_searches_and_finds(url: str) -> None:
    alone = _answer(url, FOLLOW_UP)
    history = [
        {"role": "user", "content": FIRST},
        {"role": "assistant", "content": "The Denver Broncos."},
    ]
    followed = _answer(url, FOLLOW_UP, history=history)
    assert alone.status_code == followed.status_code == 200
    assert alone.json()["plan"]["searched_query"] == FOLLOW_UP
    searched = followed.json()["plan"]["searched_query"]
    assert searched.startswith(FOLLOW_UP)
    assert "NFL" in searched  # the earlier question's rarest words
    assert "AFC" in searched
    assert any(d.startswith("Super_Bowl_50") for d in _doc_ids(followed))
    assert _doc_ids(followed) != _doc_ids(alone)


def test_the_plan_event_of_a_stream_names_the_searched_query(url: str) -> None:
    body = {"query": FOLLOW_UP, "history": [{"role": "user", "content": FIRST}]}
    with httpx.stream("POST", f"{url}/v1/answer", json=body, timeout=60) as response:
        lines = list(response.iter_lines())
    plan = next(lines[i + 1] for i, line in enumerate(lines) if line == "event: plan")
    assert '"searched_query":"And who did they beat? ' in plan


def test_chat_completions_search_with_the_earlier_messages(url: str) -> None:
    def chat(messages: list[dict[str, str]]) -> list[str]:
        body = {"model": "m", "messages": messages}
        response = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60)
        assert response.status_code == 200
        return [r["url"] for r in response.json()["search_results"]]

    alone = chat([{"role": "user", "content": FOLLOW_UP}])
    whole = chat(
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": FIRST},
            {"role": "assistant", "content": "The Denver Broncos."},
            {"role": "user", "content": FOLLOW_UP},
        ]
    )
    assert any("Super_Bowl_50" in u for u in whole)
    assert whole != alone


@pytest.mark.parametrize(
    ("history", "status"),
    [
        ([{"role": "user", "content": "hi"}] * 500, 422),  # over 50 turns
        ([{"role": "system", "content": "hi"}], 422),  # a role history cannot have
        ([{"role": "user"}], 422),  # no content
        ({"role": "user", "content": "hi"}, 422),  # not a list
        ([{"role": "user", "content": "x" * 40_000}], 413),  # over 32 KiB of content
    ],
)
def test_bad_history_is_refused_with_a_clear_4xx(url: str, history: object, status: int) -> None:
    response = _answer(url, FOLLOW_UP, history=history)
    assert response.status_code == status
    assert response.json()["error"]["message"]


def _respond(url: str, key: str, text: str, previous: str | None = None) -> httpx.Response:
    body: dict[str, Any] = {"model": "m", "input": text}
    if previous is not None:
        body["previous_response_id"] = previous
    headers = {"Authorization": f"Bearer {key}"}
    return httpx.post(f"{url}/v1/responses", json=body, headers=headers, timeout=60)


def _urls(response: httpx.Response) -> list[str]:
    return [r["url"] for r in response.json()["search_results"]]


def test_a_response_is_continued_by_its_key_and_by_no_other(
    service: ServiceFactory, sglang: str, keys_file: Path
) -> None:
    with service(sglang_url=sglang, api_keys_file=keys_file) as base:
        first = _respond(base, KEY_A, FIRST)
        assert first.status_code == 200
        first_id = first.json()["id"]
        alone = _respond(base, KEY_A, FOLLOW_UP)
        continued = _respond(base, KEY_A, FOLLOW_UP, previous=first_id)
        assert continued.status_code == 200
        assert any("Super_Bowl_50" in u for u in _urls(continued))
        assert _urls(continued) != _urls(alone)
        # A conversation goes on from any of its responses.
        third = _respond(base, KEY_A, "What about the NFC?", previous=continued.json()["id"])
        assert third.status_code == 200
        # Key B cannot continue key A's response: the same 404 as an unknown id.
        stolen = _respond(base, KEY_B, FOLLOW_UP, previous=first_id)
        unknown = _respond(base, KEY_A, FOLLOW_UP, previous="resp_unknown")
        for refused in (stolen, unknown):
            assert refused.status_code == 404
            assert "previous_response_id" in refused.json()["error"]["message"]


def test_with_redis_another_replica_continues_the_conversation(
    service: ServiceFactory, sglang: str
) -> None:
    settings = {"sglang_url": sglang, "redis_url": REDIS_URL, "redis_prefix": uuid.uuid4().hex}
    with service(**settings) as one, service(**settings) as other:
        first = _respond(one, "unused", FIRST)
        assert first.status_code == 200
        continued = _respond(other, "unused", FOLLOW_UP, previous=first.json()["id"])
        assert continued.status_code == 200
        assert any("Super_Bowl_50" in u for u in _urls(continued))
    # Without Redis the state is this process's: another replica does not know the id.
    with service(sglang_url=sglang) as one, service(sglang_url=sglang) as other:
        first = _respond(one, "unused", FIRST)
        assert _respond(one, "unused", FOLLOW_UP, previous=first.json()["id"]).status_code == 200
        assert _respond(other, "unused", FOLLOW_UP, previous=first.json()["id"]).status_code == 404
