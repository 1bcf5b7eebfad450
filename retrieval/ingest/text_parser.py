"""Plain text files: one section, titled with the file's name (its text has no headings to trust)."""

from __future__ import annotations

from retrieval.ingest.decoding import decode_text
from retrieval.ingest.parsed import ParsedFile, Section


class TextParser:
    def parse(self, data: bytes, name: str) -> ParsedFile:
        text = decode_text(data).strip()
        return ParsedFile(name, (Section((name,), text),))
