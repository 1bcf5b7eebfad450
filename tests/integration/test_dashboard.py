"""The dashboard's data over real HTTP: snapshots from this replica's memory, from a real Redis
shared by two replicas, and from memory again while Redis is down; the SSE push; the page and
its bundled files; the answer forms each request got. Answers come from the real tiny SGLang."""

from __future__ import annotations

import json
import uuid
from typing import Any

import httpx
import pytest
from httpx_sse import connect_sse

from tests.integration.conftest import ServiceFactory
from tests.support import free_port, post_answer

pytestmark = [pytest.mark.integration, pytest.mark.sglang]

REDIS_URL = "redis://127.0.0.1:6379/0"
QUESTION = "Which NFL team represented the AFC at Super Bowl 50?"


def _answer(url: str, **extra: Any) -> dict[str, Any]:
    body = {"query": QUESTION, "ttft_budget_ms": 10_000, "top_k": 3, "stream": False, **extra}
    response = post_answer(url, body)
    assert response.status_code == 200, response.text
    done: dict[str, Any] = response.json()["done"]
    return done


def _snapshot(url: str) -> dict[str, Any]:
    response = httpx.get(f"{url}/dashboard/snapshot", timeout=10)
    assert response.status_code == 200, response.text
    snapshot: dict[str, Any] = response.json()
    return snapshot


def test_the_page_and_its_files_are_served(service: ServiceFactory) -> None:
    # The page needs no answers: no SGLang at all.
    with service(sglang_url=f"http://127.0.0.1:{free_port()}", ready=False) as url:
        page = httpx.get(f"{url}/dashboard", timeout=10)
        assert page.status_code == 200
        assert page.headers["content-type"].startswith("text/html")
        assert "http://" not in page.text.replace("http://127.0.0.1", "")  # nothing from outside
        script = httpx.get(f"{url}/dashboard/static/dashboard.js", timeout=10)
        assert script.status_code == 200
        assert "EventSource" in script.text or "import" in script.text


def test_a_snapshot_holds_answers_and_refusals_from_memory(tiny_service: ServiceFactory) -> None:
    with tiny_service() as url:
        done = _answer(url)
        refused = post_answer(url, {"query": QUESTION, "ttft_budget_ms": 1})  # nothing fits 1 ms
        assert refused.status_code == 422, refused.text
        snapshot = _snapshot(url)
        traces = httpx.get(f"{url}/v1/traces", params={"limit": 10}, timeout=10).json()
    assert snapshot["source"] == "memory"
    assert snapshot["counts"]["answered"] == 1
    assert snapshot["counts"]["rejected"] == 1
    refusal, answer = snapshot["requests"]
    assert refusal["outcome"] == "invalid_request"
    refused_root = next(t for t in traces if t["trace_id"] == refusal["trace_id"])["spans"][0]
    assert refused_root["attributes"]["answer.outcome"] == "InvalidRequestError"
    (event,) = refused_root["events"]  # recorded once
    assert event["name"] == "exception"
    assert "idle worker" in event["attributes"]["exception.message"]
    assert "exception.stacktrace" not in event["attributes"]  # a refusal is not a bug
    assert answer["trace_id"] == done["trace_id"]
    assert answer["ttft_ms"] == pytest.approx(done["ttft_ms"], abs=0.01)  # done rounds to 0.01
    stages = {s["stage"]: s for s in answer["stages"]}
    assert stages["embed"]["actual_ms"] > 0
    assert stages["first_token"]["planned_ms"] > 0
    assert snapshot["slo"]["windows"][0]["answered"] == 1
    assert snapshot["ttft"]["by_tier"][0]["key"] == "standard"
    assert snapshot["planner"][0]["passages"] == answer["knobs"]["passages"]


