"""What the MCP server adds to an answer: the same question through `POST /v1/answer` directly
and through the MCP `answer` tool at `/mcp`, alternated, side by side in one run.

    python docs/benchmarks/mcp_overhead.py --out docs/benchmarks/mcp-overhead.json

The service runs as `answer-service serve` does (a subprocess, uvloop and httptools) over an
index of the first 150 SQuAD passages of tests/fixtures (real MiniLM, faiss and BM25), with
the answer cache off, so every request retrieves, scores and quotes again. Answers are quotes
(`ANSWER_MODE=quote`, what the shipped SmolLM2 gets almost always): the model is not what MCP
adds to, and the fake SGLang of tests/fakes only makes the service ready. Both clients keep
their connection open; each pair runs the two in turn, the order swapped every pair, and the
added time is the pair's difference at the client (MCP's JSON-RPC, the SDK on both sides, the
in-process call to /v1/answer). Lives here, not in eval/bench/, because eval/ is at its
7,000-line limit.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

# This checkout, for the tests' fixtures and fakes and for the service it starts.
REPO_ROOT = Path(__file__).resolve().parents[2]
QUESTION = "Which NFL team represented the AFC at Super Bowl 50?"
BUDGET_MS = 3000
GOAL_ADDED_MEDIAN_MS = 5.0


def _index(root: Path) -> Path:
    from retrieval.embedder import EmbedderConfig, SentenceTransformerEmbedder
    from retrieval.index.builder import build_index
    from tests.support import SQUAD_PASSAGES, open_text

    corpus = root / "passages.jsonl"
    with open_text(SQUAD_PASSAGES) as source, corpus.open("w") as target:
        target.writelines(itertools.islice(source, 150))
    out = root / "index"
    build_index(corpus, out, SentenceTransformerEmbedder(EmbedderConfig()), progress=False)
    return out


@contextmanager
def _service(index: Path, sglang_url: str) -> Iterator[str]:
    from tests.support import free_port, wait_ready

    port = free_port()
    env = {
        **os.environ,
        "ANSWER_MODE": "quote",
        "ANSWER_ANSWER_CACHE_TTL_S": "0",
        # Planned from the priors in code: a fake SGLang has no first token worth timing.
        "ANSWER_PLANNER": "priors",
        "ANSWER_RERANKER_MODEL": "",
    }
    command = [sys.executable, "-m", "answer_service.cli.main", "serve", "--index", str(index)]
    command += ["--port", str(port), "--sglang-url", sglang_url]
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    process = subprocess.Popen(command, env=env, cwd=REPO_ROOT, **quiet)  # type: ignore[call-overload]
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while True:
            try:
                wait_ready(url, timeout_s=120)
                break
            except httpx.ConnectError:
                if time.monotonic() > deadline or process.poll() is not None:
                    raise
                time.sleep(0.5)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)


def _summary(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "median": round(statistics.median(ordered), 2),
        "p90": round(ordered[int(0.9 * (len(ordered) - 1))], 2),
        "mean": round(statistics.fmean(ordered), 2),
    }


async def _pairs(url: str, pairs: int, warm_up: int) -> dict[str, list[float]]:
    body = {"query": QUESTION, "stream": False, "ttft_budget_ms": BUDGET_MS}
    arguments = {"query": QUESTION, "budget_ms": BUDGET_MS}
    times: dict[str, list[float]] = {"direct": [], "mcp": []}
    async with (
        httpx.AsyncClient(base_url=url, timeout=60) as http,
        httpx2.AsyncClient(timeout=60) as http2,
        Client(streamable_http_client(f"{url}/mcp", http_client=http2)) as client,
    ):
        await client.list_tools()

        async def direct() -> None:
            response = await http.post("/v1/answer", json=body)
            assert response.status_code == 200, response.text
            assert response.json()["done"]["form"] == "quote"

        async def via_mcp() -> None:
            result = await client.call_tool("answer", arguments)
            assert not result.is_error, result.content
            assert result.structured_content
            assert result.structured_content["form"] == "quote"

        calls = {"direct": direct, "mcp": via_mcp}
        for n in range(warm_up + pairs):
            order = ("direct", "mcp") if n % 2 == 0 else ("mcp", "direct")
            for name in order:
                started = time.perf_counter()
                await calls[name]()
                if n >= warm_up:
                    times[name].append((time.perf_counter() - started) * 1000)
    return times


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--pairs", type=int, default=200)
    parser.add_argument("--warm-up", type=int, default=10)
    args = parser.parse_args()
    sys.path.insert(0, str(REPO_ROOT))
    from tests.conftest import CHATML, tokenizer_with_template
    from tests.fakes.fake_sglang import FakeSGLangState, create_fake_sglang
    from tests.support import serve_in_thread

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        index = _index(root)
        tokenizer = tokenizer_with_template(root / "tokenizer", CHATML)
        fake = create_fake_sglang(FakeSGLangState(model_path=str(tokenizer)))
        with serve_in_thread(fake) as sglang, _service(index, sglang) as url:
            load_before = os.getloadavg()[0]
            times = asyncio.run(_pairs(url, args.pairs, args.warm_up))
            load_after = os.getloadavg()[0]
    added = [m - d for m, d in zip(times["mcp"], times["direct"], strict=True)]
    git = {"capture_output": True, "text": True, "cwd": REPO_ROOT}
    commit = subprocess.run(["git", "rev-parse", "HEAD"], **git).stdout  # type: ignore[call-overload]
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], **git).stdout  # type: ignore[call-overload]
    out: dict[str, Any] = {
        "benchmark": "mcp_overhead",
        "commit": commit.strip() + ("-dirty" if dirty.strip() else ""),
        "command": f"python docs/benchmarks/mcp_overhead.py --out {args.out}",
        "machine": {
            "cpus": os.cpu_count(),
            "processor": platform.processor() or platform.machine(),
        },
        # Other work on the machine: the 1-minute load average as the pairs began and ended.
        "load_average": [round(load_before, 2), round(load_after, 2)],
        "question": QUESTION,
        "budget_ms": BUDGET_MS,
        "answer_form": "quote",
        "pairs": args.pairs,
        "warm_up_pairs": args.warm_up,
        "direct_ms": _summary(times["direct"]),
        "mcp_ms": _summary(times["mcp"]),
        "added_ms": _summary(added),
        "added_ratio_median": round(
            statistics.median(times["mcp"]) / statistics.median(times["direct"]), 3
        ),
        "goal_added_median_ms": GOAL_ADDED_MEDIAN_MS,
        "goal_met": statistics.median(added) <= GOAL_ADDED_MEDIAN_MS,
    }
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
