"""Writing an index directory while the corpus streams by, resumable after an interruption.

Everything is written into a staging folder beside the target (`.<name>.building`): passages,
their vectors and their sentences' vectors are appended batch by batch, and a checkpoint records how many whole
documents are in. A build that stops (crash, Ctrl-C, a killed machine) leaves the staging
folder; the next build of the same corpus, embedder and chunking continues after the last
checkpoint instead of embedding everything again. Only `commit` makes the index appear at
the target, as its next generation (the one served from then on).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import faiss
import numpy as np

from retrieval.embedder import passage_embedding_text
from retrieval.index.ann import AnnConfig, build_search_index
from retrieval.index.bm25_index import BM25Config, BM25Index
from retrieval.index.documents import DocumentRecord, rows_of, write_documents
from retrieval.index.faiss_index import (
    INDEX_FILE,
    MANIFEST_FILE,
    PASSAGES_FILE,
    IndexManifest,
    passage_to_json,
    read_passages,
)
from retrieval.index.generations import publish
from retrieval.passage import Passage
from retrieval.progress import Progress
from retrieval.sentences.store import EmbeddedPassages, SentenceStore

logger = logging.getLogger(__name__)

VECTORS_FILE = "vectors.f32"
SENTENCE_VECTORS_FILE = "sentences.f16"
PROGRESS_FILE = "progress.json"


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """`key` names what is being built; the first `documents` documents, which made the first
    `passages` passages, whose `sentences` sentences come first in the sentence vectors, are
    embedded and written."""

    key: str
    documents: int = 0
    passages: int = 0
    sentences: int = 0


class IndexWriter:
    def __init__(self, directory: Path, dimension: int, key: str) -> None:
        self.directory = directory
        self.dimension = dimension
        self.staging = directory.with_name(f".{directory.name}.building")
        self._index = faiss.IndexFlatIP(dimension)
        self.resumed = self._resume(key)
        self._passages_file = (self.staging / PASSAGES_FILE).open("a", encoding="utf-8")
        self._vectors_file = (self.staging / VECTORS_FILE).open("ab")
        self._sentences_file = (self.staging / SENTENCE_VECTORS_FILE).open("ab")
        # The sentence rows written after each passage since the resumed checkpoint.
        self._sentence_ends: list[int] = []

    @property
    def count(self) -> int:
        return int(self._index.ntotal)

    def _resume(self, key: str) -> Checkpoint:
        """Continue a staging folder built for the same `key`, else start it afresh."""
        checkpoint = _read_checkpoint(self.staging / PROGRESS_FILE)
        if checkpoint is None or checkpoint.key != key:
            shutil.rmtree(self.staging, ignore_errors=True)
            self.staging.mkdir(parents=True)
            checkpoint = Checkpoint(key)
            _write_checkpoint(self.staging / PROGRESS_FILE, checkpoint)
            return checkpoint
        # Keep exactly what the checkpoint covers: later writes may be partial.
        vectors = np.fromfile(self.staging / VECTORS_FILE, dtype=np.float32)
        vectors = vectors[: checkpoint.passages * self.dimension].reshape(-1, self.dimension)
        vectors.tofile(self.staging / VECTORS_FILE)
        self._index.add(vectors)
        sentences = np.fromfile(self.staging / SENTENCE_VECTORS_FILE, dtype=np.float16)
        sentences[: checkpoint.sentences * self.dimension].tofile(
            self.staging / SENTENCE_VECTORS_FILE
        )
        _truncate_lines(self.staging / PASSAGES_FILE, checkpoint.passages)
        logger.info(
            "index build resumed documents=%d passages=%d",
            checkpoint.documents,
            checkpoint.passages,
        )
        return checkpoint

    def add(self, passages: Sequence[Passage], embedded: EmbeddedPassages) -> None:
        """Append passages with their vectors and their sentences' vectors."""
        counts = embedded.sentence_counts
        if len(passages) != embedded.vectors.shape[0] or len(passages) != len(counts):
            raise ValueError("one vector and one sentence count per passage")
        if sum(counts) != embedded.sentence_vectors.shape[0]:
            raise ValueError("the sentence counts do not add up to the sentence vectors")
        vectors = np.ascontiguousarray(embedded.vectors, dtype=np.float32)
        self._index.add(vectors)
        vectors.tofile(self._vectors_file)
        sentences = np.ascontiguousarray(embedded.sentence_vectors, dtype=np.float16)
        sentences.tofile(self._sentences_file)
        written = self._sentence_ends[-1] if self._sentence_ends else self.resumed.sentences
        for passage, count in zip(passages, counts, strict=True):
            self._passages_file.write(passage_to_json(passage) + "\n")
            written += count
            self._sentence_ends.append(written)

    def checkpoint(self, documents: int, passages: int) -> None:
        """Record that the first `documents` documents (`passages` passages) are written."""
        files = (self._passages_file, self._vectors_file, self._sentences_file)
        for file in files:
            file.flush()
            os.fsync(file.fileno())
        since = passages - self.resumed.passages
        sentences = self._sentence_ends[since - 1] if since > 0 else self.resumed.sentences
        _write_checkpoint(
            self.staging / PROGRESS_FILE,
            Checkpoint(self.resumed.key, documents, passages, sentences),
        )

    def commit(
        self,
        manifest: IndexManifest,
        ann: AnnConfig,
        documents: dict[str, DocumentRecord] | None = None,
        *,
        progress: bool = False,
    ) -> None:
        """Build the manifest's kind of index from the vectors added, the lexical index, the
        sentences with their vectors and the table of `documents` (by id), then publish it as
        the directory's next generation (retrieval/index/generations.py). Without `documents` it
        has no table, and `index sync` refuses it. Each phase shows its progress when
        `progress` is set, and logs its time either way."""
        self.close()
        with Progress(f"faiss index ({manifest.index_type})", enabled=progress):
            index = build_search_index(self._index, manifest.index_type, ann)
            faiss.write_index(index, str(self.staging / INDEX_FILE))
        passages = list(read_passages(self.staging / PASSAGES_FILE))
        if manifest.lexical_index == "bm25":
            with Progress("BM25", enabled=progress):
                texts = [passage_embedding_text(p) for p in passages]
                BM25Index.build(texts, BM25Config()).save(self.staging)
        sentence_vectors = np.fromfile(self.staging / SENTENCE_VECTORS_FILE, dtype=np.float16)
        sentences = sentence_vectors.reshape(-1, self.dimension)
        SentenceStore.build(passages, sentences).save(self.staging)
        if documents is not None:
            write_documents(self.staging, rows_of(documents, passages))
        (self.staging / VECTORS_FILE).unlink()
        (self.staging / SENTENCE_VECTORS_FILE).unlink()
        (self.staging / PROGRESS_FILE).unlink()
        (self.staging / MANIFEST_FILE).write_text(manifest.to_json(), encoding="utf-8")
        publish(self.directory, self.staging)

    def close(self) -> None:
        """Stop writing, keeping the staging folder for a later build to resume."""
        self._passages_file.close()
        self._vectors_file.close()
        self._sentences_file.close()


def _read_checkpoint(path: Path) -> Checkpoint | None:
    try:
        return Checkpoint(**json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, TypeError):
        return None


def _write_checkpoint(path: Path, checkpoint: Checkpoint) -> None:
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(asdict(checkpoint)), encoding="utf-8")
    temporary.replace(path)


def _truncate_lines(path: Path, keep: int) -> None:
    temporary = path.with_suffix(".tmp")
    with path.open("rb") as source, temporary.open("wb") as target:
        target.writelines(line for _, line in zip(range(keep), source, strict=False))
    temporary.replace(path)
