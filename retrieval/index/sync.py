"""`index sync`: bring an index up to date with the files and folders it was built from.

Every file under the paths given is hashed; a file whose bytes are unchanged (and that was
cut with the same parser, chunking and URL settings) is not read again and its documents keep
their passages, vectors and sentences. A changed or new file is parsed; of its documents, one
whose content is unchanged is kept too (a JSONL file with one line edited re-embeds that
line's document only). A document that came from a file under the paths given and is no longer
found there is removed. Documents put over HTTP, and documents from files outside the paths
given, are never removed by a sync.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from retrieval.embedder import Embedder
from retrieval.index.ann import AnnConfig
from retrieval.index.documents import DocumentRecord, document_ingest, file_hash
from retrieval.index.generations import WriterLock
from retrieval.index.revision import (
    Base,
    Incoming,
    Revision,
    clear_staging,
    incoming_record,
    revise,
)
from retrieval.ingest.scan import SkippedFile
from retrieval.ingest.source import IngestOptions, open_source

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class SyncReport:
    """`added`/`changed`/`removed`/`unchanged`: documents; `revision`: what was published."""

    added: int
    changed: int
    removed: int
    unchanged: int
    revision: Revision
    skipped: tuple[SkippedFile, ...] = ()


def sync_index(
    paths: Sequence[Path],
    index_dir: Path,
    embedder: Embedder,
    *,
    options: IngestOptions | None = None,
    ann: AnnConfig | None = None,
    batch_size: int = 64,
    progress: bool = True,
) -> SyncReport:
    """Re-scan `paths` and publish a new generation of `index_dir` with what changed.

    Raises `IndexBusyError` while another build or sync writes `index_dir`, and
    `IndexMismatchError` for an index of another embedder or one without a documents table."""
    options = options or IngestOptions()
    with WriterLock(index_dir):
        clear_staging(index_dir)
        embedder.warm_up()
        base = Base.read(index_dir, embedder)
        source = open_source(paths, options)
        ingest = document_ingest(base.chunking, options.source_url)
        hashes = {shown: file_hash(path) for shown, path in source.files()}
        by_source: dict[str | None, list[DocumentRecord]] = defaultdict(list)
        for record in base.records:
            by_source[record.source].append(record)
        unchanged_files = {
            shown
            for shown, digest in hashes.items()
            if by_source.get(shown)
            and all(_same_file(r, digest, ingest, options.collection) for r in by_source[shown])
        }
        found: dict[str, Incoming] = {}
        for document in source.documents(
            only=[shown for shown in hashes if shown not in unchanged_files]
        ):
            shown = source.file_of(document.doc_id)
            record = incoming_record(
                document,
                origin="files",
                source=shown,
                file_hash=hashes.get(shown) if shown else None,
                ingest=ingest,
            )
            found[document.doc_id] = Incoming(document, record)
        roots = [_shown_root(path) for path in paths]
        # A file that could not be read this time keeps what an earlier sync made of it.
        # A navigation page was read: what an earlier version of it made goes.
        unreadable = {file.path for file in source.skipped if not file.navigation_only}
        keep: list[DocumentRecord] = []
        unchanged = changed = removed = 0
        for record in base.records:
            fresh = found.get(record.doc_id)
            if fresh is not None:
                if _same_content(record, fresh.record):
                    keep.append(replace(fresh.record, first_row=record.first_row, rows=record.rows))
                    del found[record.doc_id]
                    unchanged += 1
                else:
                    changed += 1
            elif record.source in unchanged_files or record.source in unreadable:
                keep.append(record)
                unchanged += 1
            elif record.origin == "files" and _under(record.source, roots):
                removed += 1  # its file is gone, or no longer makes this document
            else:
                keep.append(record)
        added = len(found) - changed
        revision = revise(
            index_dir,
            base,
            keep,
            list(found.values()),
            embedder,
            ann=ann,
            batch_size=batch_size,
            progress=progress,
        )
    logger.info(
        "index synced dir=%s added=%d changed=%d removed=%d unchanged=%d seconds=%.1f",
        index_dir,
        added,
        changed,
        removed,
        unchanged,
        revision.seconds,
    )
    return SyncReport(added, changed, removed, unchanged, revision, source.skipped)


def _same_file(record: DocumentRecord, digest: str, ingest: str, collection: str) -> bool:
    return (
        record.origin == "files"
        and record.file_hash == digest
        and record.ingest == ingest
        and record.collection == collection
    )


def _same_content(old: DocumentRecord, new: DocumentRecord) -> bool:
    return old.content_hash == new.content_hash and old.ingest == new.ingest


def _shown_root(path: Path) -> str:
    """How the files under `path` are shown (retrieval/ingest/scan.py): a folder by its name
    and the path inside it, a file alone by its name."""
    resolved = path.resolve()
    return f"{resolved.name}/" if resolved.is_dir() else resolved.name


def _under(source: str | None, roots: Sequence[str]) -> bool:
    return source is not None and any(
        source == root or (root.endswith("/") and source.startswith(root)) for root in roots
    )
