"""An index directory, opened: the faiss index of its passages, their sentences with vectors and,
where it was built, the BM25 index over the same rows. Search modes are built from this
(`retrieval/search/`), the sentence scorer reads the sentences."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from retrieval.index.bm25_index import BM25Index
from retrieval.index.faiss_index import FaissIndex, IndexManifest
from retrieval.index.generations import served_generation
from retrieval.passage import Passage
from retrieval.sentences.store import SentenceStore


@dataclass(frozen=True, slots=True)
class LoadedIndex:
    directory: Path
    dense: FaissIndex
    sentences: SentenceStore
    lexical: BM25Index | None = None

    @property
    def manifest(self) -> IndexManifest:
        return self.dense.manifest

    def __len__(self) -> int:
        return len(self.dense)

    def passage(self, row: int) -> Passage:
        return self.dense.passage(row)

    def passage_by_id(self, passage_id: str) -> Passage | None:
        return self.dense.passage_by_id(passage_id)

    def row_of(self, passage_id: str) -> int:
        """The row of a passage this index holds (its sentences are the row's)."""
        return self.dense.row_of(passage_id)

    @classmethod
    def open(
        cls,
        directory: Path,
        *,
        embedder: str,
        dimension: int,
        corpus_checksum: str | None = None,
        device: str = "auto",
        max_gpu_bytes: int | None = None,
    ) -> LoadedIndex:
        """Load and check every part against the embedder in use (and the corpus, when
        given). Blocking."""
        directory = served_generation(directory)
        dense = FaissIndex.load(
            directory,
            embedder=embedder,
            dimension=dimension,
            corpus_checksum=corpus_checksum,
            device=device,
            max_gpu_bytes=max_gpu_bytes,
        )
        lexical = None
        if dense.manifest.lexical_index == "bm25":
            lexical = BM25Index.load(directory, len(dense))
        sentences = SentenceStore.load(directory, len(dense), dimension)
        return cls(directory, dense, sentences, lexical)
