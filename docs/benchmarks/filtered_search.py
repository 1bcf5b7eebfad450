"""Filtered against unfiltered search on the demo corpus's passages, side by side in one run.

    python docs/benchmarks/filtered_search.py --out docs/benchmarks/filtered-search.json

The demo's JSONL (answer_service/demo_corpus) chunked as the service does (MiniLM's tokenizer,
200/40 tokens); its documents dealt round-robin into 10 collections, so one collection allows
~10% of the rows and five ~50%. The vectors are random unit vectors of MiniLM's 384 dimensions:
a search's cost depends on their count and dimension, not their values, and this spares the
build's minutes of embedding. BM25 is built over the real texts. Each query is timed alone (one
thread, k=10); medians in microseconds. Lives here, not in eval/bench/, because eval/ is at its
7,000-line limit.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import time
from dataclasses import replace
from functools import partial
from pathlib import Path

import faiss
import numpy as np

from retrieval.embedder import EmbedderConfig, SentenceTransformerEmbedder
from retrieval.index.ann import AnnConfig, build_search_index
from retrieval.index.bm25_index import BM25Config, BM25Index
from retrieval.index.faiss_index import FaissIndex, IndexManifest
from retrieval.index.vector_search import RowSet
from retrieval.ingest.source import open_source
from retrieval.passage import ChunkingConfig, split_document
from retrieval.search.filters import FilterTable, PassageFilter

CORPUS = Path("answer_service/demo_corpus/postgresql-15-docs.jsonl.gz")
DIM, K, QUERIES = 384, 10, 300


def _median_us(call, items) -> float:  # type: ignore[no-untyped-def]
    times = []
    for item in items:
        started = time.perf_counter()
        call(item)
        times.append((time.perf_counter() - started) * 1e6)
    return round(float(np.median(times)), 1)


def _dense(index: FaissIndex, allowed: RowSet | None, query: np.ndarray) -> object:
    return index.search_rows(query[None, :], K, allowed=allowed)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    faiss.omp_set_num_threads(1)
    spanner = SentenceTransformerEmbedder(EmbedderConfig(device="cpu"))
    spanner.warm_up()
    passages = []
    for n, document in enumerate(open_source([CORPUS]).documents()):
        for passage in split_document(document, spanner, ChunkingConfig()):
            passages.append(replace(passage, collection=f"c{n % 10}"))
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((len(passages), DIM)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    queries = vectors[rng.choice(len(passages), QUERIES, replace=False)] + 0.05
    texts = [p.title for p in passages[:: max(1, len(passages) // QUERIES)]][:QUERIES]
    started = time.perf_counter()
    table = FilterTable(passages)
    table_ms = (time.perf_counter() - started) * 1000
    filters = {
        "none": None,
        "1 of 10 collections": PassageFilter(frozenset({"c3"})),
        "5 of 10 collections": PassageFilter(frozenset({f"c{i}" for i in range(5)})),
    }
    resolve_us = {name: _median_us(table.rows, [f] * 50) for name, f in filters.items() if f}
    uncached = FilterTable(passages, cache_size=0)
    first_us = {name: _median_us(uncached.rows, [f] * 50) for name, f in filters.items() if f}
    bm25 = BM25Index.build([f"{p.heading}\n{p.text}" for p in passages], BM25Config())
    flat = faiss.IndexFlatIP(DIM)
    flat.add(vectors)
    results: dict[str, dict[str, object]] = {}
    for kind in ("flat", "hnsw"):
        search = build_search_index(flat, kind, AnnConfig(kind=kind))  # type: ignore[arg-type]
        manifest = IndexManifest("random", DIM, len(passages), "", "demo", 200, 40, kind)  # type: ignore[arg-type]
        index = FaissIndex(manifest, search, passages)
        for name, passage_filter in filters.items():
            allowed = table.rows(passage_filter)
            mask = None if allowed is None else allowed.mask
            dense = partial(_dense, index, allowed)
            row = results.setdefault(name, {"allowed_rows": len(passages)})
            row["allowed_rows"] = len(passages) if allowed is None else len(allowed)
            row[f"dense_{kind}_us"] = _median_us(dense, queries)
            row["bm25_us"] = _median_us(partial(bm25.search, k=K, allowed=mask), texts)
    for name in filters:
        for key in ("dense_flat_us", "dense_hnsw_us", "bm25_us"):
            base = results["none"][key]
            results[name][key.replace("_us", "_ratio")] = round(results[name][key] / base, 2)  # type: ignore[operator]
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    out = {
        "benchmark": "filtered_search",
        "commit": commit.strip(),
        "command": "python docs/benchmarks/filtered_search.py --out " + str(args.out),
        "passages": len(passages),
        "dimension": DIM,
        "k": K,
        "queries": QUERIES,
        "threads": 1,
        "filter_table_build_ms": round(table_ms, 1),
        "filter_resolve_uncached_us": first_us,
        "filter_resolve_cached_us": resolve_us,
        "searches": results,
    }
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
