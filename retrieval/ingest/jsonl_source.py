"""A JSONL corpus (`_id`, `title`, `text` a line) as a document source, read as it always was."""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Iterator
from pathlib import Path

from retrieval.corpus import Document, corpus_checksum, read_corpus
from retrieval.ingest.scan import SkippedFile


class JsonlSource:
    """A bad line fails the build (`CorpusFormatError`), as before files could be given."""

    def __init__(self, path: Path, collection: str = "default") -> None:
        self.path = path
        self.collection = collection

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def source_url(self) -> str | None:
        return None

    @property
    def skipped(self) -> tuple[SkippedFile, ...]:
        return ()

    def checksum(self) -> str:
        """The file's sha256, as before; with another collection than `default`, of both."""
        checksum = corpus_checksum(self.path)
        if self.collection == "default":
            return checksum
        both = f"{checksum}\ncollection={self.collection}".encode()
        return f"sha256:{hashlib.sha256(both).hexdigest()}"

    def expected_documents(self) -> int:
        return sum(1 for _ in read_corpus(self.path))

    def documents(self, only: Collection[str] | None = None) -> Iterator[Document]:
        if only is not None and self.name not in only:
            return iter(())
        return read_corpus(self.path, self.collection)

    def files(self) -> list[tuple[str, Path]]:
        return [(self.name, self.path)]

    def file_of(self, doc_id: str) -> str | None:
        return self.name
