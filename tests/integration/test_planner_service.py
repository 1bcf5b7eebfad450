"""The deadline planner in the running service: the `plan` event, admission (422 for a budget
even an idle worker cannot make, 503 with Retry-After for one the queue makes impossible, or
sources only), tiers, the queue for generation slots and the passage cut.

Answers come from the real tiny SGLang. The tests that need a first token held back for
seconds, to fill the queue or to be slower than the planner has learned, use the fake: a real
server does not hold its first token back on demand."""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from answer_service.http.api import create_app
from answer_service.pipeline.admission import Slot
from answer_service.runtime.settings import Settings
from eval.lib.data import REPO_ROOT
from generation.server.launch import SGLangServer
from tests.fakes.fake_sglang import FakeSGLangState, create_fake_sglang
from tests.integration.conftest import ServiceFactory, requests_taken
from tests.support import parse_sse, post_answer, serve_in_thread, wait_ready

pytestmark = pytest.mark.integration

QUESTION = "Which NFL team represented the AFC at Super Bowl 50?"


@pytest.fixture
def fake(chatml_tokenizer_dir: Path) -> Iterator[tuple[str, FakeSGLangState]]:
    state = FakeSGLangState(model_path=str(chatml_tokenizer_dir), token_delay_s=0.01)
    with serve_in_thread(create_fake_sglang(state)) as url:
        yield url, state


@pytest.mark.sglang
def test_the_plan_comes_first_with_predictions_and_actuals(tiny_service: ServiceFactory) -> None:
    with tiny_service() as url:
        response = post_answer(
            url,
            {"query": QUESTION, "ttft_budget_ms": 10_000, "top_k": 4},
        )
        events = parse_sse(response.text)
        assert [e.event for e in events[:2]] == ["plan", "sources"]
        plan = events[0].data
        assert plan["planner"] is True
        assert plan["tier"] == "standard"
        assert plan["budget_ms"] == 10_000
        assert plan["passages"] == 4  # a generous budget: everything asked for
        assert plan["rerank_depth"] == 0  # no reranker loaded in these tests
        assert plan["cuts"] == []
        assert 0 < plan["quality"] <= 1
        assert all(plan["predicted_ms"][s] > 0 for s in ("embed", "search", "first_token"))
        assert plan["actual_ms"]["embed"] > 0
        assert plan["actual_ms"]["search"] > 0
        assert plan["actual_ms"]["prompt"] > 0
        assert events[-1].data["passages_in_prompt"] == 4

        premium = post_answer(url, {"query": QUESTION, "stream": False})
        assert premium.json()["plan"]["tier"] == "standard"
        premium = httpx.post(
            f"{url}/v1/answer",
            json={"query": QUESTION, "stream": False},
            headers={"X-Tenant-Tier": "premium"},
            timeout=30,
        )
        assert premium.json()["plan"]["tier"] == "premium"
        unknown = httpx.post(
            f"{url}/v1/answer", json={"query": QUESTION}, headers={"X-Tenant-Tier": "gold"}
        )
        assert unknown.status_code == 422
        assert "unknown tenant tier 'gold'" in unknown.json()["error"]["message"]


@pytest.mark.sglang
def test_a_budget_no_plan_can_make_is_refused_at_once_or_answered_with_sources(
    tiny_service: ServiceFactory, tiny_sglang: SGLangServer
) -> None:
    with tiny_service() as url:
        asked = requests_taken(tiny_sglang)
        started = time.perf_counter()
        refused = post_answer(url, {"query": QUESTION, "ttft_budget_ms": 50})
        assert time.perf_counter() - started < 1.0
        # Nothing is queued: no wait would help, so it is the request's problem, not a 503.
        assert refused.status_code == 422
        error = refused.json()["error"]
        assert error["code"] == "invalid_request"
        floor_ms = float(re.search(r"takes about (\d+) ms", error["message"]).group(1))  # type: ignore[union-attr]
        assert floor_ms > 50
        assert requests_taken(tiny_sglang) == asked, "nothing was sent to SGLang"

        events = parse_sse(
            post_answer(
                url, {"query": QUESTION, "ttft_budget_ms": 50, "allow_sources_only": True}
            ).text
        )
        assert [e.event for e in events] == ["plan", "sources", "done"]
        assert events[0].data["cuts"][0]["reason"].startswith("no plan makes the budget")
        assert events[1].data["sources"][0]["id"] == "Super_Bowl_50-0#0"
        assert events[2].data["outcome"] == "sources_only"
        assert requests_taken(tiny_sglang) == asked


