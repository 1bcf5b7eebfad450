from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from retrieval.corpus import corpus_checksum
from retrieval.embedder import Vectors
from retrieval.errors import (
    CorpusFormatError,
    IndexMismatchError,
    IndexNotFoundError,
    RetrievalError,
)
from retrieval.index import builder as indexer
from retrieval.index.builder import build_index
from retrieval.index.faiss_index import FaissIndex, read_manifest
from retrieval.index.loaded import LoadedIndex
from retrieval.passage import ChunkingConfig
from retrieval.sentences.store import SORTED_BATCHES
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
    assert not [p for p in tmp_path.glob(".idx.*") if p.is_dir()], "no staging folder left"


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
    assert not [p for p in tmp_path.glob(".idx.*") if p.is_dir()]


class FlakyEmbedder(HashEmbedder):
    """Counts the passages it embeds (texts "title\ntext"; the sentences embedded once the
    passages are in have no title); raises once `fail_after` passages have been embedded."""

    def __init__(self, fail_after: int | None = None) -> None:
        super().__init__()
        self.fail_after = fail_after
        self.embedded = 0

    def encode(self, texts: Sequence[str], *, batch_size: int = 32) -> Vectors:
        passages = sum("\n" in text for text in texts)
        if self.fail_after is not None and self.embedded + passages > self.fail_after:
            raise RuntimeError("embedder crashed")
        self.embedded += passages
        return super().encode(texts, batch_size=batch_size)


def _big_corpus(tmp_path: Path, documents: int) -> Path:
    path = tmp_path / "big.jsonl"
    with path.open("w") as out:
        for n in range(documents):
            words = " ".join(f"w{n}x{i}" for i in range(25))
            out.write(json.dumps({"_id": f"doc{n}", "title": f"T{n}", "text": words}) + "\n")
    return path


def test_crash_mid_build_keeps_the_previous_index(corpus: Path, tmp_path: Path) -> None:
    build_index(corpus, tmp_path / "idx", HashEmbedder(), progress=False)
    before = (tmp_path / "idx" / "manifest.json").read_text()
    with pytest.raises(RuntimeError, match="embedder crashed"):
        build_index(corpus, tmp_path / "idx", FlakyEmbedder(0), progress=False, force=True)
    assert (tmp_path / "idx" / "manifest.json").read_text() == before


def test_an_interrupted_build_resumes_where_it_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(indexer, "CHECKPOINT_PASSAGES", 100)
    # A call to the embedder holds SORTED_BATCHES batches of 64: the crash comes in the
    # second call, after the first was written and checkpointed.
    call = 64 * SORTED_BATCHES
    documents = call
    corpus = _big_corpus(tmp_path, documents)
    chunking = ChunkingConfig(10, 2)  # 25 words -> 3 passages per document
    crashing = FlakyEmbedder(fail_after=call + call // 2)
    with pytest.raises(RuntimeError, match="embedder crashed"):
        build_index(
            corpus, tmp_path / "idx", crashing, chunking=chunking, batch_size=64, progress=False
        )
    assert not (tmp_path / "idx").exists()
    assert (tmp_path / ".idx.building" / "progress.json").is_file()
    resumed = FlakyEmbedder()
    report = build_index(
        corpus, tmp_path / "idx", resumed, chunking=chunking, batch_size=64, progress=False
    )
    total = report.manifest.passage_count
    assert total == 3 * documents
    # Redone at most: what came after the last checkpoint (100 passages) and the call to the
    # embedder under way when it crashed.
    assert crashing.embedded >= call
    assert resumed.embedded <= total - crashing.embedded + 100 + call, "finished work is redone"
    assert report.documents < documents
    clean = build_index(
        corpus, tmp_path / "clean", HashEmbedder(), chunking=chunking, progress=False
    )
    read = FaissIndex.load(tmp_path / "idx", embedder="test/hash-embedder", dimension=64)
    reference = FaissIndex.load(tmp_path / "clean", embedder="test/hash-embedder", dimension=64)
    assert [read.passage(i) for i in range(total)] == [reference.passage(i) for i in range(total)]
    query = HashEmbedder().encode(["w599x3 w17x4"])
    assert read.search(query, 5) == reference.search(query, 5)
    assert clean.manifest == report.manifest
    assert not (tmp_path / ".idx.building").exists()
    # The sentences' vectors, written beside the passages', resume with them.
    ours = LoadedIndex.open(tmp_path / "idx", embedder="test/hash-embedder", dimension=64)
    theirs = LoadedIndex.open(tmp_path / "clean", embedder="test/hash-embedder", dimension=64)
    assert np.array_equal(ours.sentences.spans, theirs.sentences.spans)
    assert np.array_equal(np.asarray(ours.sentences.vectors), theirs.sentences.vectors)
    assert np.count_nonzero(np.abs(np.asarray(ours.sentences.vectors)).sum(axis=1)) == total


def test_a_changed_corpus_does_not_resume_a_stale_build(tmp_path: Path) -> None:
    corpus = _big_corpus(tmp_path, 50)
    with pytest.raises(RuntimeError):
        build_index(corpus, tmp_path / "idx", FlakyEmbedder(10), progress=False)
    with corpus.open("a") as out:
        out.write(json.dumps({"_id": "late", "title": "Late", "text": "late words"}) + "\n")
    fresh = FlakyEmbedder()
    report = build_index(corpus, tmp_path / "idx", fresh, progress=False)
    assert fresh.embedded == report.manifest.passage_count


@pytest.mark.parametrize("content", ["", "\n\n"])
def test_an_empty_corpus_is_refused(tmp_path: Path, content: str) -> None:
    path = tmp_path / "empty.jsonl"
    path.write_text(content)
    with pytest.raises(RetrievalError, match="holds no documents"):
        build_index(path, tmp_path / "idx", HashEmbedder(), progress=False)


def test_a_corpus_without_text_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "blank.jsonl"
    path.write_text(json.dumps({"_id": "a", "title": "", "text": "   "}) + "\n")
    with pytest.raises(RetrievalError, match="holds no text"):
        build_index(path, tmp_path / "idx", HashEmbedder(), progress=False)
