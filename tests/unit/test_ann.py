"""Index kinds on real faiss with synthetic clustered vectors: recall against exact search."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from retrieval.index.ann import AnnConfig, SearchDepth
from retrieval.index.faiss_index import FaissIndex, IndexManifest
from retrieval.index.writer import IndexWriter
from retrieval.passage import Passage
from tests.builders import without_sentence_vectors

DIMENSION = 32
COUNT = 4_000


def _vectors(count: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(40, DIMENSION))
    points = centers[rng.integers(0, 40, size=count)] + 0.3 * rng.normal(size=(count, DIMENSION))
    points /= np.linalg.norm(points, axis=1, keepdims=True)
    return points.astype(np.float32)


def _build(tmp_path: Path, kind: str, **ann: object) -> FaissIndex:
    config = AnnConfig(kind=kind, **ann)  # type: ignore[arg-type]
    vectors = _vectors(COUNT, seed=1)
    writer = IndexWriter(tmp_path / kind, DIMENSION, key=kind)
    passages = [Passage(f"d{i}#0", f"d{i}", 0, "", f"text {i}", 0, 6) for i in range(COUNT)]
    for start in range(0, COUNT, 500):
        batch = passages[start : start + 500]
        writer.add(batch, without_sentence_vectors(batch, vectors[start : start + 500]))
    resolved = config.resolve(COUNT)
    manifest = IndexManifest(
        embedder="synthetic",
        dimension=DIMENSION,
        passage_count=COUNT,
        corpus_checksum="sha256:x",
        corpus_name="synthetic",
        passage_tokens=1,
        overlap_tokens=0,
        index_type=resolved,
        nlist=config.lists_for(COUNT) if resolved == "ivf" else None,
    )
    writer.commit(manifest, config)
    return FaissIndex.load(tmp_path / kind, embedder="synthetic", dimension=DIMENSION)


def _recall_at_10(index: FaissIndex, exact: FaissIndex, depth: SearchDepth | None) -> float:
    queries = _vectors(100, seed=2)
    found = index.search(queries, 10, depth)
    truth = exact.search(queries, 10)
    hits = [
        len({p.passage.passage_id for p in got} & {p.passage.passage_id for p in want})
        for got, want in zip(found, truth, strict=True)
    ]
    return sum(hits) / (10 * len(hits))


@pytest.fixture(scope="module")
def indexes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, FaissIndex]:
    tmp = tmp_path_factory.mktemp("ann")
    return {kind: _build(tmp, kind) for kind in ("flat", "ivf", "hnsw")}


def test_kinds_are_recorded_in_the_manifest(indexes: dict[str, FaissIndex]) -> None:
    assert {k: i.manifest.index_type for k, i in indexes.items()} == {
        "flat": "flat",
        "ivf": "ivf",
        "hnsw": "hnsw",
    }
    assert indexes["ivf"].manifest.nlist == AnnConfig().lists_for(COUNT)
    assert all(index.device == "cpu" for index in indexes.values())


def test_ivf_recall_grows_with_nprobe(indexes: dict[str, FaissIndex]) -> None:
    nlist = indexes["ivf"].manifest.nlist
    assert nlist is not None
    shallow = _recall_at_10(indexes["ivf"], indexes["flat"], SearchDepth(nprobe=1))
    deep = _recall_at_10(indexes["ivf"], indexes["flat"], SearchDepth(nprobe=16))
    full = _recall_at_10(indexes["ivf"], indexes["flat"], SearchDepth(nprobe=nlist))
    assert shallow < deep <= full
    assert full == pytest.approx(1.0)
    assert deep > 0.9


def test_hnsw_recall_grows_with_ef_search(indexes: dict[str, FaissIndex]) -> None:
    shallow = _recall_at_10(indexes["hnsw"], indexes["flat"], SearchDepth(ef_search=10))
    deep = _recall_at_10(indexes["hnsw"], indexes["flat"], SearchDepth(ef_search=200))
    assert shallow <= deep
    assert deep > 0.95


def test_depth_that_does_not_apply_is_ignored(indexes: dict[str, FaissIndex]) -> None:
    exact = _recall_at_10(indexes["flat"], indexes["flat"], SearchDepth(nprobe=1, ef_search=1))
    assert exact == 1.0


@pytest.mark.parametrize(("count", "kind"), [(10, "flat"), (50_000, "flat"), (50_001, "ivf")])
def test_auto_kind_follows_corpus_size(count: int, kind: str) -> None:
    assert AnnConfig().resolve(count) == kind
    assert AnnConfig(large_kind="hnsw").resolve(count) == ("hnsw" if kind == "ivf" else "flat")


def test_an_index_of_an_older_format_is_refused(
    indexes: dict[str, FaissIndex], tmp_path: Path
) -> None:
    from retrieval.errors import IndexMismatchError

    index = _build(tmp_path, "flat")
    manifest_path = tmp_path / "flat" / "manifest.json"
    raw = json.loads(manifest_path.read_text())
    raw["format_version"] = 1
    manifest_path.write_text(json.dumps(raw))
    with pytest.raises(IndexMismatchError, match="format version 1"):
        FaissIndex.load(tmp_path / "flat", embedder="synthetic", dimension=DIMENSION)
    assert len(index) == COUNT
