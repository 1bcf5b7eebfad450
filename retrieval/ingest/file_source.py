"""Files and folders as a document source: one document per file (a JSONL file: one per line),
its sections from the file's parser, each section's URL from the page's own (canonical link,
front matter) or from `--source-url` and the file's path."""

from __future__ import annotations

import datetime
import hashlib
import json
import logging
from collections.abc import Collection, Iterator
from pathlib import Path, PurePosixPath
from urllib.parse import quote, urldefrag, urljoin, urlsplit

from retrieval.corpus import Document, DocumentSection, read_corpus
from retrieval.errors import CorpusFormatError, UnreadableFileError
from retrieval.ingest.parsed import ParsedFile
from retrieval.ingest.parsers import PARSER_VERSION, parser_for
from retrieval.ingest.scan import Scan, SkippedFile, SourceFile

logger = logging.getLogger(__name__)

_SECTION_BREAK = "\n\n"


class FileSource:
    def __init__(self, found: Scan, collection: str = "default", source_url: str | None = None):
        self.found = found
        self.collection = collection
        self.source_url = source_url
        self._skipped: list[SkippedFile] = []
        self._file_of: dict[str, str] = {}

    @property
    def name(self) -> str:
        return ", ".join(sorted({file.shown.split("/")[0] for file in self.found.files}))

    @property
    def skipped(self) -> tuple[SkippedFile, ...]:
        """The paths given that were skipped, then the files `documents()` could not read."""
        return (*self.found.skipped, *self._skipped)

    def checksum(self) -> str:
        """Of every file's path and bytes, the collection, the URL prefix and the parsers."""
        digest = hashlib.sha256()
        settings = [PARSER_VERSION, self.collection, self.source_url]
        digest.update(json.dumps(settings).encode())
        for file in self.found.files:
            digest.update(f"\n{file.shown}\n".encode())
            digest.update(hashlib.sha256(file.path.read_bytes()).digest())
        return f"sha256:{digest.hexdigest()}"

    def expected_documents(self) -> int:
        return len(self.found.files)

    def documents(self, only: Collection[str] | None = None) -> Iterator[Document]:
        self._skipped = []
        self._file_of = {}
        seen: set[str] = set()
        for file in self.found.files:
            if only is not None and file.shown not in only:
                continue
            for document in self._read(file):
                if document.doc_id in seen:
                    self._skip(file, f"duplicate document id {document.doc_id!r}")
                    continue
                seen.add(document.doc_id)
                self._file_of[document.doc_id] = file.shown
                yield document

    def files(self) -> list[tuple[str, Path]]:
        return [(file.shown, file.path) for file in self.found.files]

    def file_of(self, doc_id: str) -> str | None:
        return self._file_of.get(doc_id)

    def _read(self, file: SourceFile) -> Iterator[Document]:
        if file.file_format == "jsonl":
            try:
                yield from read_corpus(file.path, self.collection)
            except CorpusFormatError as exc:
                self._skip(file, f"line {exc.line_no}: {exc.reason} (the lines before it are in)")
            return
        try:
            parsed = parser_for(file.file_format).parse(file.path.read_bytes(), file.path.name)
        except UnreadableFileError as exc:
            self._skip(file, exc.reason)
            return
        except OSError as exc:
            self._skip(file, f"cannot read it: {exc.strerror or exc}")
            return
        if not parsed.has_text and parsed.navigation:
            logger.info("navigation page not indexed path=%s", file.shown)
            reason = "only navigation (a table of contents), nothing to index"
            self._skipped.append(SkippedFile(file.shown, reason, navigation_only=True))
            return
        if not parsed.has_text:
            self._skip(file, "no text in it")
            return
        yield self._document(file, parsed)

    def _skip(self, file: SourceFile, reason: str) -> None:
        logger.warning("file skipped path=%s reason=%s", file.shown, reason)
        self._skipped.append(SkippedFile(file.shown, reason))

    def _document(self, file: SourceFile, parsed: ParsedFile) -> Document:
        return document_of(
            parsed,
            doc_id=file.shown.replace("#", "%23"),
            path=file.shown,
            collection=self.collection,
            page_url=self._page_url(file, parsed),
            tags=parsed.tags if parsed.tags is not None else folder_tags(file.relative),
            modified=parsed.modified or _mtime(file),
        )

    def _page_url(self, file: SourceFile, parsed: ParsedFile) -> str | None:
        """The page's own URL if it is absolute (or made so by the prefix), else prefix + path."""
        from_prefix = None
        if self.source_url:
            from_prefix = f"{self.source_url.rstrip('/')}/{quote(file.relative)}"
        own = parsed.url
        if own and not urlsplit(own).scheme and from_prefix:
            own = urljoin(from_prefix, own)
        if own and urlsplit(own).scheme:
            return urldefrag(own).url
        return from_prefix


def folder_tags(relative: str) -> tuple[str, ...]:
    """A file's tags when it declares none: the folders it lies in below the folder given
    (`guide/admin/backup.md` → `guide`, `admin`); a file given alone has none."""
    return tuple(PurePosixPath(relative).parent.parts)


def _mtime(file: SourceFile) -> str | None:
    try:
        seconds = file.path.stat().st_mtime
    except OSError:
        return None
    return datetime.datetime.fromtimestamp(seconds, datetime.UTC).isoformat(timespec="seconds")


def document_of(
    parsed: ParsedFile,
    *,
    doc_id: str,
    path: str | None,
    collection: str,
    page_url: str | None,
    tags: tuple[str, ...],
    modified: str | None,
) -> Document:
    """A parsed file as a document: its sections' texts joined, each section with its span,
    heading path and URL (`page_url` and the section's anchor or page)."""
    parts: list[str] = []
    sections: list[DocumentSection] = []
    start = 0
    for section in parsed.sections:
        if not section.text.strip():
            continue
        if parts:
            start += len(_SECTION_BREAK)
        parts.append(section.text)
        end = start + len(section.text)
        url = None
        if page_url is not None:
            fragment = section.anchor or (f"page={section.page}" if section.page else "")
            url = f"{page_url}#{fragment}" if fragment else page_url
        sections.append(
            DocumentSection(start, end, section.heading_path, section.anchor, section.page, url)
        )
        start = end
    return Document(
        doc_id=doc_id,
        title=parsed.title,
        text=_SECTION_BREAK.join(parts),
        sections=tuple(sections),
        path=path,
        collection=collection,
        tags=tags,
        modified=modified,
    )
