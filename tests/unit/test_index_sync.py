"""`index sync` over real faiss, BM25 and sentence stores (the hash embedder stands in for
MiniLM): only what changed is embedded, what is gone is gone from every structure, the
served generation stays whole whatever happens to a sync, and one writer at a time."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from retrieval.embedder import Vectors
from retrieval.errors import IndexBusyError, IndexMismatchError
from retrieval.index.builder import build_index
from retrieval.index.documents import read_documents
from retrieval.index.generations import WriterLock, generation_number, served_generation
from retrieval.index.loaded import LoadedIndex
from retrieval.index.sync import sync_index
from retrieval.ingest.source import IngestOptions, open_source
from tests.fakes.hash_embedder import HashEmbedder

PAGES = {
    "cats.md": "# Cats\n\nCats purr and sleep most of the day in the warm sun.\n",
    "rust.md": "# Rust\n\nRust has ownership, borrowing and lifetimes for memory safety.\n",
    "tea.md": "# Tea\n\nGreen tea is steeped briefly in water below boiling point.\n",
    "guide/vacuum.md": "# Vacuum\n\nVACUUM reclaims storage occupied by dead tuples.\n",
}


class CountingEmbedder(HashEmbedder):
    """Counts the texts it embeds, to show what a sync did not embed again."""

    def __init__(self) -> None:
        super().__init__()
        self.texts: list[str] = []

    def encode(self, texts: Sequence[str], *, batch_size: int = 32) -> Vectors:
        self.texts.extend(texts)
        return super().encode(texts, batch_size=batch_size)


@pytest.fixture
def docs(tmp_path: Path) -> Path:
    folder = tmp_path / "docs"
    for name, text in PAGES.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    return folder


def _open(index: Path, embedder: HashEmbedder) -> LoadedIndex:
    return LoadedIndex.open(index, embedder=embedder.name, dimension=embedder.dimension)


def _doc_ids(index: Path, embedder: HashEmbedder) -> set[str]:
    loaded = _open(index, embedder)
    return {loaded.passage(row).doc_id for row in range(len(loaded))}


def _build(docs: Path, index: Path, embedder: HashEmbedder) -> None:
    build_index(open_source([docs]), index, embedder, progress=False)


def test_sync_embeds_only_what_changed_and_removes_what_is_gone(docs: Path, tmp_path: Path) -> None:
    index = tmp_path / "idx"
    embedder = CountingEmbedder()
    _build(docs, index, embedder)
    assert generation_number(index) == 1
    (docs / "rust.md").write_text("# Rust\n\nRust's borrow checker enforces aliasing rules.\n")
    (docs / "tea.md").unlink()
    (docs / "guide" / "wal.md").write_text("# WAL\n\nThe write-ahead log makes commits durable.\n")
    embedder.texts.clear()

    report = sync_index([docs], index, embedder, progress=False)

    assert (report.added, report.changed, report.removed, report.unchanged) == (1, 1, 1, 2)
    embedded = " ".join(embedder.texts)
    assert "borrow checker" in embedded
    assert "write-ahead" in embedded
    assert "purr" not in embedded, "an unchanged page was embedded again"
    assert "VACUUM" not in embedded, "an unchanged page was embedded again"
    assert generation_number(index) == 2
    assert _doc_ids(index, embedder) == {
        "docs/cats.md",
        "docs/rust.md",
        "docs/guide/vacuum.md",
        "docs/guide/wal.md",
    }
    loaded = _open(index, embedder)
    # Every structure agrees on the new rows: BM25, vectors and sentences.
    assert loaded.lexical is not None
    assert len(loaded.lexical) == len(loaded)
    hits = loaded.lexical.search("steeped boiling", 5)
    assert all(loaded.passage(row).doc_id != "docs/tea.md" for row, _ in hits)
    hits = loaded.lexical.search("borrow checker aliasing", 1)
    assert loaded.passage(hits[0][0]).doc_id == "docs/rust.md"
    query = embedder.encode(["The write-ahead log makes commits durable."])
    assert loaded.dense.search(query, 1)[0][0].passage.doc_id == "docs/guide/wal.md"
    assert loaded.sentences.passages == len(loaded)
    for row in range(len(loaded)):
        passage = loaded.passage(row)
        for sentence in loaded.sentences.of(row):
            assert sentence.row == row
            assert sentence.end <= len(passage.text)
    wal_row = next(r for r in range(len(loaded)) if loaded.passage(r).doc_id.endswith("wal.md"))
    sentence = loaded.sentences.of(wal_row)[-1]
    text = loaded.passage(wal_row).text[sentence.start : sentence.end]
    expected = embedder.encode([text])[0].astype(np.float16)
    assert np.allclose(loaded.sentences.vectors[sentence.sentence_id], expected, atol=1e-2)
    # A page kept from the first generation keeps its sentence vectors too.
    cats_row = next(r for r in range(len(loaded)) if loaded.passage(r).doc_id.endswith("cats.md"))
    kept = loaded.sentences.of(cats_row)[-1]
    text = loaded.passage(cats_row).text[kept.start : kept.end]
    expected = embedder.encode([text])[0].astype(np.float16)
    assert np.allclose(loaded.sentences.vectors[kept.sentence_id], expected, atol=1e-2)


def test_a_sync_with_nothing_changed_publishes_nothing(docs: Path, tmp_path: Path) -> None:
    index = tmp_path / "idx"
    embedder = CountingEmbedder()
    _build(docs, index, embedder)
    embedder.texts.clear()
    report = sync_index([docs], index, embedder, progress=False)
    assert report.revision.generation is None
    assert report.unchanged == len(PAGES)
    assert embedder.texts == []
    assert generation_number(index) == 1


def test_a_folder_sync_leaves_other_sources_alone(docs: Path, tmp_path: Path) -> None:
    index = tmp_path / "idx"
    embedder = HashEmbedder()
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("Notes about replication slots and standbys.")
    build_index(open_source([docs, other]), index, embedder, progress=False)
    (docs / "cats.md").unlink()
    sync_index([docs], index, embedder, progress=False)
    ids = _doc_ids(index, embedder)
    assert "other/notes.txt" in ids
    assert "docs/cats.md" not in ids


def test_sync_into_another_collection_moves_the_documents(docs: Path, tmp_path: Path) -> None:
    index = tmp_path / "idx"
    embedder = HashEmbedder()
    _build(docs, index, embedder)
    sync_index([docs], index, embedder, options=IngestOptions("manual"), progress=False)
    loaded = _open(index, embedder)
    assert {loaded.passage(row).collection for row in range(len(loaded))} == {"manual"}
    records = read_documents(served_generation(index))
    assert records is not None
    assert {r.collection for r in records} == {"manual"}


def test_an_interrupted_sync_leaves_the_served_generation_whole(
    docs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    index = tmp_path / "idx"
    embedder = HashEmbedder()
    _build(docs, index, embedder)
    before = _doc_ids(index, embedder)
    (docs / "cats.md").unlink()

    def killed(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt  # as a Ctrl-C or a kill would, halfway through

    monkeypatch.setattr("retrieval.index.revision.publish", killed)
    with pytest.raises(KeyboardInterrupt):
        sync_index([docs], index, embedder, progress=False)
    assert generation_number(index) == 1
    assert _doc_ids(index, embedder) == before
    assert not list((index / "generations").glob(".staging-*"))
    monkeypatch.undo()
    sync_index([docs], index, embedder, progress=False)
    assert "docs/cats.md" not in _doc_ids(index, embedder)


def test_one_writer_at_a_time(docs: Path, tmp_path: Path) -> None:
    index = tmp_path / "idx"
    embedder = HashEmbedder()
    _build(docs, index, embedder)
    with WriterLock(index), pytest.raises(IndexBusyError, match=f"pid {os.getpid()}"):
        sync_index([docs], index, embedder, progress=False)
    with WriterLock(index), pytest.raises(IndexBusyError):
        build_index(open_source([docs]), index, embedder, progress=False, force=True)


def test_another_embedder_is_refused(docs: Path, tmp_path: Path) -> None:
    index = tmp_path / "idx"
    _build(docs, index, HashEmbedder())
    with pytest.raises(IndexMismatchError, match="cannot be mixed"):
        sync_index([docs], index, HashEmbedder(32, name="other/model"), progress=False)


def test_old_generations_are_pruned_and_the_manifest_link_follows(
    docs: Path, tmp_path: Path
) -> None:
    index = tmp_path / "idx"
    embedder = HashEmbedder()
    _build(docs, index, embedder)
    for round_ in range(3):
        (docs / f"new{round_}.txt").write_text(f"Round {round_} adds a page about checkpoints.")
        sync_index([docs], index, embedder, progress=False)
    assert generation_number(index) == 4
    assert sorted(p.name for p in (index / "generations").iterdir()) == ["000003", "000004"]
    manifest = (index / "manifest.json").read_text()
    assert manifest == (served_generation(index) / "manifest.json").read_text()


def test_a_changed_parser_parses_everything_again(
    docs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    index = tmp_path / "idx"
    embedder = CountingEmbedder()
    _build(docs, index, embedder)
    embedder.texts.clear()
    monkeypatch.setattr("retrieval.index.documents.PARSER_VERSION", 10_000)
    report = sync_index([docs], index, embedder, progress=False)
    assert (report.changed, report.unchanged) == (len(PAGES), 0)
    assert "purr" in " ".join(embedder.texts)
