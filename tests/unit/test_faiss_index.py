from __future__ import annotations

import json
from pathlib import Path

import pytest

from retrieval.corpus import corpus_checksum
from retrieval.errors import CorpusFormatError, IndexMismatchError, IndexNotFoundError
from retrieval.faiss_index import FaissIndex, read_manifest
from retrieval.indexer import build_index
from retrieval.passage import ChunkingConfig
from tests.fakes.hash_embedder import HashEmbedder

DOCS = [
    {"_id": "cats", "title": "Cats", "text": "Cats purr and sleep most of the day in the sun."},
    {"_id": "rust", "title": "Rust", "text": "Rust has ownership, borrowing and lifetimes."},
    {"_id": "tea", "title": "Tea", "text": "Green tea is steeped briefly in water below boiling."},
]


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    path = tmp_path / "corpus.jsonl"
    path.write_text("".join(json.dumps(doc) + "\n" for doc in DOCS))
    return path


def test_build_save_load_search(corpus: Path, tmp_path: Path) -> None:
    embedder = HashEmbedder()
    report = build_index(
        corpus, tmp_path / "idx", embedder, progress=False, chunking=ChunkingConfig(6, 2)
    )
    manifest = report.manifest
    assert manifest.embedder == embedder.name
    assert manifest.dimension == 64
    assert manifest.corpus_checksum == corpus_checksum(corpus)
    assert manifest.passage_count == report.manifest.passage_count > len(DOCS)
    index = FaissIndex.load(tmp_path / "idx", embedder=embedder.name, dimension=64)
    assert len(index) == manifest.passage_count
    hits = index.search(embedder.encode(["how long to steep green tea"]), 3)[0]
    assert hits[0].passage.doc_id == "tea"
    assert hits[0].score >= hits[1].score >= hits[2].score
    assert hits[0].passage.passage_id.startswith("tea#")


def test_rerun_keeps_a_current_index_and_rebuilds_a_changed_one(
    corpus: Path, tmp_path: Path
) -> None:
    embedder = HashEmbedder()
    first = build_index(corpus, tmp_path / "idx", embedder, progress=False)
    again = build_index(corpus, tmp_path / "idx", embedder, progress=False)
    assert not first.reused
    assert again.reused
    with corpus.open("a") as handle:
        handle.write(json.dumps({"_id": "new", "title": "", "text": "fresh words"}) + "\n")
    changed = build_index(corpus, tmp_path / "idx", embedder, progress=False)
    assert not changed.reused
    assert changed.manifest.passage_count == first.manifest.passage_count + 1
    assert not list(tmp_path.glob(".idx.*")), "staging folders are cleaned up"


def test_load_refuses_mismatches(corpus: Path, tmp_path: Path) -> None:
    build_index(corpus, tmp_path / "idx", HashEmbedder(), progress=False)
    with pytest.raises(IndexMismatchError, match="built with embedder 'test/hash-embedder'"):
        FaissIndex.load(tmp_path / "idx", embedder="other/model", dimension=64)
    with pytest.raises(IndexMismatchError, match="dimension 64, embedder gives 384"):
        FaissIndex.load(tmp_path / "idx", embedder="test/hash-embedder", dimension=384)
    with pytest.raises(IndexMismatchError, match="built from corpus"):
        FaissIndex.load(
            tmp_path / "idx",
            embedder="test/hash-embedder",
            dimension=64,
            corpus_checksum="sha256:0",
        )


def test_load_refuses_a_tampered_count(corpus: Path, tmp_path: Path) -> None:
    build_index(corpus, tmp_path / "idx", HashEmbedder(), progress=False)
    manifest_path = tmp_path / "idx" / "manifest.json"
    raw = json.loads(manifest_path.read_text())
    raw["passage_count"] += 1
    manifest_path.write_text(json.dumps(raw))
    with pytest.raises(IndexMismatchError, match="manifest says"):
        FaissIndex.load(tmp_path / "idx", embedder="test/hash-embedder", dimension=64)


def test_missing_index_says_how_to_build_one(tmp_path: Path) -> None:
    with pytest.raises(IndexNotFoundError, match="answer-service index build"):
        read_manifest(tmp_path / "nowhere")


def test_failed_build_leaves_no_index(corpus: Path, tmp_path: Path) -> None:
    with corpus.open("a") as handle:
        handle.write("{broken\n")
    with pytest.raises(CorpusFormatError, match=r"corpus.jsonl:4: not valid JSON"):
        build_index(corpus, tmp_path / "idx", HashEmbedder(), progress=False)
    assert not (tmp_path / "idx").exists()
    assert not list(tmp_path.glob(".idx.*"))


class FailingEmbedder(HashEmbedder):
    def encode(self, texts, *, batch_size=32):  # type: ignore[no-untyped-def]
        raise RuntimeError("embedder crashed")


def test_crash_mid_build_keeps_the_previous_index(corpus: Path, tmp_path: Path) -> None:
    build_index(corpus, tmp_path / "idx", HashEmbedder(), progress=False)
    before = (tmp_path / "idx" / "manifest.json").read_text()
    with pytest.raises(RuntimeError, match="embedder crashed"):
        build_index(corpus, tmp_path / "idx", FailingEmbedder(), progress=False, force=True)
    assert (tmp_path / "idx" / "manifest.json").read_text() == before
    assert not list(tmp_path.glob(".idx.*"))
