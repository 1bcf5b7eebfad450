"""Two real CPU workers (tiny random-weights Llama) behind the real sglang-router.

Which worker served a request is read from the workers' own counters
(`sglang:prompt_tokens_total` on each `/metrics`; requests are sent one at a time), since the
router's response does not say. The fleet (two workers and a cache_aware router) is started
once for the module; a round_robin router over the same workers is started for the contrast.
The service's own routing over the same two workers (ANSWER_SGLANG_WORKERS, no router) is
tested here too, on the workers' real caches. The last test kills a worker, so it stays last.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest

from answer_service.pipeline.events import AnswerRequest, DoneEvent
from answer_service.pipeline.generation_steps import GenerationConfig
from budget import Deadline
from generation.server.fleet import SGLangFleet, SGLangFleetConfig
from generation.server.launch import SGLangServerConfig, write_tiny_model
from generation.server.router import SGLangRouter, SGLangRouterConfig
from generation.sglang_client import SamplingParams, SGLangClient, StreamTimeouts
from tests.builders import make_index, make_pipeline, slow_sentences
from tests.integration.conftest import ServiceFactory
from tests.support import free_port, post_answer

pytestmark = [pytest.mark.integration, pytest.mark.sglang]

WORDS = [
    "alpha",
    "beta",
    "gamma",
    "delta",
    "epsilon",
    "zeta",
    "eta",
    "theta",
    "iota",
    "kappa",
    "lambda",
    "mu",
]
MIN_PREFIX_TOKENS = 500
QUESTIONS = (  # for the service's own routing: in the SQuAD test index
    "Which NFL team represented the AFC at Super Bowl 50?",
    "What is the capital of Warsaw's Masovian Voivodeship?",
    "Who was the Norman leader?",
)


def _ports(count: int) -> list[int]:
    ports: set[int] = set()
    while len(ports) < count:
        ports.add(free_port())
    return sorted(ports)


def _prefix(seed: int) -> str:
    """About 620 tokens that share almost nothing with another seed's text."""
    return " ".join(f"{WORDS[(i * seed) % len(WORDS)]}{i}" for i in range(160))


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, smollm2_dir: Path) -> Iterator[SGLangFleet]:
    model_dir = write_tiny_model(tmp_path_factory.mktemp("tiny-llama"), smollm2_dir)
    router_port, metrics_port, *worker_ports = _ports(4)
    running = SGLangFleet(
        SGLangFleetConfig(
            worker=SGLangServerConfig(
                model_dir=model_dir,
                load_format="dummy",
                max_total_tokens=8192,
                startup_timeout_s=300.0,
                device="cpu",
            ),
            router=SGLangRouterConfig(port=router_port, metrics_port=metrics_port),
            worker_ports=tuple(worker_ports),
            log_dir=tmp_path_factory.mktemp("fleet-logs"),
        )
    )
    try:
        running.start()
        yield running
    finally:
        running.stop()


