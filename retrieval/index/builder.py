"""Building an index from a corpus, streaming: memory holds one batch plus the index itself."""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from retrieval.corpus import Document
from retrieval.embedder import Embedder
from retrieval.errors import RetrievalError
from retrieval.index.ann import AnnConfig
from retrieval.index.documents import DocumentRecord, document_ingest, file_hash
from retrieval.index.faiss_index import FORMAT_VERSION, IndexManifest, read_manifest
from retrieval.index.generations import WriterLock
from retrieval.index.revision import incoming_record
from retrieval.index.writer import IndexWriter
from retrieval.ingest.scan import SkippedFile
from retrieval.ingest.source import DocumentSource, open_source
from retrieval.passage import ChunkingConfig, Passage, split_document
from retrieval.progress import Progress
from retrieval.sentences.store import SORTED_BATCHES, embed_passages

logger = logging.getLogger(__name__)

CHECKPOINT_PASSAGES = 2048


@dataclass(frozen=True, slots=True)
class BuildReport:
    """`skipped`: the files that could not be read, with the reason (the build went on)."""

    manifest: IndexManifest
    documents: int
    seconds: float
    reused: bool
    skipped: tuple[SkippedFile, ...] = ()


def _batches(passages: Iterator[Passage], size: int) -> Iterator[list[Passage]]:
    batch: list[Passage] = []
    for passage in passages:
        batch.append(passage)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def index_is_current(
    directory: Path,
    checksum: str,
    embedder: Embedder,
    chunking: ChunkingConfig,
    lexical: bool = True,
) -> bool:
    """True when `directory` already holds an index of the corpus with this checksum, with this
    embedder and chunking."""
    if not (directory / "manifest.json").is_file():
        return False
    manifest = read_manifest(directory)
    return (
        manifest.format_version == FORMAT_VERSION
        and manifest.corpus_checksum == checksum
        and manifest.embedder == embedder.name
        and manifest.passage_tokens == chunking.passage_tokens
        and manifest.overlap_tokens == chunking.overlap_tokens
        and manifest.lexical_index == ("bm25" if lexical else None)
    )


def _build_key(checksum: str, embedder: Embedder, chunking: ChunkingConfig) -> str:
    """What a staging folder was built for; a resumed build must match it exactly."""
    identity = [
        FORMAT_VERSION,
        checksum,
        embedder.name,
        embedder.dimension,
        chunking.passage_tokens,
        chunking.overlap_tokens,
    ]
    return hashlib.sha256(json.dumps(identity).encode()).hexdigest()


def _record(
    corpus: DocumentSource, document: Document, ingest: str, hashes: dict[str, str]
) -> DocumentRecord:
    """The document's row in the table, its rows filled in at commit."""
    shown = corpus.file_of(document.doc_id)
    paths = dict(corpus.files()) if not hashes and shown else {}
    for name, path in paths.items():
        hashes[name] = file_hash(path)
    return incoming_record(
        document,
        origin="files",
        source=shown,
        file_hash=hashes.get(shown) if shown else None,
        ingest=ingest,
    )


def _embed_corpus(
    corpus: DocumentSource,
    writer: IndexWriter,
    records: dict[str, DocumentRecord],
    embedder: Embedder,
    chunking: ChunkingConfig,
    batch_size: int,
    total_documents: int,
    progress: bool,
) -> int:
    """Embed the documents the writer does not hold yet, checkpointing whole documents.

    Returns how many documents this call embedded.
    """
    skip = writer.resumed.documents
    embedded = 0
    ingest = document_ingest(chunking, corpus.source_url)
    hashes: dict[str, str] = {}
    # (documents split so far, passages they made), in order; consumed by checkpoints.
    split: deque[tuple[int, int]] = deque()
    shown = Progress(
        "documents parsed, passages embedded",
        total_documents,
        "documents",
        initial=skip,
        enabled=progress,
    )

    def passages() -> Iterator[Passage]:
        nonlocal embedded
        produced = writer.count
        for number, document in enumerate(corpus.documents(), start=1):
            records[document.doc_id] = _record(corpus, document, ingest, hashes)
            if number <= skip:
                continue
            for passage in split_document(document, embedder, chunking):
                produced += 1
                yield passage
            split.append((number, produced))
            embedded += 1
            shown.advance(1)

    checkpointed = writer.count
    with shown:
        for batch in _batches(passages(), batch_size * SORTED_BATCHES):
            writer.add(batch, embed_passages(batch, embedder, batch_size=batch_size))
            shown.advance(0, passages=writer.count)
            if writer.count - checkpointed >= CHECKPOINT_PASSAGES:
                checkpointed = _checkpoint(writer, split, checkpointed)
    return embedded


