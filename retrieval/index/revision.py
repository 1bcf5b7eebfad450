"""A new generation of an index from the served one: some documents kept as they are (their
passages, vectors and sentences copied, nothing embedded), others added or replaced (parsed
documents, embedded here), the rest removed from every structure.

Both `index sync` (retrieval/index/sync.py) and the service's document API go through
`revise`; the caller holds the directory's `WriterLock`.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import faiss
import numpy as np
import numpy.typing as npt

from retrieval.corpus import Document
from retrieval.embedder import Embedder, passage_embedding_text
from retrieval.errors import IndexMismatchError, RetrievalError
from retrieval.index.ann import AnnConfig, build_search_index
from retrieval.index.bm25_index import BM25Config, BM25Index
from retrieval.index.documents import (
    DocumentRecord,
    content_hash,
    read_documents,
    table_checksum,
    write_documents,
)
from retrieval.index.faiss_index import (
    INDEX_FILE,
    MANIFEST_FILE,
    PASSAGES_FILE,
    IndexManifest,
    passage_to_json,
    read_manifest,
    read_passages,
)
from retrieval.index.generations import GENERATIONS_DIR, publish, served_generation
from retrieval.passage import ChunkingConfig, Passage, split_document
from retrieval.progress import Progress
from retrieval.sentences.store import (
    SORTED_BATCHES,
    EmbeddedPassages,
    SentenceStore,
    embed_passages,
)
from retrieval.sentences.terms import Idf

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Base:
    """The served generation, read for revising: its manifest, table, passages, vectors and
    sentences (the sentence vectors memory-mapped)."""

    directory: Path
    manifest: IndexManifest
    records: list[DocumentRecord]
    passages: list[Passage]
    vectors: npt.NDArray[np.float32]
    sentences: SentenceStore

    @property
    def chunking(self) -> ChunkingConfig:
        return ChunkingConfig(self.manifest.passage_tokens, self.manifest.overlap_tokens)

    @classmethod
    def read(cls, index_dir: Path, embedder: Embedder) -> Base:
        directory = served_generation(index_dir)
        manifest = read_manifest(directory)
        if manifest.embedder != embedder.name or manifest.dimension != embedder.dimension:
            raise IndexMismatchError(
                f"{index_dir} was built with embedder {manifest.embedder!r} "
                f"({manifest.dimension}-d); this sync uses {embedder.name!r} "
                f"({embedder.dimension}-d). Vectors of two embedders cannot be mixed: rebuild "
                f"it with `answer-service index build PATH... --out {index_dir}`."
            )
        records = read_documents(directory)
        if records is None:
            raise IndexMismatchError(
                f"{index_dir} was built before `index sync` existed (it has no documents "
                f"table); rebuild it once with `answer-service index build PATH... --out "
                f"{index_dir}`"
            )
        passages = list(read_passages(directory / PASSAGES_FILE))
        vectors = _vectors_of(faiss.read_index(str(directory / INDEX_FILE)))
        sentences = SentenceStore.load(directory, len(passages), manifest.dimension)
        return cls(directory, manifest, records, passages, vectors, sentences)


@dataclass(frozen=True, slots=True)
class Incoming:
    """A document to add or replace, with what its table row records of where it came from."""

    document: Document
    record: DocumentRecord  # first_row and rows are filled in when it is embedded


@dataclass(frozen=True, slots=True)
class Revision:
    generation: Path | None  # None: nothing changed, nothing published
    kept: int
    embedded: int  # documents parsed and embedded
    removed: int
    passages: int
    embedded_passages: int
    seconds: float


def revise(
    index_dir: Path,
    base: Base,
    keep: Sequence[DocumentRecord],
    incoming: Sequence[Incoming],
    embedder: Embedder,
    *,
    ann: AnnConfig | None = None,
    batch_size: int = 64,
    progress: bool = True,
) -> Revision:
    """Publish a generation holding `keep` (records of `base`) then `incoming`; blocking."""
    started_s = time.monotonic()
    removed = len(base.records) - len(keep)
    if not incoming and removed == 0:
        return Revision(None, len(keep), 0, 0, len(base.passages), 0, 0.0)
    generations = index_dir / GENERATIONS_DIR
    generations.mkdir(parents=True, exist_ok=True)
    staging = generations / f".staging-{int(time.time() * 1000)}"
    staging.mkdir()
    try:
        fresh, fresh_records = _split(incoming, embedder, base.chunking, len(_rows(keep)))
        if not _rows(keep).size and not fresh:
            raise RetrievalError("this change would leave the index without a passage")
        embedded = _embed(fresh, embedder, batch_size, progress)
        kept_rows = _rows(keep)
        passages = [base.passages[row] for row in kept_rows] + fresh
        vectors = np.vstack([base.vectors[kept_rows], embedded.vectors])
        records = _renumbered(keep) + fresh_records
        manifest = _write(staging, base, passages, vectors, records, ann or AnnConfig(), progress)
        _sentences(base.sentences, kept_rows, fresh, embedded, passages).save(staging)
        (staging / MANIFEST_FILE).write_text(manifest.to_json(), encoding="utf-8")
        generation = publish(index_dir, staging)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return Revision(
        generation,
        len(keep),
        len(incoming),
        removed,
        len(passages),
        len(fresh),
        time.monotonic() - started_s,
    )


def clear_staging(index_dir: Path) -> None:
    """Remove what an interrupted revision left (the caller holds the writer lock)."""
    for path in (index_dir / GENERATIONS_DIR).glob(".staging-*"):
        shutil.rmtree(path, ignore_errors=True)


def incoming_record(document: Document, **fields: Any) -> DocumentRecord:
    return DocumentRecord(
        doc_id=document.doc_id,
        collection=document.collection,
        content_hash=content_hash(document),
        first_row=0,
        rows=0,
        title=document.title,
        path=document.path,
        **fields,
    )


def _rows(records: Sequence[DocumentRecord]) -> npt.NDArray[np.int64]:
    if not records:
        return np.zeros(0, dtype=np.int64)
    return np.concatenate(
        [np.arange(r.first_row, r.first_row + r.rows, dtype=np.int64) for r in records]
    )


def _renumbered(records: Sequence[DocumentRecord]) -> list[DocumentRecord]:
    out, row = [], 0
    for record in records:
        out.append(record.moved_to(row))
        row += record.rows
    return out


def _split(
    incoming: Sequence[Incoming], embedder: Embedder, chunking: ChunkingConfig, first_row: int
) -> tuple[list[Passage], list[DocumentRecord]]:
    passages: list[Passage] = []
    records: list[DocumentRecord] = []
    for item in incoming:
        cut = list(split_document(item.document, embedder, chunking))
        if not cut:
            continue  # no text: nothing to serve, and nothing kept of an older version
        records.append(
            dataclasses.replace(item.record, first_row=first_row + len(passages), rows=len(cut))
        )
        passages.extend(cut)
    return passages, records


def _embed(
    passages: Sequence[Passage], embedder: Embedder, batch_size: int, progress: bool
) -> EmbeddedPassages:
    """The fresh passages' vectors and their sentences', batch by batch."""
    parts: list[EmbeddedPassages] = []
    with Progress("passages embedded", len(passages), "passages", enabled=progress) as shown:
        for at in range(0, len(passages), batch_size * SORTED_BATCHES):
            batch = passages[at : at + batch_size * SORTED_BATCHES]
            parts.append(embed_passages(batch, embedder, batch_size=batch_size))
            shown.advance(len(batch))
    dimension = embedder.dimension
    return EmbeddedPassages(
        np.vstack([np.zeros((0, dimension), np.float32), *(p.vectors for p in parts)]),
        np.vstack([np.zeros((0, dimension), np.float16), *(p.sentence_vectors for p in parts)]),
        tuple(count for part in parts for count in part.sentence_counts),
    )


def _write(
    staging: Path,
    base: Base,
    passages: Sequence[Passage],
    vectors: npt.NDArray[np.float32],
    records: Sequence[DocumentRecord],
    ann: AnnConfig,
    progress: bool,
) -> IndexManifest:
    flat = faiss.IndexFlatIP(base.manifest.dimension)
    flat.add(np.ascontiguousarray(vectors, dtype=np.float32))
    kind = ann.resolve(len(passages)) if ann.kind != "auto" else _kind(base, ann, len(passages))
    with Progress(f"faiss index ({kind})", enabled=progress):
        faiss.write_index(build_search_index(flat, kind, ann), str(staging / INDEX_FILE))
    with (staging / PASSAGES_FILE).open("w", encoding="utf-8") as lines:
        for passage in passages:
            lines.write(passage_to_json(passage) + "\n")
    if base.manifest.lexical_index == "bm25":
        with Progress("BM25", enabled=progress):
            texts = [passage_embedding_text(p) for p in passages]
            BM25Index.build(texts, BM25Config()).save(staging)
    write_documents(staging, records)
    return dataclasses.replace(
        base.manifest,
        passage_count=len(passages),
        corpus_checksum=table_checksum(records),
        index_type=kind,
        nlist=ann.lists_for(len(passages)) if kind == "ivf" else None,
        hnsw_m=ann.hnsw_m if kind == "hnsw" else None,
    )


def _kind(base: Base, ann: AnnConfig, count: int) -> Any:
    """Keep the served generation's kind unless the size calls for another under `auto`."""
    if base.manifest.index_type == "hnsw":
        return "hnsw"
    return ann.resolve(count)


