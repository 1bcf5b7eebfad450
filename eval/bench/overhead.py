"""What the service adds before the model's first token, against a Haystack 2.x RAG pipeline
over the same SGLang, side by side in one run (issue 43's peer benchmark).

    python -m eval.bench.overhead --out docs/benchmarks/overhead.json [--questions 70]

Both ask SGLang (SmolLM2 on the CPU, started here) through one pass-through proxy, a process of
its own (this module with `--proxy`), which keeps the last generation body it forwarded and
times it from its arrival to its first streamed text: SGLang's own time to first token for that
very request. Per question, in turn (which goes first alternates by question), SGLang's prefix
cache flushed before each:
- `service`: `POST /v1/answer` streamed (`answer-service serve`, planner off, `passages` over
  the top 5, no reranker, no answer cache): the client's time to the first `token` event;
- `haystack`: SentenceTransformersTextEmbedder -> InMemoryEmbeddingRetriever (top 5) ->
  ChatPromptBuilder -> OpenAIChatGenerator (SGLang's `/v1`, streamed), the same MiniLM files
  and passages: the time from `Pipeline.run` to the first streamed text;
- each followed by `*_direct`: the identical generation body replayed at once, as a check.
An arm's overhead (`overhead_ms`) is its time to first token less SGLang's for the same request
(`*_sglang`): everything before and after the model that is not the model, whatever the two
prompts' lengths, without the prefill's run-to-run spread; `overhead_vs_replay_ms` subtracts
the replay's instead (the spread stays in it). Only questions both sent to the model count
(an abstention has no generation to compare). The questions are SQuAD's planner-training part
(shared data); the index holds the SQuAD dev passages.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import shlex
import statistics
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import httpx

from eval.commands.main import index_of
from eval.lib.data import SQUAD_DIR, shared, squad_part_of
from eval.lib.load_engine import DedicatedClients, LoadConfig, RequestSlot, send_request
from eval.lib.questions import Question, read_questions
from eval.lib.results import write_result
from eval.lib.stack import ServiceProcess, SGLangStack, free_port, service_environment
from generation.server.process_group import PidFileProcess
from retrieval.embedder import (
    DEFAULT_EMBEDDER,
    EmbedderConfig,
    SentenceTransformerEmbedder,
    resolve_model_path,
)

TOP_K = 5
MAX_TOKENS = 16  # the first token is what is timed; a short answer keeps each arm quick
SYSTEM = "Answer the question from the numbered sources only, citing them as [n]."
TEMPLATE = (
    "{% for doc in documents %}[{{ loop.index }}] {{ doc.meta['title'] }}: {{ doc.content }}\n"
    "{% endfor %}\nQuestion: {{ query }}"
)
GENERATION_PATHS = ("/generate", "/v1/chat/completions")


def streamed_text(line: bytes | str) -> str:
    """The text a `data:` line of SGLang's stream adds (`/generate` or the chat API's)."""
    line = line.decode() if isinstance(line, bytes) else line
    if not line.startswith("data:") or line[5:].strip() == "[DONE]":
        return ""
    chunk = json.loads(line[5:])
    choices = chunk.get("choices") or []
    return str(
        chunk.get("text") or "".join((c.get("delta") or {}).get("content") or "" for c in choices)
    )


def proxy_app(upstream: str) -> Any:
    """A pass-through to `upstream` that keeps the last generation body and times it from its
    arrival to its first streamed text: SGLang's own time to first token for that very request
    (`GET /_last`)."""
    from starlette.applications import Starlette
    from starlette.background import BackgroundTask
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response, StreamingResponse
    from starlette.routing import Route

    http = httpx.AsyncClient(base_url=upstream, timeout=None, trust_env=False)
    last: dict[str, Any] = {"count": 0, "path": "", "body": None, "ttft_ms": None}

    async def timed(chunks: AsyncIterator[bytes], arrived_s: float) -> AsyncIterator[bytes]:
        pending = b""
        async for chunk in chunks:
            if last["ttft_ms"] is None:
                *lines, pending = (pending + chunk).split(b"\n")
                if any(streamed_text(line) for line in lines):
                    last["first_s"] = time.perf_counter()
                    last["ttft_ms"] = (last["first_s"] - arrived_s) * 1000.0
            yield chunk

    async def forward(request: Request) -> Response:
        arrived_s = time.perf_counter()
        path = request.url.path
        if path == "/_last":
            return JSONResponse(last)
        body = await request.body()
        generation = request.method == "POST" and path in GENERATION_PATHS
        if generation:
            last.update(
                count=last["count"] + 1,
                path=path,
                body=json.loads(body),
                arrived_s=arrived_s,
                ttft_ms=None,
            )
        headers = {k: v for k, v in request.headers.items() if k in ("content-type",)}
        upstream_request = http.build_request(
            request.method, path, params=request.query_params, content=body, headers=headers
        )
        response = await http.send(upstream_request, stream=True)
        chunks = response.aiter_raw()
        return StreamingResponse(
            timed(chunks, arrived_s) if generation else chunks,
            status_code=response.status_code,
            media_type=response.headers.get("content-type"),
            background=BackgroundTask(response.aclose),
        )

    return Starlette(routes=[Route("/{path:path}", forward, methods=["GET", "POST"])])


async def flush(http: httpx.AsyncClient, url: str) -> None:
    """Empty SGLang's prefix cache; it answers 400 while a request (an abort's tail) runs."""
    for _ in range(200):
        if (await http.post(f"{url}/flush_cache")).status_code == 200:
            return
        await asyncio.sleep(0.02)
    raise RuntimeError("SGLang would not flush its cache")


async def last_body(http: httpx.AsyncClient, proxy: str) -> dict[str, Any]:
    return dict((await http.get(f"{proxy}/_last")).json())


async def replay_ttft_ms(
    http: httpx.AsyncClient, proxy: str, path: str, body: dict[str, Any]
) -> float:
    """The body sent again as it was (a new rid); its time to the first streamed text."""
    body = {**body, **({"rid": uuid.uuid4().hex} if "rid" in body else {})}
    started = time.perf_counter()
    async with http.stream("POST", f"{proxy}{path}", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if streamed_text(line):
                return (time.perf_counter() - started) * 1000.0
    raise RuntimeError(f"no text streamed for a replay of {path}")


class Haystack:
    """The peer: Haystack's query pipeline over the same passages and MiniLM files, each
    component's run timed."""

    def __init__(self, passages: Path, proxy: str, model: str) -> None:
        from haystack import Document, Pipeline
        from haystack.components.builders import ChatPromptBuilder
        from haystack.components.embedders import (
            SentenceTransformersDocumentEmbedder,
            SentenceTransformersTextEmbedder,
        )
        from haystack.components.generators.chat import OpenAIChatGenerator
        from haystack.components.retrievers.in_memory import InMemoryEmbeddingRetriever
        from haystack.dataclasses import ChatMessage
        from haystack.document_stores.in_memory import InMemoryDocumentStore
        from haystack.utils import ComponentDevice, Secret

        minilm: dict[str, Any] = {
            "model": resolve_model_path(DEFAULT_EMBEDDER),
            "device": ComponentDevice.from_str("cpu"),
            "normalize_embeddings": True,
            "local_files_only": True,
            "progress_bar": False,
        }
        documents = [
            Document(id=r["_id"], content=r["text"], meta={"title": r.get("title", "")})
            for r in map(json.loads, passages.read_text(encoding="utf-8").splitlines())
        ]
        writer = SentenceTransformersDocumentEmbedder(**minilm)
        writer.warm_up()
        store = InMemoryDocumentStore()
        store.write_documents(writer.run(documents)["documents"])
        self.first_text_s: float | None = None
        self.started_s = 0.0
        self.stages_ms: dict[str, float] = {}
        self.pipeline = Pipeline()
        components: dict[str, Any] = {
            "embedder": SentenceTransformersTextEmbedder(**minilm),
            "retriever": InMemoryEmbeddingRetriever(store, top_k=TOP_K),
            "prompt": ChatPromptBuilder(
                template=[ChatMessage.from_system(SYSTEM), ChatMessage.from_user(TEMPLATE)],
                required_variables=["documents", "query"],
            ),
            "llm": OpenAIChatGenerator(
                api_key=Secret.from_token("none"),
                model=model,
                api_base_url=f"{proxy}/v1",
                streaming_callback=self._chunk,
                generation_kwargs={"max_tokens": MAX_TOKENS, "temperature": 0.0},
            ),
        }
        for name, component in components.items():
            self._timed(name, component)
            self.pipeline.add_component(name, component)
        self.pipeline.connect("embedder.embedding", "retriever.query_embedding")
        self.pipeline.connect("retriever.documents", "prompt.documents")
        self.pipeline.connect("prompt.prompt", "llm.messages")
        self.pipeline.warm_up()

    def _timed(self, name: str, component: Any) -> None:
        call = component.run

        def run(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return call(*args, **kwargs)
            finally:
                self.stages_ms[name] = (time.perf_counter() - started) * 1000.0

        component.run = run

    def _chunk(self, chunk: Any) -> None:
        if chunk.content and self.first_text_s is None:
            self.first_text_s = time.perf_counter()

    def ttft_ms(self, query: str) -> float:
        self.first_text_s, self.stages_ms = None, {}
        self.started_s = started = time.perf_counter()
        self.pipeline.run({"embedder": {"text": query}, "prompt": {"query": query}})
        if self.first_text_s is None:
            raise RuntimeError("Haystack streamed no text")
        return (self.first_text_s - started) * 1000.0


def questions_of(count: int, seed: int) -> list[Question]:
    every = read_questions(shared(SQUAD_DIR / "questions.jsonl"))
    part = [
        q
        for q in every
        if q.answers and squad_part_of(q.gold_passage_id or "") == "planner_training"
    ]
    return random.Random(seed).sample(part, count)


async def measure(
    args: argparse.Namespace, service: str, proxy: str, peer: Haystack
) -> list[dict[str, Any]]:
    config = LoadConfig(service, 0.0, ttft_budget_ms=10_000, top_k=TOP_K, answer_mode="passages")
    clients = DedicatedClients(config)
    rows: list[dict[str, Any]] = []
    async with httpx.AsyncClient(timeout=60.0, trust_env=False) as http:
        for number, question in enumerate(questions_of(args.questions, args.seed)):
            row: dict[str, Any] = {"question_id": question.question_id}
            pairs = ("service", "haystack") if number % 2 == 0 else ("haystack", "service")
            for arm in pairs:
                await flush(http, proxy)
                before = (await last_body(http, proxy))["count"]
                if arm == "service":
                    slot = RequestSlot(question, time.perf_counter())
                    record = await send_request(clients, config, slot)
                    started_s = slot.level_start_s + record.start_offset_s
                    row.update(
                        service=record.client_ttft_ms,
                        # The service's own clock, from its deadline's start (after HTTP in).
                        service_server_ttft=record.server_ttft_ms,
                        form=record.form,
                        service_stages_ms=dict(record.stages_ms),
                        service_prompt_tokens=record.prompt_tokens,
                        service_wasted_tokens=record.wasted_prefill_tokens or 0,
                    )
                else:
                    # Haystack's pipeline blocks; nothing else runs on this loop meanwhile (the
                    # proxy and the service are processes of their own).
                    row["haystack"] = peer.ttft_ms(question.question)
                    row["haystack_stages_ms"] = dict(peer.stages_ms)
                    started_s = peer.started_s
                sent = await last_body(http, proxy)
                # No model, nothing to time (an abstention's prompt sent ahead was aborted).
                aborted = arm == "service" and row.get("form") == "abstain"
                if sent["count"] == before or row[arm] is None or aborted:
                    continue
                row[f"{arm}_sglang"] = sent["ttft_ms"]
                # One clock for all processes (CLOCK_MONOTONIC): the overhead's two sides.
                row[f"{arm}_before_sglang"] = (sent["arrived_s"] - started_s) * 1000.0
                row[f"{arm}_after_sglang"] = (
                    started_s + row[arm] / 1000.0 - sent["first_s"]
                ) * 1000.0
                await flush(http, proxy)
                row[f"{arm}_direct"] = await replay_ttft_ms(http, proxy, sent["path"], sent["body"])
            rows.append(row)
            print(json.dumps(row), flush=True)
    await clients.aclose()
    return rows


def _stats(values: Sequence[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "median": round(statistics.median(ordered), 2),
        "p90": round(ordered[int(0.9 * (len(ordered) - 1))], 2),
        "mean": round(statistics.fmean(ordered), 2),
    }


def summarize(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Overhead per arm over the questions both sent to the model: against SGLang's time for
    the same request at the proxy, and against the replay of its body."""
    arms = ("service", "haystack")
    served = [r for r in rows if all(r.get(f"{arm}_sglang") is not None for arm in arms)]

    def over(arm: str, base: str) -> dict[str, float]:
        return _stats([r[arm] - r[f"{arm}_{base}"] for r in served])

    overhead = {arm: over(arm, "sglang") for arm in arms}
    stages = {
        arm: {
            s: round(statistics.median(r[f"{arm}_stages_ms"].get(s, 0.0) for r in served), 2)
            for s in sorted({s for r in served for s in r[f"{arm}_stages_ms"]})
        }
        for arm in arms
    }
    return {
        "questions": len(rows),
        "model_served": len(served),
        "forms": dict(Counter(str(r.get("form")) for r in rows)),
        # The service's prompts sent ahead of an abstention and aborted, against all it sent.
        "wasted_prefill_tokens": sum(r.get("service_wasted_tokens", 0) for r in rows),
        "prompt_tokens": sum(r.get("service_prompt_tokens") or 0 for r in rows),
        "overhead_ms": overhead,
        "haystack_over_service_median": round(
            overhead["haystack"]["median"] / max(overhead["service"]["median"], 1e-9), 2
        ),
        "overhead_vs_replay_ms": {arm: over(arm, "direct") for arm in arms},
        # Its two sides: before the body reaches SGLang's door, after its first text leaves.
        "before_sglang_ms": {
            arm: _stats([r[f"{arm}_before_sglang"] for r in served]) for arm in arms
        },
        "after_sglang_ms": {
            arm: _stats([r[f"{arm}_after_sglang"] for r in served]) for arm in arms
        },
        "ttft_ms": {
            f"{arm}{part}": _stats([r[f"{arm}{part}"] for r in served])
            for arm in arms
            for part in ("", "_sglang", "_direct")
        },
        "stage_p50_ms": stages,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    scratch = Path(tempfile.mkdtemp(prefix="overhead-"))
    passages = shared(SQUAD_DIR / "passages.jsonl")
    index_dir = index_of(passages, args.index, SentenceTransformerEmbedder(EmbedderConfig()))
    stack = SGLangStack(scratch, 16384, None)
    proxy = PidFileProcess("proxy", scratch / "proxy.pid", scratch / "proxy.log", b"overhead")
    service: ServiceProcess | None = None
    try:
        sglang = stack.url()
        port = free_port()
        command = [
            sys.executable,
            "-m",
            "eval.bench.overhead",
            "--proxy",
            sglang,
            "--port",
            str(port),
        ]
        proxy.spawn(command, dict(os.environ))
        proxy_url = f"http://127.0.0.1:{port}"
        proxy.wait_ready(lambda _: _answers(f"{proxy_url}/_last"), 60.0)
        env = service_environment(
            None,
            {"ANSWER_PLANNER": "false", "ANSWER_MODE": "passages", "ANSWER_RERANKER_MODEL": ""},
            {"ANSWER_MAX_NEW_TOKENS": str(MAX_TOKENS), **dict(args.service_env)},
        )
        service = ServiceProcess(
            "overhead",
            port=free_port(),
            index_dir=index_dir,
            sglang_url=proxy_url,
            env=env,
            scratch=scratch,
        )
        url = service.start(needs_reranker=False)
        model = httpx.get(f"{sglang}/v1/models", timeout=10).json()["data"][0]["id"]
        peer = Haystack(passages, proxy_url, model)
        for question in questions_of(args.warmup, args.seed + 1):  # never measured
            peer.ttft_ms(question.question)
            httpx.post(f"{url}/v1/answer", json={"query": question.question}, timeout=60)
        rows = asyncio.run(measure(args, url, proxy_url, peer))
    finally:
        if service is not None:
            service.stop()
        proxy.stop()
        stack.close()
    metrics = summarize(rows)
    write_result(
        args.out,
        "overhead",
        {
            "command_line": args.command_line,
            "top_k": TOP_K,
            "max_tokens": MAX_TOKENS,
            "service_env": dict(args.service_env),
            "machine": _machine(),
            "seed": args.seed,
        },
        {
            "questions_file": str(SQUAD_DIR / "questions.jsonl"),
            "part": "planner_training",
            "passages": str(passages),
        },
        metrics,
        {"rows": rows},
    )
    return metrics


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2.0).status_code == 200
    except httpx.HTTPError:
        return False


def _machine() -> dict[str, Any]:
    cpuinfo = Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines()
    model = next((ln.split(":", 1)[1].strip() for ln in cpuinfo if ln.startswith("model name")), "")
    flags = next((ln.split(":", 1)[1].split() for ln in cpuinfo if ln.startswith("flags")), [])
    return {
        "cpu": model or platform.processor(),
        "cores": len([ln for ln in cpuinfo if ln.startswith("processor")]),
        "amx_bf16": "amx_bf16" in flags,
        "avx512f": "avx512f" in flags,
    }


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=Path("overhead.json"))
    parser.add_argument("--questions", type=int, default=70)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--seed", type=int, default=43)
    parser.add_argument(
        "--index", type=Path, help="an index of the SQuAD dev passages (else built)"
    )
    parser.add_argument(
        "--service-env", type=lambda t: tuple(t.split("=", 1)), action="append", default=[]
    )
    parser.add_argument("--proxy", help=argparse.SUPPRESS)  # run as the proxy to this upstream
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    if args.proxy:
        import uvicorn

        uvicorn.run(proxy_app(args.proxy), host="127.0.0.1", port=args.port, log_level="warning")
        return 0
    args.command_line = shlex.join([".venv/bin/python", "-m", "eval.bench.overhead", *argv])
    print(json.dumps(run(args), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
