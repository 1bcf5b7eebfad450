"""The prefix-reuse benchmark: how much of the prompt SGLang serves from its cache, and what that
does to TTFT and answers, for each prompt layout and routing policy, side by side in one run.

    python -m eval.bench.prefix_reuse --out docs/benchmarks/prefix-reuse.json

Workload: questions from SQuAD v1.1 dev (open) and SciFact train drawn Zipf-distributed over
topics (a SQuAD question's topic is its gold paragraph, a SciFact claim's its first relevant
abstract), so that passages recur as they do in real traffic; every prompt carries the same
system prompt. One index holds both corpora. Every variant answers the same request sequence
with the service's own pipeline (in-process, no reranker, the planner off so that every prompt
gets `--top-k` passages), `--concurrency` requests at a time, from a flushed cache:

- `a_relevance`: one worker, passages in retrieval order.
- `b_cache_aware`: one worker, the cache-aware layout (`generation/prefix_order.py`).
- `b_cache_aware_slack2`: (b), and passages ranked 6th-7th may take the last two of the five
  places when they continue a cached prefix (`Experiment.prompt_cache_slack=2`).
- `c_router_cache_aware`: (b) over two workers behind sglang-router's `cache_aware` policy.
- `c_router_round_robin`: (b) over two workers behind sglang-router's `round_robin`.
- `c_service_prefix`: (b) over two workers, routed by the service itself by passage prefix.
- `b_cache_aware_adopt2`: (b), and up to two places may go to passages of a remembered prefix
  that another question retrieved, so that a set sharing passages with an earlier prompt but
  not its first one is still read from the cache (`Experiment.prompt_cache_adopt=2`).
- `c_router_cache_aware_adopt2`, `c_router_round_robin_adopt2`: that layout over two workers
  behind sglang-router, `cache_aware` against `round_robin`.

The first requests of a stream find every cache cold; `--warm-up N` reports the requests from
the N-th on (the steady state) beside the whole stream.

Per variant: the share of prompt tokens served from cache (summed `cached_tokens` over summed
`prompt_tokens`, as the workers reported them), TTFT p50/p95 (client side: from the request to
its first token, retrieval included), answer-string recall, exact match and F1 on the SQuAD
questions, and per worker the prompt and cached tokens (from the workers' Prometheus counters).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import random
import re
import signal
import socket
import sys
import tempfile
import time
import urllib.request
from collections import defaultdict
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from answer_service.runtime.configs import Experiment
from answer_service.runtime.settings import Settings
from eval.commands.answers import (
    AnswerRecord,
    Ask,
    Question,
    collect_answers,
    in_process_answering,
    read_questions,
    score_answers,
)
from eval.lib.checkpoint import RunCheckpoint
from eval.lib.latency_stats import percentiles
from eval.lib.paths import SHARED_DATA
from eval.lib.results import write_result
from generation.prefix_order import PromptLayout
from generation.server.launch import SGLangServer, SGLangServerConfig, ensure_smollm2_model
from generation.server.router import RouterPolicy, SGLangRouter, SGLangRouterConfig
from retrieval.embedder import EmbedderConfig, SentenceTransformerEmbedder
from retrieval.index.builder import build_index
from retrieval.judgments import read_qrels, read_queries

logger = logging.getLogger(__name__)

DATA = SHARED_DATA
SQUAD = DATA / "squad-v1.1-open"
SCIFACT = DATA / "scifact"
# Built here on first use (the workload's two corpora); eval/bench/prefix_order_bound.py reads it.
BENCH_INDEX = Path.home() / ".cache" / "answer-service" / "indexes" / "bench-squad-scifact"


@dataclass(frozen=True, slots=True)
class Variant:
    name: str
    layout: PromptLayout
    workers: int
    router: RouterPolicy | None = None
    # The service routes over the workers itself (generation/prefix_routing.py).
    service_routing: bool = False
    # Places a passage ranked just below top_k may take when it continues a cached prefix.
    cache_slack: int = 0
    # Places passages of a remembered prefix that retrieval did not offer may take.
    cache_adopt: int = 0


VARIANTS = (
    Variant("a_relevance", "relevance", 1),
    Variant("b_cache_aware", "cache_aware", 1),
    Variant("b_cache_aware_slack2", "cache_aware", 1, cache_slack=2),
    Variant("c_router_cache_aware", "cache_aware", 2, "cache_aware"),
    Variant("c_router_round_robin", "cache_aware", 2, "round_robin"),
    Variant("c_service_prefix", "cache_aware", 2, service_routing=True),
    Variant("b_cache_aware_adopt2", "cache_aware", 1, cache_adopt=2),
    Variant("c_router_cache_aware_adopt2", "cache_aware", 2, "cache_aware", cache_adopt=2),
    Variant("c_router_round_robin_adopt2", "cache_aware", 2, "round_robin", cache_adopt=2),
)


@dataclass(frozen=True, slots=True)
class WorkItem:
    question: Question
    dataset: str
    topic: str


def workload_topics(data: Path) -> dict[str, list[WorkItem]]:
    topics: dict[str, list[WorkItem]] = defaultdict(list)
    for q in read_questions(data / "squad-v1.1-open" / "questions.jsonl"):
        topic = f"squad:{q.gold_passage_id}"
        topics[topic].append(WorkItem(q, "squad", topic))
    qrels = read_qrels(data / "scifact" / "qrels" / "train.tsv")
    for query in read_queries(data / "scifact" / "queries.train.jsonl"):
        relevant = sorted(doc for doc, grade in qrels.get(query.query_id, {}).items() if grade > 0)
        if relevant:
            topic = f"scifact:{relevant[0]}"
            question = Question(query.query_id, query.text, (), relevant[0])
            topics[topic].append(WorkItem(question, "scifact", topic))
    return topics


def zipf_workload(
    topics: dict[str, list[WorkItem]], requests: int, exponent: float, seed: int
) -> list[WorkItem]:
    """`requests` items: a topic drawn with probability ~ 1/rank^exponent over a seeded random
    ranking of the topics, then a question of that topic uniformly. Ids are made unique per
    request (a question may be asked more than once)."""
    rng = random.Random(seed)
    names = sorted(topics)
    rng.shuffle(names)
    weights = [1.0 / (rank**exponent) for rank in range(1, len(names) + 1)]
    items = []
    for n, topic in enumerate(rng.choices(names, weights=weights, k=requests)):
        item = rng.choice(topics[topic])
        unique = Question(
            f"{n:05d}:{item.question.question_id}",
            item.question.question,
            item.question.answers,
            item.question.gold_passage_id,
        )
        items.append(WorkItem(unique, item.dataset, topic))
    return items


def combined_corpus(data: Path, out: Path) -> Path:
    """SQuAD's passages and the SciFact abstracts judged for a train claim, in one corpus file
    (their ids do not collide). The rest of SciFact is left out to keep the index build short
    on two cores: the workload asks only about these."""
    if out.is_file():
        return out
    judged = {
        doc
        for docs in read_qrels(data / "scifact" / "qrels" / "train.tsv").values()
        for doc in docs
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", encoding="utf-8") as target:
        for name, source in (
            ("squad", data / "squad-v1.1-open" / "passages.jsonl"),
            ("scifact", data / "scifact" / "corpus.jsonl"),
        ):
            with source.open(encoding="utf-8") as lines:
                for line in lines:
                    record = json.loads(line)
                    if name == "scifact" and record["_id"] not in judged:
                        continue
                    doc = {
                        "_id": record["_id"],
                        "title": record.get("title", ""),
                        "text": record["text"],
                    }
                    target.write(json.dumps(doc) + "\n")
    return out


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


_COUNTER = re.compile(r"^(sglang:(?:prompt|cached)_tokens_total)(?:\{[^}]*\})?\s+([0-9.eE+-]+)$")


def worker_tokens(url: str) -> dict[str, float]:
    """A worker's `sglang:prompt_tokens_total` and `sglang:cached_tokens_total` (summed over
    label sets) from its Prometheus text."""
    totals: dict[str, float] = defaultdict(float)
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
        for line in response.read().decode().splitlines():
            if match := _COUNTER.match(line):
                totals[match.group(1).removeprefix("sglang:")] += float(match.group(2))
    return dict(totals)


def _flush(urls: Sequence[str]) -> None:
    for url in urls:
        request = urllib.request.Request(f"{url}/flush_cache", method="POST")
        with urllib.request.urlopen(request, timeout=30) as response:
            response.read()


@contextmanager
def _workers(
    count: int, model_dir: Path, args: argparse.Namespace, logs: Path
) -> Iterator[list[SGLangServer]]:
    servers = [
        SGLangServer(
            SGLangServerConfig(
                port=_free_port(),
                device="cpu",
                model_dir=model_dir,
                max_total_tokens=args.max_total_tokens,
                cpu_threads=max(1, args.cpu_threads // count),
                log_path=logs / f"worker-{count}-{n}.log",
            )
        )
        for n in range(count)
    ]
    try:
        for server in servers:
            server.start()
        yield servers
    finally:
        for server in servers:
            server.stop()


async def _answer_all(
    urls: list[str],
    variant: Variant,
    items: Sequence[WorkItem],
    args: argparse.Namespace,
    model_dir: Path,
    scratch: Path,
) -> list[AnswerRecord]:
    settings = Settings(
        index_dir=args.index,
        sglang_url=urls[0],
        sglang_workers=urls if len(urls) > 1 else [],
        tokenizer=str(model_dir),
        reranker_model=None,
        answer_cache_ttl_s=0,  # the same questions again measure SGLang's cache, not ours
        # Layouts compared on the same work: the planner would give fewer passages to the
        # layout whose prompts it expects to find less cached.
        planner="off",
        max_new_tokens=args.max_new_tokens,
        default_ttft_budget_ms=args.ttft_budget_ms,
    )
    experiment = Experiment(
        prompt_layout=variant.layout,
        prompt_cache_slack=variant.cache_slack,
        prompt_cache_adopt=variant.cache_adopt,
    )
    checkpoint = RunCheckpoint(scratch / f"{variant.name}.json", {"variant": variant.name})
    try:
        async with in_process_answering(settings, experiment) as source:
            return await collect_answers(
                source,
                [item.question for item in items],
                checkpoint,
                # Prefix reuse is a property of generated answers: every request prompts.
                Ask(args.ttft_budget_ms, args.top_k, "passages"),
                concurrency=args.concurrency,
            )
    finally:
        checkpoint.finish()


def _variant_metrics(
    items: Sequence[WorkItem],
    records: Sequence[AnswerRecord],
    per_worker: dict[str, dict[str, float]] | None = None,
    seconds: float | None = None,
) -> dict[str, Any]:
    squad = [item.question for item in items if item.dataset == "squad"]
    squad_ids = {q.question_id for q in squad}
    quality = score_answers(squad, [r for r in records if r.question_id in squad_ids])
    prompt = sum(r.prompt_tokens for r in records)
    cached = sum(r.cached_tokens for r in records)
    ttfts = [r.ttft_ms for r in records if r.ttft_ms is not None]
    return {
        "cached_token_share": round(cached / prompt, 4) if prompt else None,
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "ttft_ms": percentiles(ttfts),
        # TTFT is bimodal (a prompt read from the cache or not): the mean moves with the share
        # of partial hits where the median may sit inside either mode.
        "ttft_mean_ms": round(sum(ttfts) / len(ttfts), 1) if ttfts else None,
        "answer_recall": quality["answer_recall"],
        "exact_match": quality["exact_match"],
        "f1": quality["f1"],
        "ok": sum(r.status == "ok" for r in records),
        "errored": sum(r.status != "ok" for r in records),
        **({"per_worker": per_worker} if per_worker is not None else {}),
        **({"wall_s": round(seconds, 1)} if seconds is not None else {}),
    }


def _from(items: Sequence[WorkItem], records: Sequence[AnswerRecord], first: int) -> dict[str, Any]:
    """The metrics of the requests from the `first`-th of the stream on (ids are `NNNNN:...`)."""
    kept = [r for r in records if int(r.question_id.split(":", 1)[0]) >= first]
    return {"from_request": first, **_variant_metrics(items[first:], kept)}


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Start the workers (and routers), then answer the workload once per variant. The
    orchestration blocks (process starts, cache flushes, metrics scrapes); only the answering
    runs in an event loop, one per variant."""
    items = zipf_workload(workload_topics(args.data), args.requests, args.zipf, args.seed)
    model_dir = ensure_smollm2_model(SGLangServerConfig().cache_dir)
    chosen = [v for v in VARIANTS if v.name in args.variants]
    results: dict[str, Any] = {}
    scratch = Path(tempfile.mkdtemp(prefix="prefix-reuse-"))
    for workers in sorted({v.workers for v in chosen}):
        with _workers(workers, model_dir, args, scratch) as servers:
            urls = [s.url for s in servers]
            for variant in (v for v in chosen if v.workers == workers):
                with ExitStack() as stack:
                    url = urls[0]
                    if variant.router is not None:
                        router = SGLangRouter(
                            SGLangRouterConfig(
                                worker_urls=tuple(urls),
                                port=_free_port(),
                                metrics_port=_free_port(),
                                policy=variant.router,
                                log_path=scratch / f"router-{variant.name}.log",
                            )
                        )
                        url = router.start()
                        stack.callback(router.stop)
                    _flush(urls)
                    before = {u: worker_tokens(u) for u in urls}
                    started = time.perf_counter()
                    logger.info("variant %s: %d requests via %s", variant.name, len(items), url)
                    targets = urls if variant.service_routing else [url]
                    records = asyncio.run(
                        _answer_all(targets, variant, items, args, model_dir, scratch)
                    )
                    seconds = time.perf_counter() - started
                    after = {u: worker_tokens(u) for u in urls}
                per_worker = {
                    f"worker{n}": {
                        k: after[u].get(k, 0.0) - before[u].get(k, 0.0) for k in after[u]
                    }
                    for n, u in enumerate(urls)
                }
                results[variant.name] = _variant_metrics(items, records, per_worker, seconds)
                if 0 < args.warm_up < len(items):
                    results[variant.name]["after_warm_up"] = _from(items, records, args.warm_up)
                results[variant.name]["requests"] = [asdict(r) for r in records]
                logger.info(
                    "variant %s: %s",
                    variant.name,
                    {k: v for k, v in results[variant.name].items() if k != "requests"},
                )
    return {"items": items, "results": results}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m eval.bench.prefix_reuse", description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--index", type=Path, default=BENCH_INDEX)
    parser.add_argument("--requests", type=int, default=120)
    parser.add_argument("--zipf", type=float, default=1.1, help="Zipf exponent over topics")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--top-k", type=int, default=5)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--ttft-budget-ms", type=int, default=3000)
    parser.add_argument("--max-total-tokens", type=int, default=65536, help="KV cache per worker")
    parser.add_argument("--cpu-threads", type=int, default=2, help="shared by the workers")
    parser.add_argument("--variants", default=",".join(v.name for v in VARIANTS))
    parser.add_argument(
        "--warm-up", type=int, default=0, help="also report the requests from this one on"
    )
    args = parser.parse_args(argv)
    args.variants = args.variants.split(",")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    # SIGTERM unwinds like Ctrl-C, so the SGLang workers and routers started here are stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if not (args.index / "manifest.json").is_file():
        corpus = combined_corpus(args.data, args.index.with_name(args.index.name + "-corpus.jsonl"))
        build_index(corpus, args.index, SentenceTransformerEmbedder(EmbedderConfig()))
    outcome = run(args)
    items: list[WorkItem] = outcome["items"]
    results: dict[str, Any] = outcome["results"]
    requests = {name: result.pop("requests") for name, result in results.items()}
    for window in (None, "after_warm_up"):
        measured = {
            name: result.get(window) if window else result for name, result in results.items()
        }
        baseline = (measured.get("a_relevance") or {}).get("ttft_ms", {}).get("p50")
        for result in filter(None, measured.values()):
            p50 = result["ttft_ms"]["p50"]
            result["ttft_p50_speedup_vs_a"] = round(baseline / p50, 2) if baseline and p50 else None
    write_result(
        args.out,
        "prefix-reuse-bench",
        {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        {
            "requests": len(items),
            "squad_requests": sum(i.dataset == "squad" for i in items),
            "scifact_requests": sum(i.dataset == "scifact" for i in items),
            "distinct_topics": len({i.topic for i in items}),
            "distinct_questions": len({i.question.question for i in items}),
        },
        results,
        {"requests": requests},
    )
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
