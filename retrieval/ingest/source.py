"""Where a build's documents come from, behind `DocumentSource`: a JSONL corpus given alone
(read exactly as before), or files and folders (`FileSource`)."""

from __future__ import annotations

from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from retrieval.corpus import Document
from retrieval.ingest.file_source import FileSource
from retrieval.ingest.jsonl_source import JsonlSource
from retrieval.ingest.parsers import format_of
from retrieval.ingest.scan import SkippedFile, scan


@dataclass(frozen=True, slots=True)
class IngestOptions:
    """`collection`: recorded on every document; `source_url`: a URL prefix the files' paths
    inside the folders given are appended to (pages that declare their own URL keep it)."""

    collection: str = "default"
    source_url: str | None = None

    def __post_init__(self) -> None:
        if not self.collection.strip():
            raise ValueError("collection must not be empty")


class DocumentSource(Protocol):
    @property
    def name(self) -> str:
        """What the manifest records as the corpus's name."""
        ...

    @property
    def source_url(self) -> str | None:
        """The URL prefix its files' paths are appended to, if any."""
        ...

    @property
    def skipped(self) -> tuple[SkippedFile, ...]:
        """What could not be read, with the reason; complete once `documents()` has run."""
        ...

    def checksum(self) -> str:
        """Changes whenever the documents a build would make change."""
        ...

    def expected_documents(self) -> int:
        """About how many documents `documents()` yields (a progress total)."""
        ...

    def documents(self, only: Collection[str] | None = None) -> Iterator[Document]:
        """The documents, always in the same order for the same input; `only`: of these
        files (as `files()` names them)."""
        ...

    def files(self) -> list[tuple[str, Path]]:
        """Every file read, as shown to users, and its path."""
        ...

    def file_of(self, doc_id: str) -> str | None:
        """The file (as `files()` shows it) a document `documents()` yielded came from."""
        ...


def open_source(paths: Sequence[Path], options: IngestOptions | None = None) -> DocumentSource:
    options = options or IngestOptions()
    if len(paths) == 1 and paths[0].is_file() and format_of(paths[0]) == "jsonl":
        return JsonlSource(paths[0], options.collection)
    return FileSource(scan(paths), options.collection, options.source_url)
