"""The real MiniLM embedder pads token lengths into buckets. Under torch: the model only ever runs the
bucketed shapes, `warm_up()` has run those up to 96 tokens, and embedding queries of many
new lengths (up to ~90 tokens) leaves the process's memory where warm-up put it (unpadded, each new length kept about
2.5 MiB of native memory here: docs/benchmarks/embed-shape-buckets.json, removed with its
benchmark, last at 51f22ed). Under ONNX Runtime, the same queries leave memory as flat."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from docs.benchmarks.overload_soak import rss_mib
from retrieval.embedder import EmbedderConfig, SentenceTransformerEmbedder

pytestmark = pytest.mark.integration


def _queries() -> list[str]:
    words = ["which", "river", "flows", "through", "the", "old", "capital", "of", "a", "country"]
    return [" ".join(words[i % len(words)] for i in range(n)) for n in range(1, 90)]


def test_query_lengths_run_as_warmed_buckets_and_memory_stays_flat() -> None:
    embedder = SentenceTransformerEmbedder(EmbedderConfig(runtime="torch", pad_to_multiple_of=16))
    shapes: list[int] = []

    def seen(_: Any, args: tuple[Any, ...]) -> None:
        shapes.append(int(args[0].shape[1]))  # the token ids of the batch

    embedder.warm_up()
    # sentence-transformers calls the model's `forward` itself: hook its token embedding.
    hook = embedder._loaded()[0].auto_model.get_input_embeddings().register_forward_pre_hook(seen)
    try:
        before = rss_mib()
        padded = np.concatenate([embedder.encode([q], batch_size=1) for q in _queries()])
        grown = rss_mib() - before
    finally:
        hook.remove()

    assert len({len(embedder.token_spans(q)) for q in _queries()}) >= 80
    assert shapes
    assert all(length % 16 == 0 for length in shapes)
    assert len(set(shapes)) <= 256 // 16
    assert grown < 40, f"memory grew {grown:.1f} MiB over new query lengths"

    plain = SentenceTransformerEmbedder(EmbedderConfig(runtime="torch", pad_to_multiple_of=1))
    unpadded = np.concatenate([plain.encode([q], batch_size=1) for q in _queries()])
    cosine = (padded * unpadded).sum(axis=1)
    assert cosine.min() > 0.99  # padding is masked out: the same vectors, up to rounding


def test_onnx_runtime_memory_stays_flat_over_new_query_lengths() -> None:
    embedder = SentenceTransformerEmbedder(EmbedderConfig(device="cpu", runtime="onnx"))
    embedder.warm_up()
    before = rss_mib()
    for query in _queries():
        embedder.encode([query], batch_size=1)
    grown = rss_mib() - before
    assert grown < 40, f"memory grew {grown:.1f} MiB over new query lengths"
