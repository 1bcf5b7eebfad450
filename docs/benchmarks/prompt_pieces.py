"""The prompt stage's cost with five passages: rendered and counted whole against made of cached
pieces (`generation.prompt_layout.PromptAssembler`), side by side in one run.

    python docs/benchmarks/prompt_pieces.py --out docs/benchmarks/prompt-pieces.json

SmolLM2's chat template and tokenizer (the demo's model, from `answer-service sglang setup`),
the demo corpus's passages chunked as the service chunks them, five drawn per request from a
pool of 60 (so passages recur, as popular ones do on a real load; a passage seen for the first
time is tokenized once), the worked example on, the cache-aware layout with a prefix tree per
arm. The arms alternate request by request; each request's two prompts must be the same text
with the same token count, or the run stops. Lives here, not in eval/bench/, because eval/ is at
its 7,000-line limit.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import time
from pathlib import Path

import numpy as np

from generation.prefix_order import PrefixTree
from generation.prompt_layout import ContextPassage, HFChatTemplate, PromptAssembler, build_prompt
from generation.server.env import ensure_smollm2_model
from retrieval.embedder import EmbedderConfig, SentenceTransformerEmbedder
from retrieval.ingest.source import open_source
from retrieval.passage import ChunkingConfig, split_document

CORPUS = Path("answer_service/demo_corpus/postgresql-15-docs.jsonl.gz")
CACHE = Path.home() / ".cache" / "answer-service"
POOL, PER_PROMPT, REQUESTS, WARM = 60, 5, 400, 20


def _pool(rng: random.Random) -> list[ContextPassage]:
    spanner = SentenceTransformerEmbedder(EmbedderConfig(device="cpu"))
    spanner.warm_up()
    documents = list(open_source([CORPUS]).documents())
    rng.shuffle(documents)
    passages: list[ContextPassage] = []
    for document in documents[:POOL]:
        chunk = next(iter(split_document(document, spanner, ChunkingConfig())))
        passages.append(ContextPassage(0, chunk.passage_id, chunk.title, chunk.text))
    return passages


def _stats(times: list[float]) -> dict[str, float]:
    kept = np.array(times[WARM:])
    return {
        "median_ms": round(float(np.median(kept)), 3),
        "p90_ms": round(float(np.percentile(kept, 90)), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    rng = random.Random(0)
    template = HFChatTemplate(str(ensure_smollm2_model(CACHE)))
    template.warm_up()
    pool = _pool(rng)
    assemblers = {"whole": PromptAssembler(template), "pieces": PromptAssembler(template)}
    assemblers["pieces"].warm_up()
    assert assemblers["pieces"].pieced, "SmolLM2's template should be made of pieces"
    assemblers["whole"]._pieced = False  # the earlier path: render and count the whole text
    trees = {arm: PrefixTree() for arm in assemblers}
    times: dict[str, list[float]] = {arm: [] for arm in assemblers}
    tokens = []
    for n in range(REQUESTS):
        passages = rng.sample(pool, PER_PROMPT)
        question = f"How do I give a role read-only access to schema number {n}?"
        prompts = {}
        for arm in ("whole", "pieces") if n % 2 else ("pieces", "whole"):
            started = time.perf_counter()
            prompts[arm] = build_prompt(
                question,
                passages,
                assemblers[arm],
                max_prompt_tokens=1800,
                layout="cache_aware",
                tree=trees[arm],
                example=True,
            )
            times[arm].append((time.perf_counter() - started) * 1000)
        whole, pieces = prompts["whole"], prompts["pieces"]
        assert (whole.text, whole.prompt_tokens) == (pieces.text, pieces.prompt_tokens), n
        tokens.append(whole.prompt_tokens)
    result = {
        "commit": subprocess.check_output(
            ["git", "rev-parse", "--short", "HEAD"], text=True
        ).strip(),
        "command": "python docs/benchmarks/prompt_pieces.py --out docs/benchmarks/prompt-pieces.json",
        "machine": {"cpus": os.cpu_count(), "load_avg_1m_at_end": os.getloadavg()[0]},
        "config": {
            "passages_per_prompt": PER_PROMPT,
            "pool": POOL,
            "requests": REQUESTS,
            "warm_up_requests_dropped": WARM,
            "example": True,
            "layout": "cache_aware",
            "prompt_tokens_median": int(np.median(tokens)),
        },
        "arms": {arm: _stats(values) for arm, values in times.items()},
        "same_text_and_tokens": True,
    }
    result["speedup_median"] = round(
        result["arms"]["whole"]["median_ms"] / result["arms"]["pieces"]["median_ms"], 1
    )
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result["arms"]), "speedup", result["speedup_median"])


if __name__ == "__main__":
    main()
