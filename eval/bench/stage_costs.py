"""The stage-cost table: what each retrieval knob costs in milliseconds on this machine.

Measured side by side in one run, medians and p95 over repeated single queries:
query embedding vs query length; dense search vs k and index kind and depth (flat, IVF
nprobe, HNSW efSearch) on an index grown to `--size` vectors (the real corpus's passage
vectors plus perturbed copies of them), with recall@k against exact search beside each
approximate setting; BM25; rank fusion; cross-encoder rerank vs candidates and passage
length, bf16 and fp32. The JSON is the deadline planner's prior.

    python -m eval.bench.stage_costs --index DIR --queries QUERIES.jsonl --out FILE.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any, Literal

import faiss
import numpy as np
import numpy.typing as npt

from retrieval.embedder import EmbedderConfig, SentenceTransformerEmbedder
from retrieval.index.ann import AnnConfig, SearchDepth, build_search_index, search_parameters
from retrieval.index.bm25_index import BM25Index
from retrieval.index.faiss_index import INDEX_FILE, read_manifest
from retrieval.passage import Passage, ScoredPassage
from retrieval.rerank.base import RerankerConfig, RerankRequest
from retrieval.rerank.cross_encoder import CrossEncoderReranker
from retrieval.search.fusion import reciprocal_rank_fusion

Matrix = npt.NDArray[np.float32]


@dataclass(frozen=True, slots=True)
class Cost:
    stage: str
    setting: dict[str, Any]
    p50_ms: float
    p95_ms: float
    runs: int
    recall: float | None = None


def _time(call: Callable[[], object], runs: int, warmup: int = 2) -> tuple[float, float]:
    for _ in range(warmup):
        call()
    samples = []
    for _ in range(runs):
        started = time.perf_counter()
        call()
        samples.append((time.perf_counter() - started) * 1000.0)
    samples.sort()
    return statistics.median(samples), samples[min(len(samples) - 1, int(0.95 * len(samples)))]


def _grow(vectors: Matrix, size: int, seed: int = 0) -> Matrix:
    """Real vectors plus synthetic ones up to `size` rows: each a random blend of two real
    vectors with noise, renormalised, so they spread over the region the corpus occupies
    instead of piling up as near-duplicates (which would make ANN look worse than it is)."""
    rng = np.random.default_rng(seed)
    extra = max(0, size - len(vectors))
    first = vectors[rng.integers(0, len(vectors), size=extra)]
    second = vectors[rng.integers(0, len(vectors), size=extra)]
    share = np.asarray(rng.uniform(0.3, 0.7, size=(extra, 1)), dtype=np.float32)
    blend = share * first + (1 - share) * second
    blend += np.asarray(rng.normal(scale=0.02, size=blend.shape), dtype=np.float32)
    blend /= np.linalg.norm(blend, axis=1, keepdims=True)
    return np.ascontiguousarray(np.vstack([vectors, blend]).astype(np.float32))


def _recall(found: npt.NDArray[np.int64], truth: npt.NDArray[np.int64]) -> float:
    hits = [len(set(f) & set(t)) / len(t) for f, t in zip(found, truth, strict=True)]
    return float(statistics.fmean(hits))


def dense_costs(vectors: Matrix, queries: Matrix, runs: int) -> list[Cost]:
    costs: list[Cost] = []
    flat = faiss.IndexFlatIP(vectors.shape[1])
    flat.add(vectors)
    ks = (10, 50, 100)
    truth = {k: flat.search(queries, k)[1] for k in ks}
    config = AnnConfig()
    built = {
        "ivf": build_search_index(flat, "ivf", config),
        "hnsw": build_search_index(flat, "hnsw", config),
    }
    settings: list[tuple[str, Any, SearchDepth | None]] = [("flat", flat, None)]
    settings += [("ivf", built["ivf"], SearchDepth(nprobe=n)) for n in (1, 4, 16, 64)]
    settings += [("hnsw", built["hnsw"], SearchDepth(ef_search=e)) for e in (16, 32, 64, 128)]
    for kind, index, depth in settings:
        params = search_parameters(kind, depth)  # type: ignore[arg-type]
        for k in ks:
            found = index.search(queries, k, params=params)[1]
            one = queries[:1]
            p50, p95 = _time(partial(index.search, one, k, params=params), runs)
            setting = {
                "kind": kind,
                "k": k,
                "passages": len(vectors),
                **asdict(depth or SearchDepth()),
            }
            recall = None if kind == "flat" else _recall(found, truth[k])
            costs.append(Cost("dense_search", setting, p50, p95, runs, recall))
    return costs


def embed_costs(embedder: SentenceTransformerEmbedder, runs: int) -> list[Cost]:
    costs = []
    for words in (8, 32, 96):
        text = " ".join(["postgres index vacuum planner"] * (words // 4))
        tokens = len(embedder.token_spans(text))
        p50, p95 = _time(partial(embedder.encode, [text]), runs)
        costs.append(Cost("embed_query", {"tokens": tokens}, p50, p95, runs))
    return costs


def lexical_costs(bm25: BM25Index, texts: Sequence[str], runs: int) -> list[Cost]:
    costs = []
    for k in (10, 100):
        samples = [_time(partial(bm25.search, t, k), 3, warmup=1)[0] for t in texts[:runs]]
        samples.sort()
        costs.append(
            Cost(
                "bm25",
                {"k": k, "documents": len(bm25)},
                statistics.median(samples),
                samples[int(0.95 * (len(samples) - 1))],
                len(samples),
            )
        )
    lists = [list(range(100)), list(range(99, -1, -1))]
    p50, p95 = _time(partial(reciprocal_rank_fusion, lists, limit=20), runs)
    costs.append(Cost("fusion_rrf", {"lists": 2, "depth": 100, "limit": 20}, p50, p95, runs))
    return costs


def rerank_costs(model_dir: str, runs: int) -> list[Cost]:
    costs = []
    dtypes: tuple[Literal["bfloat16", "float32"], ...] = ("bfloat16", "float32")
    for dtype in dtypes:
        reranker = CrossEncoderReranker(model_dir, RerankerConfig(dtype=dtype, max_tokens=256))
        reranker.warm_up()
        for tokens in (128, 256):
            text = " ".join(["the planner chooses an index scan"] * (tokens // 6))
            for candidates in (10, 20, 50):
                pool = [
                    ScoredPassage(Passage(f"d{i}#0", f"d{i}", 0, "", text, 0, 1), 0.0)
                    for i in range(candidates)
                ]
                p50, p95 = _time(
                    partial(reranker.rerank, RerankRequest("what does the planner do", pool, 5)),
                    max(3, runs // 10),
                    warmup=1,
                )
                costs.append(
                    Cost(
                        "rerank",
                        {"candidates": candidates, "passage_tokens": tokens, "dtype": dtype},
                        p50,
                        p95,
                        max(3, runs // 10),
                    )
                )
    return costs


def fresh_cross_encoder(target: Path) -> str:
    """A cross-encoder of the real MiniLM size with an untrained head: real cost, no quality."""
    from sentence_transformers import CrossEncoder

    from retrieval.embedder import DEFAULT_EMBEDDER, resolve_model_path

    if not (target / "config.json").is_file():
        CrossEncoder(resolve_model_path(DEFAULT_EMBEDDER), num_labels=1).save(str(target))
    return str(target)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--index", type=Path, required=True, help="an exact (flat) index dir")
    parser.add_argument("--queries", type=Path, required=True, help="JSONL with `text`")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--size", type=int, default=100_000, help="vectors in the dense index")
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--reranker", type=Path, default=Path("/tmp/stage-costs-cross-encoder"))
    args = parser.parse_args(argv)

    manifest = read_manifest(args.index)
    flat = faiss.read_index(str(args.index / INDEX_FILE))
    vectors = flat.reconstruct_n(0, flat.ntotal).astype(np.float32)
    texts = [json.loads(line)["text"] for line in args.queries.open()][: args.runs]
    embedder = SentenceTransformerEmbedder(EmbedderConfig(model=manifest.embedder))
    embedder.warm_up()
    queries = embedder.encode(texts)
    started = time.perf_counter()
    costs = embed_costs(embedder, args.runs)
    costs += dense_costs(_grow(vectors, args.size), queries, args.runs)
    costs += lexical_costs(BM25Index.load(args.index, manifest.passage_count), texts, args.runs)
    costs += rerank_costs(fresh_cross_encoder(args.reranker), args.runs)
    result = {
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "faiss": faiss.__version__,
        "index": {
            "dir": str(args.index),
            "passages": manifest.passage_count,
            "embedder": manifest.embedder,
        },
        "seconds": round(time.perf_counter() - started, 1),
        "costs": [asdict(cost) for cost in costs],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    for cost in costs:
        recall = "" if cost.recall is None else f" recall {cost.recall:.3f}"
        print(
            f"{cost.stage:13} {cost.setting} p50 {cost.p50_ms:.2f} ms p95 {cost.p95_ms:.2f} ms{recall}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
