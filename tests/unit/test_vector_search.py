"""Every `VectorSearch` finds the exact top-10 of a flat index: one contract, each implementation.

`TorchExactSearch` runs here on the CPU's torch; on a GPU it is the same code on another device
(`answer-service gpu-check` compares it there against faiss on the CPU).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import faiss
import numpy as np
import pytest

from retrieval.embedder import Vectors
from retrieval.index.vector_search import (
    FaissSearch,
    SerialSearch,
    TorchExactSearch,
    VectorSearch,
)
from tests.fakes.fake_gpus import CountingSearch

DIMENSION = 384
COUNT = 20_000


def _unit(count: int, seed: int) -> Vectors:
    rng = np.random.default_rng(seed)
    points = rng.normal(size=(count, DIMENSION)).astype(np.float32)
    points /= np.linalg.norm(points, axis=1, keepdims=True)
    return points


VECTORS = _unit(COUNT, seed=1)
QUERIES = _unit(64, seed=2)


def _flat() -> FaissSearch:
    index = faiss.IndexFlatIP(DIMENSION)
    index.add(VECTORS)
    return FaissSearch(index)


IMPLEMENTATIONS: dict[str, Callable[[], VectorSearch]] = {
    "faiss-flat": _flat,
    "torch-cpu": lambda: TorchExactSearch(VECTORS, "cpu"),
    "serial-torch-cpu": lambda: SerialSearch(TorchExactSearch(VECTORS, "cpu")),
}


@pytest.fixture(params=sorted(IMPLEMENTATIONS))
def search(request: pytest.FixtureRequest) -> VectorSearch:
    return IMPLEMENTATIONS[request.param]()


def test_top10_is_the_exact_top10(search: VectorSearch) -> None:
    truth = np.argsort(-(QUERIES @ VECTORS.T), axis=1, kind="stable")[:, :10]
    scores, rows = search.search(QUERIES, 10)

    assert rows.shape == scores.shape == (len(QUERIES), 10)
    assert rows.dtype == np.int64
    assert scores.dtype == np.float32
    assert [set(r) for r in rows.tolist()] == [set(t) for t in truth.tolist()]
    assert np.all(np.diff(scores, axis=1) <= 1e-6), "best first"
    expected = np.take_along_axis(QUERIES @ VECTORS.T, rows, axis=1)
    np.testing.assert_allclose(scores, expected, rtol=0, atol=1e-5)
    assert search.ntotal == COUNT


def test_torch_matches_faiss_row_for_row() -> None:
    faiss_scores, faiss_rows = _flat().search(QUERIES, 10)
    torch_scores, torch_rows = TorchExactSearch(VECTORS, "cpu").search(QUERIES, 10)

    np.testing.assert_array_equal(torch_rows, faiss_rows)
    np.testing.assert_allclose(torch_scores, faiss_scores, rtol=0, atol=1e-5)


def test_torch_search_in_chunks_and_with_k_beyond_the_count() -> None:
    small = TorchExactSearch(VECTORS[:7], "cpu")
    scores, rows = small.search(QUERIES, 10)
    assert scores.shape == rows.shape
    assert rows.shape == (len(QUERIES), 7)
    assert sorted(rows[0].tolist()) == list(range(7))

    chunked = TorchExactSearch(VECTORS, "cpu")
    chunked._chunk = 5  # many chunks of queries, same answer
    np.testing.assert_array_equal(chunked.search(QUERIES, 10)[1], _flat().search(QUERIES, 10)[1])
    empty_scores, empty_rows = chunked.search(QUERIES[:0], 10)
    assert empty_scores.shape == empty_rows.shape == (0, 10)


def test_where_each_runs() -> None:
    assert (_flat().backend, _flat().device) == ("faiss-cpu", "cpu")
    torch_search = TorchExactSearch(VECTORS[:10], "cpu")
    assert (torch_search.backend, torch_search.device) == ("torch", "cpu")
    assert isinstance(SerialSearch(torch_search), VectorSearch)
    assert not isinstance(faiss.IndexFlatIP(4), VectorSearch), "a bare faiss index is not one"


def _hammer(search: VectorSearch, threads: int = 8, calls: int = 32) -> list[list[int]]:
    with ThreadPoolExecutor(threads) as pool:
        results = pool.map(lambda i: search.search(QUERIES[i % 8 : i % 8 + 1], 10)[1], range(calls))
        return [r[0].tolist() for r in results]


def test_serial_search_lets_one_thread_in_at_a_time() -> None:
    bare = CountingSearch(_flat(), "faiss-gpu", "cuda:0", dwell_s=0.005)
    _hammer(bare)
    assert bare.max_active > 1, "the probe sees overlapping calls when nothing serialises them"

    inner = CountingSearch(_flat(), "faiss-gpu", "cuda:0", dwell_s=0.005)
    rows = _hammer(SerialSearch(inner))
    assert inner.calls == 32
    assert inner.max_active == 1
    expected = _flat().search(QUERIES[:8], 10)[1].tolist()
    assert rows == [expected[i % 8] for i in range(32)]
