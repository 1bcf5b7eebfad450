"""Faults against the real components: an index swapped while serving, Redis down and back, and
a graceful shutdown with answers open, answered by the real tiny SGLang. A worker or a router's
worker lost is scripted with the fake. (SGLang killed mid-stream: test_answer_stream.py; SGLang
stalling, dying, refusing and the client going away: test_api_failures.py.)"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from generation.server.launch import SGLangServer
from retrieval.embedder import EmbedderConfig, SentenceTransformerEmbedder
from retrieval.index.builder import build_index
from tests.fakes.fake_sglang import FakeSGLangState, create_fake_sglang
from tests.integration.conftest import ServiceFactory
from tests.scifact import CORPUS as SCIFACT_CORPUS
from tests.support import free_port, open_text, parse_sse, post_answer, serve_in_thread, wait_ready

pytestmark = pytest.mark.integration

QUESTION = "Which NFL team represented the AFC at Super Bowl 50?"


@pytest.fixture
def fake(chatml_tokenizer_dir: Path) -> Iterator[tuple[str, FakeSGLangState]]:
    state = FakeSGLangState(model_path=str(chatml_tokenizer_dir))
    with serve_in_thread(create_fake_sglang(state)) as url:
        yield url, state


def _ask(url: str, query: str = QUESTION) -> httpx.Response:
    return post_answer(url, {"query": query, "ttft_budget_ms": 10_000, "top_k": 3, "stream": False})


@pytest.mark.sglang
def test_an_index_swapped_while_serving_drops_no_request(
    tiny_service: ServiceFactory, squad_index: Path, tmp_path: Path
) -> None:
    other = tmp_path / "scifact.jsonl"
    with open_text(SCIFACT_CORPUS) as source:
        other.write_text("".join(itertools.islice(source, 30)))
    other_index = tmp_path / "scifact-index"
    build_index(other, other_index, SentenceTransformerEmbedder(EmbedderConfig()), progress=False)
    current = tmp_path / "current"
    current.symlink_to(squad_index)

    results: list[httpx.Response] = []
    stop = threading.Event()

    def ask_all_along(url: str) -> None:
        while not stop.is_set():
            results.append(_ask(url))

    with tiny_service(index_dir=current, index_watch_s=0.1, abstain_below=0) as url:
        before = httpx.get(f"{url}/readyz", timeout=10).json()["index_passages"]
        client = threading.Thread(target=ask_all_along, args=(url,))
        client.start()
        try:
            while len(results) < 3:
                time.sleep(0.05)
            flipped = tmp_path / "next"
            flipped.symlink_to(other_index)
            os.replace(flipped, current)  # atomic, as a deployment would
            deadline = time.monotonic() + 30
            while httpx.get(f"{url}/readyz", timeout=10).json()["index_passages"] == before:
                assert time.monotonic() < deadline, "the new index was never swapped in"
                time.sleep(0.1)
            swapped_at = len(results)
            while len(results) < swapped_at + 3:
                time.sleep(0.05)
        finally:
            stop.set()
            client.join()
    assert [r.status_code for r in results] == [200] * len(results)
    assert all(r.json()["done"]["outcome"] == "ok" for r in results)
    scifact_ids = {json.loads(line)["_id"] for line in other.read_text().splitlines()}
    assert results[0].json()["sources"][0]["doc_id"] == "Super_Bowl_50-0"
    assert {s["doc_id"] for s in results[-1].json()["sources"]} <= scifact_ids


@pytest.mark.sglang
def test_redis_down_and_back(tiny_service: ServiceFactory, tmp_path: Path) -> None:
    port = free_port()
    command = ["redis-server", "--port", str(port), "--save", "", "--appendonly", "no"]

    def start_redis() -> subprocess.Popen[bytes]:
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, cwd=tmp_path)
        for _ in range(100):
            if subprocess.run(["redis-cli", "-p", str(port), "ping"], capture_output=True).stdout:
                return process
            time.sleep(0.05)
        raise AssertionError("redis-server did not start")

    redis = start_redis()
    settings: dict[str, Any] = {
        "redis_url": f"redis://127.0.0.1:{port}/0",
        "redis_prefix": f"test-{uuid.uuid4().hex[:8]}:",
    }
    try:
        with tiny_service(**settings) as url:

            def state() -> tuple[str, str]:
                ready = httpx.get(f"{url}/readyz", timeout=10).json()["redis"]
                snapshot = httpx.get(f"{url}/dashboard/snapshot", timeout=10).json()
                return ready, snapshot["source"]

            assert _ask(url).status_code == 200
            assert state() == ("up", "redis")
            redis.kill()
            redis.wait()
            started = time.perf_counter()
            assert _ask(url).status_code == 200  # answered without Redis
            assert time.perf_counter() - started < 5
            ready, source = state()
            assert ready.startswith("down: ")
            assert source == "memory"
            redis = start_redis()
            time.sleep(1.1)  # the link tries again after a second
            assert _ask(url).status_code == 200
            assert state() == ("up", "redis")
    finally:
        redis.kill()
        redis.wait()


def _serve(
    index: Path, sglang: str, tmp_path: Path, **settings: str
) -> tuple[subprocess.Popen[bytes], str]:
    """`answer-service serve` as its own process, once it is ready; `settings` are ANSWER_*
    variables without the prefix."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSWER_")}
    env.update(ANSWER_RERANKER_MODEL="", ANSWER_ANSWER_CACHE_TTL_S="0")
    # Generated answers from passages, as the service factory's tests get (SERVICE_DEFAULTS).
    env.update(ANSWER_MODE="passages", ANSWER_ABSTAIN_BELOW="0", ANSWER_PLANNER="priors")
    env.update({f"ANSWER_{name.upper()}": value for name, value in settings.items()})
    script = Path(sys.executable).with_name("answer-service")
    command = [str(script), "serve", "--index", str(index), "--port", str(port)]
    process = subprocess.Popen(
        [*command, "--sglang-url", sglang],
        env=env,
        stdout=(tmp_path / "service.log").open("w"),
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):  # until it listens (loading the embedder takes seconds)
        with contextlib.suppress(httpx.ConnectError):
            wait_ready(url)
            return process, url
        if process.poll() is not None:
            raise AssertionError((tmp_path / "service.log").read_text())
        time.sleep(0.1)
    process.kill()
    process.wait()
    raise AssertionError("the service did not become ready in 60 s")


