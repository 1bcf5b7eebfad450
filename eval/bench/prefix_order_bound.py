"""What the passage order can do for prefix reuse on the prefix-reuse workload, without a model:
the prefix-reuse benchmark's Zipf stream is retrieved with the service's retriever, and each
layout's prompts are replayed against a radix cache that forgets nothing, at passage
granularity (a prompt reuses the system prompt, then each passage while its sequence so far
was sent before, and the question too when the whole prompt was).

    python -m eval.bench.prefix_order_bound --out docs/benchmarks/prefix-order-bound.json

Per layout (relevance, stable, cache-aware, cache-aware with adoption): the share of prompt
tokens the cache would serve over the stream and from `--warm-up` on. And the bound on order
alone: for how many requests some order of the same passages would have reused more than the
cache-aware order did (every order tried), and how many tokens that would have saved.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from budget import Deadline
from eval.bench.prefix_reuse import BENCH_INDEX, DATA, WorkItem, workload_topics, zipf_workload
from generation.prefix_order import PrefixTree, PromptLayout, order_ids
from generation.prompt_layout import SYSTEM_PROMPT, ContextPassage, HFChatTemplate, render_passage
from generation.server.launch import SGLangServerConfig, ensure_smollm2_model
from retrieval.embedder import EmbedderConfig, SentenceTransformerEmbedder
from retrieval.passage import Passage
from retrieval.retriever import Retriever


@dataclass(frozen=True, slots=True)
class Retrieved:
    question: str
    passage_ids: tuple[str, ...]  # best first


class Replay:
    """A radix cache over passage sequences that forgets nothing."""

    def __init__(self, tokens: dict[str, int], system_tokens: int, question_tokens: int) -> None:
        self._tokens = tokens
        self._system = system_tokens
        self._question = question_tokens
        self._sent: set[tuple[str, ...]] = set()
        self._asked: set[tuple[tuple[str, ...], str]] = set()

    def reusable(self, order: Sequence[str], question: str) -> int:
        reused = self._system
        for n in range(1, len(order) + 1):
            if tuple(order[:n]) not in self._sent:
                break
            reused += self._tokens[order[n - 1]]
        if (tuple(order), question) in self._asked:
            reused += self._question
        return reused

    def total(self, order: Sequence[str]) -> int:
        return self._system + sum(self._tokens[pid] for pid in order) + self._question

    def send(self, order: Sequence[str], question: str) -> None:
        self._sent.update(tuple(order[:n]) for n in range(1, len(order) + 1))
        self._asked.add((tuple(order), question))


def replay(
    stream: Sequence[Retrieved],
    tokens: dict[str, int],
    system_tokens: int,
    layout: PromptLayout,
    *,
    top_k: int,
    adopt: int = 0,
    warm_up: int = 0,
    question_tokens: int = 20,
) -> dict[str, Any]:
    cache = Replay(tokens, system_tokens, question_tokens)
    tree = PrefixTree()
    totals = [0, 0, 0, 0]  # prompt, reused; the same from warm_up on
    beaten = saved = 0
    for n, request in enumerate(stream):
        order = list(
            order_ids(request.passage_ids, layout, tree, limit=top_k, adopt=adopt).passage_ids
        )
        reused = cache.reusable(order, request.question)
        if layout == "cache_aware" and not adopt:
            best = max(
                cache.reusable(other, request.question) for other in itertools.permutations(order)
            )
            beaten += best > reused
            saved += best - reused
        tree.insert(order)
        cache.send(order, request.question)
        total = cache.total(order)
        totals[0] += total
        totals[1] += reused
        if n >= warm_up:
            totals[2] += total
            totals[3] += reused
    result: dict[str, Any] = {
        "cached_token_share": round(totals[1] / totals[0], 4),
        "cached_token_share_after_warm_up": round(totals[3] / totals[2], 4) if totals[2] else None,
    }
    if layout == "cache_aware" and not adopt:
        result["requests_another_order_reuses_more"] = beaten
        result["tokens_another_order_would_reuse"] = saved
    return result


async def _retrieve(
    retriever: Retriever, items: Sequence[WorkItem], depth: int
) -> tuple[list[Retrieved], dict[str, Passage]]:
    stream: list[Retrieved] = []
    passages: dict[str, Passage] = {}
    for item in items:
        text = item.question.question
        deadline = Deadline.after_ms(60_000)
        hits = await retriever.retrieve(text, depth, deadline, mode="hybrid")
        stream.append(Retrieved(text, tuple(hit.passage.passage_id for hit in hits)))
        passages.update((hit.passage.passage_id, hit.passage) for hit in hits)
    return stream, passages


def retrieve(
    items: Sequence[WorkItem], index: Path, depth: int
) -> tuple[list[Retrieved], dict[str, Passage]]:
    """Each question's best `depth` passage ids (hybrid, as the benchmark's service), and the
    passages."""
    retriever = Retriever.open(index, SentenceTransformerEmbedder(EmbedderConfig()))
    try:
        return asyncio.run(_retrieve(retriever, items, depth))
    finally:
        retriever.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m eval.bench.prefix_order_bound", description=__doc__
    )
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument(
        "--index", type=Path, default=BENCH_INDEX, help="the prefix-reuse benchmark's index"
    )
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--warm-up", type=int, default=120)
    parser.add_argument("--zipf", type=float, default=1.1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--top-k", type=int, default=5)
    args = parser.parse_args(argv)
    items = zipf_workload(workload_topics(args.data), args.requests, args.zipf, args.seed)
    stream, passages = retrieve(items, args.index, args.top_k)
    template = HFChatTemplate(str(ensure_smollm2_model(SGLangServerConfig().cache_dir)))
    tokens = {
        pid: template.count_tokens(render_passage(ContextPassage(1, pid, p.title, p.text)))
        for pid, p in passages.items()
    }
    system_tokens = template.count_tokens(SYSTEM_PROMPT) + 10
    layouts: list[tuple[str, PromptLayout, int]] = [
        ("relevance", "relevance", 0),
        ("stable", "stable", 0),
        ("cache_aware", "cache_aware", 0),
        ("cache_aware_adopt1", "cache_aware", 1),
        ("cache_aware_adopt2", "cache_aware", 2),
    ]
    result = {
        "config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "layouts": {
            name: replay(
                stream,
                tokens,
                system_tokens,
                layout,
                top_k=args.top_k,
                adopt=adopt,
                warm_up=args.warm_up,
            )
            for name, layout, adopt in layouts
        },
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