def test_replicas_share_their_requests_through_redis(tiny_service: ServiceFactory) -> None:
    prefix = f"test-{uuid.uuid4().hex[:8]}:"
    settings = {"redis_url": REDIS_URL, "redis_prefix": prefix}
    with tiny_service(**settings) as first, tiny_service(**settings) as second:
        done = _answer(first)
        seen_by_second = _snapshot(second)
        later = _answer(first)
        seen_again = _snapshot(second)  # read on from where the last read stopped
        ready = httpx.get(f"{second}/readyz", timeout=10).json()
    assert ready["redis"] == "up"
    assert seen_by_second["source"] == "redis"
    assert [r["trace_id"] for r in seen_by_second["requests"]] == [done["trace_id"]]
    assert [r["trace_id"] for r in seen_again["requests"]] == [
        later["trace_id"],
        done["trace_id"],
    ]


def test_redis_down_falls_back_to_memory_and_readiness_says_so(
    tiny_service: ServiceFactory,
) -> None:
    dead = f"redis://127.0.0.1:{free_port()}/0"
    with tiny_service(redis_url=dead) as url:
        ready = httpx.get(f"{url}/readyz", timeout=10)
        done = _answer(url)
        snapshot = _snapshot(url)
    assert ready.status_code == 200  # answering does not need Redis
    assert ready.json()["redis"].startswith("down: ")
    assert snapshot["source"] == "memory"
    assert snapshot["requests"][0]["trace_id"] == done["trace_id"]


def test_snapshots_are_pushed_over_sse(tiny_service: ServiceFactory) -> None:
    with (
        tiny_service() as url,
        httpx.Client(timeout=10) as client,
        connect_sse(client, "GET", f"{url}/dashboard/events") as source,
    ):
        events = source.iter_sse()
        first = next(events)
        done = _answer(url)
        later = next(e for e in events if json.loads(e.data)["requests"])
    assert first.event == "snapshot"
    assert json.loads(first.data)["requests"] == []
    assert json.loads(later.data)["requests"][0]["trace_id"] == done["trace_id"]


def test_a_snapshot_shows_the_form_each_request_got(tiny_service: ServiceFactory) -> None:
    """One answer in each form, asked with `answer_mode`; the abstention from a second replica
    that abstains on any evidence, so both replicas' summaries meet in Redis."""
    prefix = f"test-{uuid.uuid4().hex[:8]}:"
    settings = {"redis_url": REDIS_URL, "redis_prefix": prefix}
    with tiny_service(**settings) as url, tiny_service(abstain_below=1.0, **settings) as doubter:
        done = {
            "passages": _answer(url),
            "quote": _answer(url, answer_mode="quote"),
            "focused": _answer(url, answer_mode="focused"),
            "sources_only": _answer(url, ttft_budget_ms=50, allow_sources_only=True),
            "abstain": _answer(doubter),
        }
        snapshot = _snapshot(url)
    assert {form: d["form"] for form, d in done.items()} == {form: form for form in done}
    assert snapshot["source"] == "redis"
    by_trace = {r["trace_id"]: r for r in snapshot["requests"]}
    for form, d in done.items():
        request = by_trace[d["trace_id"]]
        assert request["form"] == form
        assert request["form_reason"] == d["form_reason"]
        assert request["finish_reason"] == d["finish_reason"]
        assert request["unsupported_sentences"] == d["unsupported_sentences"]
        assert request["from_cache"] is False
    assert by_trace[done["quote"]["trace_id"]]["mode"] == "quote"
    assert by_trace[done["passages"]["trace_id"]]["mode"] == "passages"  # the service's default
    assert done["quote"]["finish_reason"] == "quote"
    assert "quote" in done["quote"]["form_reason"]

    forms = snapshot["forms"]
    mix = {row["form"]: row["count"] for row in forms["mix"]}
    assert mix == {**{form: 1 for form in done}, "cached": 0}
    assert forms["answers"] == 5
    assert forms["generated"] == 2  # focused and passages
    generated = [done["focused"], done["passages"]]
    assert forms["unsupported_sentences"] == sum(d["unsupported_sentences"] for d in generated)
    assert forms["repetition_stops"] == sum(d["finish_reason"] == "repetition" for d in generated)
    served = {g["key"]: g for g in snapshot["ttft"]["by_served"]}
    assert served["model"]["count"] == 2
    assert served["without model"]["count"] == 2  # the quote and the abstention; sources none
    assert served["without model"]["p99"] == pytest.approx(
        max(done["quote"]["ttft_ms"], done["abstain"]["ttft_ms"]), abs=0.01
    )