@pytest.mark.sglang
def test_a_graceful_shutdown_finishes_the_answers_under_way(
    tiny_sglang: SGLangServer, squad_index: Path, tmp_path: Path
) -> None:
    # Random weights seldom stop: 600 tokens are about two seconds of answer.
    # A long answer under way (the loop guard off: random weights loop, and it would end it).
    process, url = _serve(
        squad_index, tiny_sglang.url, tmp_path, max_new_tokens="600", loop_guard="false"
    )
    try:
        body = {"query": QUESTION, "ttft_budget_ms": 10_000, "top_k": 2}
        with httpx.stream("POST", f"{url}/v1/answer", json=body, timeout=30) as response:
            lines = response.iter_lines()
            seen: list[str] = []
            for line in lines:
                seen.append(line)
                if line == "event: token":
                    process.send_signal(signal.SIGTERM)  # mid-answer
                    break
            seen += list(lines)
        events = parse_sse("\n".join(seen) + "\n")
        assert events[-1].event == "done"
        done = events[-1].data
        assert done["outcome"] == "ok"
        assert done["finish_reason"] in {"stop", "length"}  # the whole answer, not cut short
        assert 1 < [e.event for e in events].count("token") <= done["completion_tokens"] <= 600
        # uvicorn drains, shuts the app down, then re-raises the signal it caught.
        assert process.wait(timeout=20) in (0, -signal.SIGTERM)
        log = (tmp_path / "service.log").read_text()
        assert "Finished server process" in log
        assert "Traceback" not in log
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def _response(conn: socket.socket) -> bytes:
    """One whole HTTP/1.1 response with a Content-Length (b"" if the server closed)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        chunk = conn.recv(65536)
        if not chunk:
            break
        body += chunk
    return head + b"\r\n\r\n" + body


@pytest.mark.sglang
def test_an_idle_keep_alive_connection_outlives_the_clients_pool_expiry(
    tiny_sglang: SGLangServer, squad_index: Path, tmp_path: Path
) -> None:
    """A client (httpx, a proxy's pool) drops its idle connections after ~5 s; a server that
    closes them at the same 5 s races it: a request sent as the server closes fails with a
    read error before any response (seen in the soak when the process stalled). The service
    keeps idle connections longer than such pools, so they close first."""
    process, url = _serve(squad_index, tiny_sglang.url, tmp_path)
    request = b"GET /healthz HTTP/1.1\r\nHost: service\r\n\r\n"
    try:
        port = int(url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
            conn.sendall(request)
            assert _response(conn).startswith(b"HTTP/1.1 200")
            time.sleep(6.5)  # idle past httpx's and uvicorn's default 5 s
            conn.sendall(request)
            assert _response(conn).startswith(b"HTTP/1.1 200")
    finally:
        process.terminate()
        process.wait(timeout=20)


def test_a_worker_lost_is_routed_around(
    service: ServiceFactory, chatml_tokenizer_dir: Path
) -> None:
    """Two SGLang workers the service routes over itself; one goes away (its port closed). A
    request sent to it is sent again to the other, before any event: none fails."""
    alive = FakeSGLangState(model_path=str(chatml_tokenizer_dir))
    doomed = FakeSGLangState(model_path=str(chatml_tokenizer_dir))
    with contextlib.ExitStack() as stack:
        first = stack.enter_context(serve_in_thread(create_fake_sglang(alive)))
        lost = contextlib.ExitStack()
        second = lost.enter_context(serve_in_thread(create_fake_sglang(doomed)))
        with service(sglang_workers=[first, second], sglang_routing="round_robin") as url:
            assert [_ask(url).status_code for _ in range(2)] == [200, 200]
            assert (len(alive.requests), len(doomed.requests)) == (1, 1)
            lost.close()  # the second worker is gone
            answers = [_ask(url) for _ in range(4)]
            ready = httpx.get(f"{url}/readyz", timeout=10)
    assert [r.status_code for r in answers] == [200] * 4
    assert all(r.json()["done"]["outcome"] == "ok" for r in answers)
    assert len(alive.requests) == 5
    assert ready.status_code == 200  # one worker of two is enough to answer


def test_a_worker_lost_behind_a_router_is_asked_for_again(
    service: ServiceFactory, fake: tuple[str, FakeSGLangState]
) -> None:
    """One URL, a router's: when the worker it chose is gone it answers 500
    `call_upstream_request_error` and passes that worker over from then on
    (test_sglang_router.py kills a real one). The service asks the router once more, before
    any event, so the answer does not fail."""
    sglang_url, state = fake
    state.mode = "router_lost_once"
    with service(sglang_url=sglang_url, abstain_below=0) as url:
        answer = _ask(url)

    assert answer.status_code == 200
    assert answer.json()["done"]["outcome"] == "ok"
    assert len(state.requests) == 2


def test_a_router_losing_worker_after_worker_is_asked_once_more_only(
    service: ServiceFactory, fake: tuple[str, FakeSGLangState]
) -> None:
    sglang_url, state = fake
    state.mode = "router_lost"
    with service(sglang_url=sglang_url, abstain_below=0) as url:
        answer = _ask(url)

    assert answer.status_code == 503
    assert answer.headers["retry-after"] == "1"
    message = answer.json()["error"]["message"]
    assert "lost the worker" in message
    assert "127.0.0.1" not in message  # neither the router's address nor its worker's
    assert "http" not in message
    assert len(state.requests) == 2