def test_a_budget_the_queue_makes_impossible_is_503_with_retry_after(
    service: ServiceFactory, fake: tuple[str, FakeSGLangState]
) -> None:
    state = fake[1]
    with service(sglang_url=fake[0]) as url:
        floor = post_answer(url, {"query": QUESTION, "ttft_budget_ms": 1}).json()["error"]
        floor_ms = float(re.search(r"takes about (\d+) ms", floor["message"]).group(1))  # type: ignore[union-attr]
        state.token_delay_s = 3.0  # the first answer holds the only slot until its first token
        with ThreadPoolExecutor(1) as pool:
            holding = pool.submit(
                post_answer, url, {"query": QUESTION, "ttft_budget_ms": 20_000, "top_k": 5}
            )
            while not state.requests:
                time.sleep(0.02)
            started = time.perf_counter()
            refused = post_answer(url, {"query": QUESTION, "ttft_budget_ms": int(floor_ms * 1.3)})
            refused_s = time.perf_counter() - started
            assert holding.result().status_code == 200
        samples = _samples(url)
    assert refused.status_code == 503, refused.text
    assert refused.json()["error"]["code"] == "overloaded"
    assert int(refused.headers["Retry-After"]) >= 1
    assert refused_s < 1.0
    assert len(state.requests) == 1
    # The service timed its part of the refusal (the 422 for the floor is not a refusal for
    # load, and the 200s are not refusals at all).
    shed = (("status", "503"),)
    assert samples[("answer_refusal_seconds_count", shed)] == 1
    assert 0 < samples[("answer_refusal_seconds_sum", shed)] <= refused_s
    assert ("answer_refusal_seconds_count", (("status", "422"),)) not in samples


@pytest.mark.sglang
def test_the_planner_off_fixes_the_configuration(tiny_service: ServiceFactory) -> None:
    with tiny_service(planner="off") as url:
        body = post_answer(url, {"query": QUESTION, "ttft_budget_ms": 50, "stream": False})
        assert body.status_code == 200, "no admission control with the planner off"
        plan = body.json()["plan"]
        assert plan["planner"] is False
        assert plan["passages"] == 5
        assert body.json()["done"]["passages_in_prompt"] == 5


def test_a_request_that_waited_for_its_slot_gets_fewer_passages(
    service: ServiceFactory, fake: tuple[str, FakeSGLangState]
) -> None:
    """One slot: B waits while A prefills. The first-token model has learned that the worker
    answers in ~0.6 s whatever the prompt, so B, with A ahead of it, is planned at ~1.2 s and
    gets all its passages. But A now takes 1.5 s: after its longer wait B's re-plan cuts the
    passages to what still fits, and says so."""
    url_sglang, state = fake
    state.token_delay_s = 0.6
    with service(sglang_url=url_sglang, max_new_tokens=2) as url:
        for _ in range(8):  # teach the first-token model
            post_answer(url, {"query": QUESTION, "ttft_budget_ms": 10_000, "stream": False})
        state.token_delay_s = 1.5  # slower than the model has learned

        async def both() -> tuple[list[str], dict[str, object]]:
            async with httpx.AsyncClient(timeout=30) as http:
                first = asyncio.create_task(
                    http.post(f"{url}/v1/answer", json={"query": QUESTION, "stream": False})
                )
                await asyncio.sleep(0.2)
                second = await http.post(
                    f"{url}/v1/answer",
                    json={"query": "Where did Super Bowl 50 take place?", "ttft_budget_ms": 2000},
                )
                await first
                return [e.event for e in parse_sse(second.text)], parse_sse(second.text)[0].data

        names, plan = asyncio.run(both())
    assert names[:2] == ["plan", "sources"]
    assert plan["initial_passages"] == 5
    assert plan["queue_wait_ms"] > 200  # type: ignore[operator]
    assert plan["passages"] < 5  # type: ignore[operator]
    cut = plan["cuts"][0]  # type: ignore[index]
    assert cut["stage"] == "passages"
    assert cut["planned"] == 5
    assert "first token predicted" in cut["reason"]