@pytest.fixture(scope="module")
def round_robin(fleet: SGLangFleet, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port, metrics_port = _ports(2)
    router = SGLangRouter(
        SGLangRouterConfig(
            worker_urls=fleet.worker_urls,
            port=port,
            metrics_port=metrics_port,
            policy="round_robin",
            log_path=tmp_path_factory.mktemp("rr-log") / "router.log",
        )
    )
    try:
        yield router.start()
    finally:
        router.stop()


def _counter(text: str, name: str, labels: str = "") -> float:
    pattern = rf"^{re.escape(name)}\{{[^}}]*{re.escape(labels)}[^}}]*\}} ([0-9.e+-]+)$"
    return sum(float(value) for value in re.findall(pattern, text, re.MULTILINE))


def _prompt_tokens(worker_urls: tuple[str, ...]) -> list[float]:
    return [
        _counter(httpx.get(f"{url}/metrics", timeout=10).text, "sglang:prompt_tokens_total")
        for url in worker_urls
    ]


def _generate(url: str, workers: tuple[str, ...], text: str) -> tuple[int, dict[str, Any]]:
    """Send one request; return which worker served it and its meta_info."""
    before = _prompt_tokens(workers)
    body = {"text": text, "sampling_params": {"max_new_tokens": 1, "temperature": 0.0}}
    response = httpx.post(f"{url}/generate", json=body, timeout=60)
    response.raise_for_status()
    after = _prompt_tokens(workers)
    served = [i for i, (b, a) in enumerate(zip(before, after, strict=True)) if a > b]
    assert len(served) == 1, f"prompt tokens moved on workers {served}"
    meta: dict[str, Any] = response.json()["meta_info"]
    return served[0], meta


def _settle(url: str, workers: tuple[str, ...], within_s: float = 30.0) -> None:
    """Wait until the router has nothing in flight and the workers' prompt-token counters have
    stopped moving (a dropped request is counted when it ends), at most `within_s`."""
    end = time.monotonic() + within_s
    last = _prompt_tokens(workers)
    while time.monotonic() < end:
        time.sleep(0.5)
        listed = httpx.get(f"{url}/workers", timeout=10).json()["workers"]
        now = _prompt_tokens(workers)
        if not any(worker["load"] for worker in listed) and now == last:
            return
        last = now
    raise AssertionError(f"the workers did not settle within {within_s:.0f} s")


def _flush(url: str) -> None:
    httpx.post(f"{url}/flush_cache", timeout=30).raise_for_status()


def _stream_body(text: str, rid: str, max_new_tokens: int) -> dict[str, Any]:
    params = {"max_new_tokens": max_new_tokens, "temperature": 0.0, "ignore_eos": True}
    return {"text": text, "rid": rid, "stream": True, "sampling_params": params}


def _events(lines: Iterator[str]) -> Iterator[dict[str, Any]]:
    for line in lines:
        if line.startswith("data: {"):
            yield json.loads(line.removeprefix("data: "))


def test_fleet_is_ready_and_found_again(fleet: SGLangFleet) -> None:
    assert fleet.router.healthy_workers() == 2
    assert fleet.start() == fleet.url  # idempotent

    found = SGLangFleet.find(fleet.router.config.cache_dir, fleet.router.config.port)
    assert found is not None
    assert found.worker_urls == fleet.worker_urls


def test_router_endpoints(fleet: SGLangFleet) -> None:
    """What sglang-router 0.3.2 answers itself, forwards, or lacks (see sglang_router)."""
    with httpx.Client(base_url=fleet.url, timeout=10) as client:
        assert client.get("/health").text == "OK"
        readiness = client.get("/readiness").json()
        assert readiness["healthy_workers"] == readiness["total_workers"] == 2
        assert client.get("/get_model_info").json()["model_path"]
        assert client.get("/ready").status_code == 404
        assert client.post("/abort_request", json={"rid": "x"}).status_code == 404
    assert "smg_worker_health" in httpx.get(fleet.router.metrics_url, timeout=10).text


async def test_the_service_client_reads_the_routers_readiness(fleet: SGLangFleet) -> None:
    """The router's /health is always OK; the client asks /readiness, which asks the workers."""
    async with httpx.AsyncClient() as http:
        assert await SGLangClient(http, fleet.url).health()
        assert not await SGLangClient(http, f"http://127.0.0.1:{free_port()}").health()


def test_cache_aware_keeps_a_shared_prefix_on_one_worker(fleet: SGLangFleet) -> None:
    _flush(fleet.url)
    prefix = _prefix(seed=1)
    metrics_before = httpx.get(fleet.router.metrics_url, timeout=10).text

    served = [
        _generate(fleet.url, fleet.worker_urls, f"{prefix} question {k}: why?") for k in range(4)
    ]

    workers = {worker for worker, _ in served}
    assert len(workers) == 1, served
    first, repeats = served[0][1], [meta for _, meta in served[1:]]
    assert first["prompt_tokens"] >= MIN_PREFIX_TOKENS
    assert first["cached_tokens"] == 0
    for meta in repeats:
        assert meta["cached_tokens"] >= 0.95 * meta["prompt_tokens"] - 8, meta
    # The router's own per-worker counter agrees with the workers' counters.
    metrics_after = httpx.get(fleet.router.metrics_url, timeout=10).text
    chosen = fleet.worker_urls[workers.pop()]
    label = f'worker="{chosen}",outcome="success"'
    counted = _counter(metrics_after, "smg_worker_cb_outcomes_total", label) - _counter(
        metrics_before, "smg_worker_cb_outcomes_total", label
    )
    assert counted == 4


def test_cache_aware_sends_a_new_prefix_to_the_idle_worker_then_keeps_it(
    fleet: SGLangFleet,
) -> None:
    """A prefix goes where its text went before while loads are balanced; a new prefix goes to
    the least-loaded worker once one worker has two more requests in flight than the other."""
    _flush(fleet.url)
    prefix_a, prefix_b = _prefix(seed=5), _prefix(seed=7)
    worker_a, _ = _generate(fleet.url, fleet.worker_urls, f"{prefix_a} warm?")

    with ExitStack() as stack:
        client = stack.enter_context(httpx.Client(base_url=fleet.url, timeout=60))
        # Two long requests on worker_a, each seen running. Keep their event iterators: a
        # dropped one closes its connection, and the router and worker drop the request.
        # 2,000 new tokens each: both fit the worker's 8,192 tokens at once, so both run.
        running = []
        for k in range(2):
            body = _stream_body(f"{prefix_a} long {k}?", uuid.uuid4().hex, 2000)
            response = stack.enter_context(client.stream("POST", "/generate", json=body))
            running.append(_events(response.iter_lines()))
            next(running[-1])
        loads = [worker["load"] for worker in client.get("/workers").json()["workers"]]
        worker_b, meta_b = _generate(fleet.url, fleet.worker_urls, f"{prefix_b} first?")
    assert sorted(loads) == [0, 2]
    assert worker_b != worker_a
    assert meta_b["cached_tokens"] < 50
    # The two long requests were dropped with their connections; a worker counts a request's
    # prompt tokens when it ends, so wait for those two to be counted before telling which
    # worker served the next one by its counter.
    _settle(fleet.url, fleet.worker_urls)

    for k in range(2):
        again_b, meta = _generate(fleet.url, fleet.worker_urls, f"{prefix_b} again {k}?")
        assert again_b == worker_b
        assert meta["cached_tokens"] >= 0.95 * meta["prompt_tokens"] - 8
        again_a, _ = _generate(fleet.url, fleet.worker_urls, f"{prefix_a} again {k}?")
        assert again_a == worker_a


def test_round_robin_puts_the_prefix_on_both_workers(fleet: SGLangFleet, round_robin: str) -> None:
    _flush(round_robin)
    prefix = _prefix(seed=11)

    served = [
        _generate(round_robin, fleet.worker_urls, f"{prefix} question {k}?") for k in range(4)
    ]

    assert {worker for worker, _ in served} == {0, 1}
    hits = [meta["cached_tokens"] >= 0.95 * meta["prompt_tokens"] - 8 for _, meta in served]
    assert hits == [False, False, True, True], served  # one cold prefill per worker


def test_stream_through_the_router(fleet: SGLangFleet) -> None:
    rid = uuid.uuid4().hex
    lines: list[str] = []
    with (
        httpx.Client(base_url=fleet.url, timeout=60) as client,
        client.stream("POST", "/generate", json=_stream_body(_prefix(3), rid, 8)) as response,
    ):
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = list(response.iter_lines())

    chunks = list(_events(iter(lines)))
    assert [line for line in lines if line.startswith("data: ")][-1] == "data: [DONE]"
    # Streamed: several chunks, one per decode step at most (SGLang sends two tokens in one
    # chunk when its detokenizer falls behind, as it did in a CI run on two busy cores).
    assert 2 <= len(chunks) <= 8
    assert [c["meta_info"]["completion_tokens"] for c in chunks] == sorted(
        c["meta_info"]["completion_tokens"] for c in chunks
    )
    meta = chunks[-1]["meta_info"]
    assert meta["id"] == rid  # the caller's rid reaches the worker unchanged
    assert meta["finish_reason"]["type"] == "length"
    assert meta["completion_tokens"] == 8
    assert "cached_tokens" in meta


def test_abort_request_sent_to_the_workers_ends_a_routed_stream(fleet: SGLangFleet) -> None:
    rid = uuid.uuid4().hex
    with (
        httpx.Client(base_url=fleet.url, timeout=60) as client,
        client.stream("POST", "/generate", json=_stream_body("abort me", rid, 4000)) as response,
    ):
        events = _events(response.iter_lines())
        for _ in range(3):
            next(events)
        # The router has no /abort_request; a worker without this rid ignores it.
        for worker in fleet.worker_urls:
            httpx.post(f"{worker}/abort_request", json={"rid": rid}, timeout=10)
        rest = [chunk["meta_info"]["finish_reason"] for chunk in events]

    assert rest[-1]["type"] == "abort"
    assert len(rest) < 4000 - 3


async def test_the_clients_abort_reaches_the_worker_behind_the_router(fleet: SGLangFleet) -> None:
    """sglang-router has no /abort_request (404): the service's client aborts on the router's
    workers instead. The connection is kept open here, so only an abort that reached the worker
    can end the stream early. (Measured on these machines, over the real router: closing the
    stream stopped the worker's decoding within 0.09 s, an abort sent to the workers within
    0.08 s, and one sent to the router was a 404 while the worker decoded on for 13 s, to the
    end of its 4,000 tokens.)"""
    params = SamplingParams(max_new_tokens=4000, ignore_eos=True)
    async with httpx.AsyncClient() as http:
        client = SGLangClient(http, fleet.url)
        stream = await client.open_stream(
            "abort me", params, StreamTimeouts(first_token=Deadline.after_ms(60_000))
        )
        deltas = aiter(stream)
        for _ in range(3):
            await anext(deltas)
        await client.abort(stream.rid)
        rest = [delta async for delta in deltas]
        await client.drain()
    assert stream.result is not None
    assert stream.result.finish_reason == "abort"
    assert stream.result.completion_tokens < 4000 - len(rest)


def _finished(workers: tuple[str, ...]) -> tuple[float, float]:
    """Requests finished and tokens generated, over all workers; once the numbers hold still."""
    previous: tuple[float, float] | None = None
    while True:
        texts = [httpx.get(f"{url}/metrics", timeout=10).text for url in workers]
        current = (
            sum(_counter(text, "sglang:num_requests_total") for text in texts),
            sum(_counter(text, "sglang:generation_tokens_total") for text in texts),
        )
        if current == previous:
            return current
        previous = current
        time.sleep(0.5)


def test_closing_a_routed_stream_stops_the_worker(fleet: SGLangFleet) -> None:
    max_new_tokens = 6000  # ~30 s for the tiny model on these cores if nothing stopped it
    requests_before, tokens_before = _finished(fleet.worker_urls)
    body = _stream_body("leave early", uuid.uuid4().hex, max_new_tokens)
    with (
        httpx.Client(base_url=fleet.url, timeout=60) as client,
        client.stream("POST", "/generate", json=body) as response,
    ):
        events = _events(response.iter_lines())
        for _ in range(3):
            next(events)

    deadline = time.monotonic() + 10.0
    requests, tokens = requests_before, tokens_before
    while requests == requests_before and time.monotonic() < deadline:
        time.sleep(0.25)
        requests, tokens = _finished(fleet.worker_urls)
    assert requests == requests_before + 1, "the worker did not finish the request early"
    assert tokens - tokens_before < max_new_tokens


async def test_a_prompt_sent_ahead_of_an_abstention_is_aborted_behind_the_router(
    fleet: SGLangFleet, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A whole-passages prompt goes to the model while the evidence is weighed (issue 43); when
    the evidence says "I do not know", the routed request is aborted on its worker. The
    decision is slowed to a second here, so that the worker is surely decoding by then;
    unaborted, it would decode all 4,000 tokens (about 13 s for the tiny model)."""
    max_new_tokens = 4000
    requests_before, tokens_before = _finished(fleet.worker_urls)
    async with httpx.AsyncClient() as http:
        client = SGLangClient(http, fleet.url)
        pipeline, _ = make_pipeline(
            make_index(tmp_path),
            workers=[client],
            abstain_below=1.01,  # whatever the evidence
            generation=GenerationConfig(served_model="tiny", max_new_tokens=max_new_tokens),
        )
        slow_sentences(monkeypatch, pipeline, 1.0)
        prepared = await pipeline.prepare(
            AnswerRequest("How long is green tea steeped?", 30_000, 3), Deadline.after_ms(30_000)
        )
        events = [event async for event in pipeline.events(prepared)]
        await client.drain()
    done = events[-1]
    assert isinstance(done, DoneEvent)
    assert done.stats.outcome == "abstained"
    assert done.stats.wasted_prefill_tokens > 0

    deadline = time.monotonic() + 10.0
    requests, tokens = requests_before, tokens_before
    while requests == requests_before and time.monotonic() < deadline:
        await asyncio.sleep(0.25)
        requests, tokens = _finished(fleet.worker_urls)
    assert requests == requests_before + 1, "the worker did not end the request early"
    assert 0 < tokens - tokens_before < max_new_tokens


def test_the_service_keeps_repeated_passages_on_one_worker(
    fleet: SGLangFleet, service: ServiceFactory
) -> None:
    """The service routing over the workers itself (ANSWER_SGLANG_WORKERS), no router: new
    prefixes spread over idle workers, a repeated one goes back where its passages are cached,
    and the worker's cache really holds them."""
    workers = fleet.worker_urls
    for worker in workers:
        _flush(worker)
    with service(sglang_workers=list(workers), max_new_tokens=8) as url:
        first = {}
        for question in QUESTIONS:
            done = post_answer(url, {"query": question, "stream": False}).json()["done"]
            first[question] = done["worker"]
            assert done["prompt_layout"] == "cache_aware"
        assert set(first.values()) == set(workers), "new prefixes spread over idle workers"
        for question in QUESTIONS * 2:
            done = post_answer(url, {"query": question, "stream": False}).json()["done"]
            assert done["worker"] == first[question]
            assert done["expected_cached_tokens"] > 0.8 * done["prompt_tokens"]
            assert done["cached_tokens"] >= done["expected_cached_tokens"] - 2


def test_the_services_round_robin_alternates(fleet: SGLangFleet, service: ServiceFactory) -> None:
    workers = fleet.worker_urls
    with service(
        sglang_workers=list(workers), sglang_routing="round_robin", max_new_tokens=8
    ) as url:
        served = [
            post_answer(url, {"query": QUESTIONS[0], "stream": False}).json()["done"]["worker"]
            for _ in range(4)
        ]
    assert served == [workers[0], workers[1], workers[0], workers[1]]


def _served_by(workers: tuple[str, ...], before: list[float]) -> int:
    moved = [
        i for i, (b, a) in enumerate(zip(before, _prompt_tokens(workers), strict=True)) if a > b
    ]
    assert len(moved) == 1, f"prompt tokens moved on workers {moved}"
    return moved[0]


def test_a_worker_lost_behind_the_router_is_passed_over(
    fleet: SGLangFleet, service: ServiceFactory
) -> None:
    """Last in the module: it kills a worker. sglang-router retries the first request it sends
    to the dead worker on that same worker, answers 500 `call_upstream_request_error` when its
    retries are spent, and by then the worker's circuit is open: it is passed over from then
    on. The service, whose only SGLang URL is the router's, asks it once more and
    answers; later requests go to the worker left; the router stops counting the dead one
    within seconds."""
    _flush(fleet.url)
    workers = fleet.worker_urls
    body = {"query": "Why is alpha first?", "ttft_budget_ms": 30_000, "stream": False}
    with service(sglang_url=fleet.url, abstain_below=0) as url:  # every answer asks SGLang
        before = _prompt_tokens(workers)
        first = post_answer(url, body)
        lost = _served_by(workers, before)
        kept_url = workers[1 - lost]
        os.killpg(int(fleet.workers[lost].pid_path.read_text()), signal.SIGKILL)
        killed_s = time.monotonic()
        # The same prompt: the router's cache sends it to the dead worker.
        kept_before = _prompt_tokens((kept_url,))[0]
        again = post_answer(url, body)
        again_on_kept = _prompt_tokens((kept_url,))[0] > kept_before
        router_metrics = httpx.get(fleet.router.metrics_url, timeout=10).text
        later = []  # (status, served by the worker left)
        for k in range(3):
            kept_before = _prompt_tokens((kept_url,))[0]
            text = {
                "text": f"{_prefix(seed=13)} after {k}?",
                "sampling_params": {"max_new_tokens": 1},
            }
            response = httpx.post(f"{fleet.url}/generate", json=text, timeout=60)
            later.append((response.status_code, _prompt_tokens((kept_url,))[0] > kept_before))
    while fleet.router.healthy_workers() != 1:
        assert time.monotonic() - killed_s < 15.0, "the router still counts the dead worker"
        time.sleep(0.25)

    assert first.status_code == 200
    assert first.json()["done"]["outcome"] == "ok"
    assert again.status_code == 200, again.text
    assert again.json()["done"]["outcome"] == "ok"
    assert again_on_kept
    # The router tried the dead worker (its retries go to the same worker), gave up once with
    # the 500, opened that worker's circuit; the service's second ask went to the other.
    lost_label = f'worker="{workers[lost]}",outcome="failure"'
    assert _counter(router_metrics, "smg_worker_cb_outcomes_total", lost_label) >= 1
    assert _counter(router_metrics, "smg_worker_retries_exhausted_total") == 1
    assert later == [(200, True)] * 3
