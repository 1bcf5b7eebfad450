"""Where an index is searched, decided from its kind, the asked-for device and the GPUs seen;
searches placed on a (fake) GPU go one at a time, through `FaissIndex` as the service calls it."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import faiss
import numpy as np
import pytest

from retrieval.index.ann import AnnConfig, IndexKind, build_search_index
from retrieval.index.faiss_index import FaissIndex, IndexManifest
from retrieval.index.placement import IndexPlacement, parse_gpu, place_index, vector_bytes
from retrieval.index.vector_search import FaissSearch, SerialSearch
from retrieval.index.writer import IndexWriter
from retrieval.passage import Passage
from tests.builders import without_sentence_vectors
from tests.fakes.fake_gpus import FakeGpus

DIMENSION = 16
COUNT = 2_000


def _vectors(count: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    points = rng.normal(size=(count, DIMENSION)).astype(np.float32)
    points /= np.linalg.norm(points, axis=1, keepdims=True)
    return points


def _index(kind: IndexKind) -> faiss.Index:
    flat = faiss.IndexFlatIP(DIMENSION)
    flat.add(_vectors(COUNT, seed=1))
    return build_search_index(flat, kind, AnnConfig(kind=kind, nlist=8))


def _place(
    kind: IndexKind, device: str, gpus: FakeGpus, share: int | None = None
) -> tuple[str, str, str]:
    placed = place_index(_index(kind), kind, IndexPlacement(device, share), gpus)
    return placed.search.backend, placed.search.device, placed.reason


def test_flat_goes_to_faiss_gpu_and_is_serialised() -> None:
    gpus = FakeGpus(faiss_count=2, torch_count=2)
    placed = place_index(_index("flat"), "flat", IndexPlacement("cuda:1"), gpus)

    assert isinstance(placed.search, SerialSearch)
    assert (placed.search.backend, placed.search.device, placed.reason) == (
        "faiss-gpu",
        "cuda:1",
        "",
    )
    assert gpus.temp_memory_bytes == [None]


def test_without_faiss_gpu_flat_falls_back_to_torch_and_ivf_stays_on_the_cpu() -> None:
    torch_only = FakeGpus(faiss_count=0, torch_count=1)
    backend, device, reason = _place("flat", "cuda", torch_only)
    assert (backend, device) == ("torch", "cuda:0")
    assert "faiss-gpu is not installed" in reason

    backend, device, reason = _place("ivf", "cuda", torch_only)
    assert (backend, device) == ("faiss-cpu", "cpu")
    assert "needs faiss-gpu" in reason


@pytest.mark.parametrize("device", ["auto", "cuda", "cuda:0"])
def test_hnsw_is_cpu_only_and_says_so(device: str) -> None:
    backend, placed_on, reason = _place("hnsw", device, FakeGpus())
    assert (backend, placed_on) == ("faiss-cpu", "cpu")
    assert reason == "hnsw is CPU-only: faiss has no GPU hnsw index"


def test_cpu_auto_and_missing_gpus() -> None:
    assert _place("flat", "cpu", FakeGpus()) == ("faiss-cpu", "cpu", "")
    assert _place("flat", "auto", FakeGpus(0, 0)) == ("faiss-cpu", "cpu", "")
    assert _place("flat", "auto", FakeGpus(1, 1))[:2] == ("faiss-gpu", "cuda:0")
    backend, device, reason = _place("flat", "cuda:3", FakeGpus(1, 2))
    assert (backend, device, reason) == ("faiss-cpu", "cpu", "no GPU 3 (faiss sees 1, torch 2)")


def test_an_index_larger_than_its_share_stays_on_the_cpu() -> None:
    needed = vector_bytes(_index("flat"))
    assert needed == COUNT * DIMENSION * 4
    backend, _, reason = _place("flat", "cuda", FakeGpus(), share=needed - 1)
    assert backend == "faiss-cpu"
    assert "its share is" in reason

    gpus = FakeGpus()
    assert _place("flat", "cuda", gpus, share=needed + 4096)[0] == "faiss-gpu"
    assert gpus.temp_memory_bytes == [4096], "faiss's scratch gets what is left of the share"


def test_parse_gpu() -> None:
    assert [parse_gpu(d) for d in ("cpu", "auto", "cuda", "cuda:2")] == [None, None, 0, 2]


def _write(tmp_path: Path) -> Path:
    vectors = _vectors(COUNT, seed=1)
    passages = [Passage(f"d{i}#0", f"d{i}", 0, "", f"text {i}", 0, 2) for i in range(COUNT)]
    writer = IndexWriter(tmp_path / "idx", DIMENSION, key="flat")
    writer.add(passages, without_sentence_vectors(passages, vectors))
    manifest = IndexManifest(
        embedder="synthetic",
        dimension=DIMENSION,
        passage_count=COUNT,
        corpus_checksum="sha256:x",
        corpus_name="synthetic",
        passage_tokens=1,
        overlap_tokens=0,
    )
    writer.commit(manifest, AnnConfig(kind="flat"))
    return tmp_path / "idx"


@pytest.mark.parametrize(("faiss_count", "backend"), [(1, "faiss-gpu"), (0, "torch")])
def test_concurrent_searches_through_a_gpu_index_take_turns(
    tmp_path: Path, faiss_count: int, backend: str
) -> None:
    gpus = FakeGpus(faiss_count=faiss_count, torch_count=1)
    index = FaissIndex.load(
        _write(tmp_path), embedder="synthetic", dimension=DIMENSION, device="cuda", gpus=gpus
    )
    assert (index.device, index.search_backend) == ("cuda:0", backend)
    queries = _vectors(16, seed=2)
    cpu = FaissIndex.load(tmp_path / "idx", embedder="synthetic", dimension=DIMENSION, device="cpu")

    with ThreadPoolExecutor(8) as pool:
        hits = list(pool.map(lambda i: index.search_rows(queries[i : i + 1], 10)[0], range(16)))

    (gpu_search,) = gpus.placed
    assert gpu_search.calls == 16
    assert gpu_search.max_active == 1
    assert [[row for row, _ in h] for h in hits] == [
        [row for row, _ in h] for h in cpu.search_rows(queries, 10)
    ]


def test_a_bare_faiss_index_is_still_accepted() -> None:
    flat = _index("flat")
    manifest = IndexManifest("e", DIMENSION, COUNT, "sha256:x", "c", 1, 0)
    passages = [Passage(f"d{i}#0", f"d{i}", 0, "", "t", 0, 1) for i in range(COUNT)]
    index = FaissIndex(manifest, flat, passages)
    assert (index.device, index.search_backend) == ("cpu", "faiss-cpu")
    wrapped = FaissIndex(manifest, FaissSearch(flat), passages)
    query = _vectors(1, seed=3)
    assert wrapped.search_rows(query, 5) == index.search_rows(query, 5)