def _checkpoint(writer: IndexWriter, split: deque[tuple[int, int]], previous: int) -> int:
    """Checkpoint the whole documents whose passages are all written; return their passages."""
    done: tuple[int, int] | None = None
    while split and split[0][1] <= writer.count:
        done = split.popleft()
    if done is None:
        return previous
    writer.checkpoint(*done)
    return done[1]


def build_index(
    corpus: Path | DocumentSource,
    out_dir: Path,
    embedder: Embedder,
    *,
    chunking: ChunkingConfig | None = None,
    ann: AnnConfig | None = None,
    lexical: bool = True,
    batch_size: int = 64,
    progress: bool = True,
    force: bool = False,
) -> BuildReport:
    """Chunk, embed and index `corpus` into `out_dir` (replaced atomically at the end).

    `corpus`: a JSONL file, or a source from `retrieval.ingest.source.open_source` (files and
    folders), whose `skipped` lists what it could not read even when the build fails. An
    `out_dir` that already holds an index of the same corpus, embedder and chunking is kept as
    it is unless `force` is set.
    """
    if isinstance(corpus, Path):
        corpus = open_source([corpus])
    with WriterLock(out_dir):
        return _build(
            corpus, out_dir, embedder, chunking, ann, lexical, batch_size, progress, force
        )


def _build(
    corpus: DocumentSource,
    out_dir: Path,
    embedder: Embedder,
    chunking: ChunkingConfig | None,
    ann: AnnConfig | None,
    lexical: bool,
    batch_size: int,
    progress: bool,
    force: bool,
) -> BuildReport:
    chunking = chunking or ChunkingConfig()
    ann = ann or AnnConfig()
    started_s = time.monotonic()
    embedder.warm_up()
    checksum = corpus.checksum()
    if not force and index_is_current(out_dir, checksum, embedder, chunking, lexical):
        logger.info("index is current dir=%s", out_dir)
        return BuildReport(read_manifest(out_dir), 0, time.monotonic() - started_s, True)
    total_documents = corpus.expected_documents()
    if total_documents == 0:
        raise RetrievalError(f"{corpus.name or 'the paths given'} holds no documents")
    key = _build_key(checksum, embedder, chunking)
    writer = IndexWriter(out_dir, embedder.dimension, key)
    try:
        records: dict[str, DocumentRecord] = {}
        documents = _embed_corpus(
            corpus, writer, records, embedder, chunking, batch_size, total_documents, progress
        )
        if writer.count == 0:
            raise RetrievalError(f"{corpus.name or 'the paths given'} holds no text to index")
        kind = ann.resolve(writer.count)
        manifest = IndexManifest(
            embedder=embedder.name,
            dimension=embedder.dimension,
            passage_count=writer.count,
            corpus_checksum=checksum,
            corpus_name=corpus.name,
            passage_tokens=chunking.passage_tokens,
            overlap_tokens=chunking.overlap_tokens,
            index_type=kind,
            nlist=ann.lists_for(writer.count) if kind == "ivf" else None,
            hnsw_m=ann.hnsw_m if kind == "hnsw" else None,
            lexical_index="bm25" if lexical else None,
        )
        writer.commit(manifest, ann, records, progress=progress)
    except BaseException:
        writer.close()
        raise
    seconds = time.monotonic() - started_s
    logger.info("index built dir=%s passages=%d seconds=%.1f", out_dir, writer.count, seconds)
    return BuildReport(manifest, documents, seconds, False, corpus.skipped)