def _vectors_of(index: Any) -> npt.NDArray[np.float32]:
    """Every vector of a flat, IVF or HNSW index, in row order."""
    try:
        ivf = faiss.extract_index_ivf(index)
    except RuntimeError:
        ivf = None
    if ivf is not None:
        ivf.make_direct_map()
    return np.asarray(index.reconstruct_n(0, index.ntotal), dtype=np.float32)


def _sentences(
    old: SentenceStore,
    kept_rows: npt.NDArray[np.int64],
    fresh: Sequence[Passage],
    embedded: EmbeddedPassages,
    passages: Sequence[Passage],
) -> SentenceStore:
    """The kept rows' sentences copied (vectors included), the fresh passages' split with the
    vectors their pass gave, and the term frequencies counted again over all passages."""
    counts = old.offsets[kept_rows + 1] - old.offsets[kept_rows]
    starts = np.repeat(old.offsets[kept_rows] - np.cumsum(counts) + counts, counts)
    take = starts + np.arange(int(counts.sum()), dtype=np.int64)
    spans = old.spans[take].copy()
    spans[:, 0] = np.repeat(np.arange(len(kept_rows), dtype=np.int32), counts)
    vectors = np.asarray(old.vectors[take], dtype=np.float16)
    offsets = [np.zeros(1, dtype=np.int64), np.cumsum(counts, dtype=np.int64)]
    if fresh:
        new = SentenceStore.build(fresh, embedded.sentence_vectors)
        new_spans = new.spans.copy()
        new_spans[:, 0] += len(kept_rows)
        spans = np.vstack([spans, new_spans])
        vectors = np.vstack([vectors, new.vectors])
        offsets.append(new.offsets[1:] + offsets[-1][-1:] if counts.size else new.offsets[1:])
    idf = Idf.count(f"{p.title}\n{p.text}" for p in passages)
    return SentenceStore(
        spans.astype(np.int32).reshape(-1, 5), np.concatenate(offsets), vectors, idf
    )