def test_a_client_gone_while_queued_leaves_the_queue(
    service: ServiceFactory, fake: tuple[str, FakeSGLangState]
) -> None:
    """One slot, held for ~1.5 s by A; B's client gives up while B waits for it: B must never
    reach SGLang, and the slot goes on to C."""
    url_sglang, state = fake
    state.token_delay_s = 1.5
    with service(sglang_url=url_sglang, max_new_tokens=1, default_ttft_budget_ms=30_000) as url:

        async def run() -> int:
            async with httpx.AsyncClient(timeout=30) as http:
                first = asyncio.create_task(
                    http.post(f"{url}/v1/answer", json={"query": QUESTION, "stream": False})
                )
                while not state.requests:  # A holds the slot (a bound: the client's 30 s)
                    assert not first.done(), "A was answered without reaching SGLang"
                    await asyncio.sleep(0.01)
                with pytest.raises(httpx.ReadTimeout):
                    await http.post(
                        f"{url}/v1/answer",
                        json={"query": "Who gave up waiting?", "stream": False},
                        timeout=0.4,
                    )
                third = await http.post(
                    f"{url}/v1/answer", json={"query": "Where is Warsaw?", "stream": False}
                )
                assert (await first).status_code == 200
                return third.status_code

        assert asyncio.run(run()) == 200
    prompts = [request["text"] for request in state.requests]
    assert len(prompts) == 2
    assert not any("Who gave up waiting?" in prompt for prompt in prompts)


def _samples(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    response = httpx.get(f"{url}/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }


@pytest.mark.sglang
def test_prometheus_metrics_count_outcomes_stages_slo_and_cached_tokens(
    tiny_service: ServiceFactory, tiny_sglang: SGLangServer
) -> None:
    with tiny_service() as url:
        standard = post_answer(url, {"query": QUESTION, "ttft_budget_ms": 10_000})
        assert standard.status_code == 200
        premium = httpx.post(
            f"{url}/v1/answer",
            json={"query": QUESTION, "ttft_budget_ms": 10_000},
            headers={"X-Tenant-Tier": "premium"},
            timeout=30,
        )
        assert premium.status_code == 200
        assert post_answer(url, {"query": QUESTION, "ttft_budget_ms": 50}).status_code == 422
        post_answer(url, {"query": QUESTION, "ttft_budget_ms": 50, "allow_sources_only": True})
        samples = _samples(url)
    requests = "answer_requests_total"
    assert samples[(requests, (("outcome", "ok"), ("tier", "standard")))] == 1
    assert samples[(requests, (("outcome", "ok"), ("tier", "premium")))] == 1
    assert samples[(requests, (("outcome", "invalid_request"), ("tier", "standard")))] == 1
    assert samples[(requests, (("outcome", "sources_only"), ("tier", "standard")))] == 1
    assert samples[("answer_ttft_seconds_count", (("tier", "standard"),))] == 1
    assert samples[("answer_ttft_budget_total", (("met", "true"), ("tier", "standard")))] == 1
    for stage in ("embed", "search", "prompt", "first_token"):
        assert samples[("answer_stage_seconds_count", (("stage", stage), ("tier", "premium")))] == 1
    assert samples[("answer_cuts_total", (("stage", "passages"), ("tier", "standard")))] == 1
    done = [parse_sse(r.text)[-1].data for r in (standard, premium)]
    worker = (("worker", tiny_sglang.url),)
    assert samples[("answer_prompt_tokens_total", worker)] == sum(d["prompt_tokens"] for d in done)
    assert samples[("answer_cached_tokens_total", worker)] == sum(d["cached_tokens"] for d in done)
    # The forms: both answers from passages (the tests' ANSWER_MODE), the cut one from its sources.
    forms = "answer_forms_total"
    passages = (("form", "passages"), ("mode", "passages"))
    assert samples[(forms, (*passages, ("tier", "standard")))] == 1
    assert samples[(forms, (*passages, ("tier", "premium")))] == 1
    sources_only = (("form", "sources_only"), ("mode", "passages"), ("tier", "standard"))
    assert samples[(forms, sources_only)] == 1
    finish = {k[1]: v for k, v in samples.items() if k[0] == "answer_finish_total"}
    assert sum(finish.values()) == 3  # the refusal never answered
    assert finish[(("reason", "sources_only"), ("tier", "standard"))] == 1
    assert finish[(("reason", done[1]["finish_reason"]), ("tier", "premium"))] == 1
    unsupported = ("answer_unsupported_sentences_total", (("tier", "standard"),))
    assert samples[unsupported] == done[0]["unsupported_sentences"]
    form_ttft = "answer_form_ttft_seconds_count"
    assert samples[(form_ttft, (("form", "passages"), ("tier", "standard")))] == 1
    assert (form_ttft, (("form", "sources_only"), ("tier", "standard"))) not in samples


def test_the_gate_is_read_on_the_event_loop_only(
    fake: tuple[str, FakeSGLangState], squad_index: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The generation gate's dicts change on the event loop (a slot taken, released, owed):
    reading them from the prompt-fitting thread races those changes ('dictionary changed size
    during iteration' under load, with several slots per worker). Every read of what a worker
    is prefilling happens on the loop."""
    settings = Settings(
        index_dir=squad_index,
        sglang_url=fake[0],
        reranker_model=None,
        answer_cache_ttl_s=0,
        abstain_below=0,
        mode="passages",
        generation_slots_per_worker=2,
        planner="priors",  # a fake SGLang's timing is no machine's
    )
    app = create_app(settings)
    where: list[str] = []
    with serve_in_thread(app) as url:
        wait_ready(url)
        gate = app.state.components.pipeline.planning.gate
        read = gate.prefilling_tokens

        def recording(worker: str, slot: Slot) -> float:
            try:
                asyncio.get_running_loop()
                where.append("loop")
            except RuntimeError:
                where.append(threading.current_thread().name)
            return read(worker, slot)

        monkeypatch.setattr(gate, "prefilling_tokens", recording)
        response = post_answer(url, {"query": QUESTION, "ttft_budget_ms": 10_000, "stream": False})
    assert response.status_code == 200, response.text
    assert where
    assert set(where) == {"loop"}, where


def test_with_the_planner_off_the_slot_queue_is_capped(
    service: ServiceFactory, fake: tuple[str, FakeSGLangState]
) -> None:
    """Nothing else bounds it with the planner off: one request holds the slot (SGLang sends
    no token), two wait for it, the rest are refused at once with 503 and Retry-After."""
    url_sglang, state = fake
    state.mode = "stall"
    with service(
        sglang_url=url_sglang, planner="off", abstain_below=0, generation_queue_max=2
    ) as url:

        async def run() -> list[httpx.Response]:
            async with httpx.AsyncClient(timeout=30) as http:
                body = {"query": QUESTION, "ttft_budget_ms": 1000, "stream": False}
                return await asyncio.gather(
                    *(http.post(f"{url}/v1/answer", json=body) for _ in range(5))
                )

        started = time.perf_counter()
        responses = asyncio.run(run())
        elapsed_s = time.perf_counter() - started
    refused = [r for r in responses if r.status_code == 503]
    assert len(refused) == 2, [r.text for r in responses]
    for response in refused:
        error = response.json()["error"]
        assert error["code"] == "overloaded"
        assert "requests are already waiting for a generation slot" in error["message"]
        assert int(response.headers["Retry-After"]) >= 1
    # The one holding the slot and the two queued behind it give up at the deadline (x4).
    assert sorted(r.status_code for r in responses if r not in refused) == [504, 504, 504]
    assert len(state.requests) == 1
    assert elapsed_s < 10


@pytest.mark.sglang
def test_a_quote_buys_the_rerank_depth_its_curve_pays_for(
    tiny_service: ServiceFactory, tmp_path: Path
) -> None:
    """A quote pays for no generation, so a roomy budget buys the deepest rerank its measured
    curve says is worth it: none with the shipped curve (the builtin reranker moves the gold
    passage up, not the quote's answers), the deepest with a curve where depth pays."""
    curves = json.loads((REPO_ROOT / "eval/results/quality-curves.json").read_text())
    curves["metrics"]["quote_by_depth"] = {"0": 0.70, "10": 0.75, "30": 0.80}
    (tmp_path / "quality-curves.json").write_text(json.dumps(curves))
    body = {"query": QUESTION, "ttft_budget_ms": 10_000, "answer_mode": "quote"}
    for calibration, depth in ((None, 0), (tmp_path, 30)):
        with tiny_service(reranker_model="builtin", calibration_dir=calibration) as url:
            deadline = time.monotonic() + 180
            while (status := httpx.get(f"{url}/readyz").json()["reranker"]).startswith("loading"):
                assert time.monotonic() < deadline, status
                time.sleep(0.5)
            assert status == "builtin"
            plan = parse_sse(post_answer(url, body).text)[0].data
            assert plan["rerank_depth"] == depth
            assert (plan["predicted_ms"]["rerank"] > 0) == (plan["actual_ms"]["rerank"] > 0)
            assert (plan["actual_ms"]["rerank"] > 0) == (depth > 0)
            assert plan["predicted_ms"]["first_token"] == 0  # a quote: no generation priced
            assert plan["form"] == "quote"
