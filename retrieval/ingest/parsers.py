"""One parser per file format, behind `FileParser`, chosen by the file's name."""

from __future__ import annotations

from pathlib import PurePath
from typing import Literal, Protocol

from retrieval.ingest.html_parser import HtmlParser
from retrieval.ingest.markdown_parser import MarkdownParser
from retrieval.ingest.parsed import ParsedFile
from retrieval.ingest.pdf_parser import PdfParser
from retrieval.ingest.text_parser import TextParser

FileFormat = Literal["html", "markdown", "text", "pdf", "jsonl"]

# Bump when a parser's output changes: an index built by an older parser is then not current.
PARSER_VERSION = 2  # 2: HTML blocks as paragraphs, table rows as lines, admonitions

_SUFFIXES: dict[str, FileFormat] = {
    ".html": "html",
    ".htm": "html",
    ".xhtml": "html",
    ".md": "markdown",
    ".markdown": "markdown",
    ".txt": "text",
    ".text": "text",
    ".pdf": "pdf",
    ".jsonl": "jsonl",
}


class FileParser(Protocol):
    def parse(self, data: bytes, name: str) -> ParsedFile:
        """The file's sections; raises `UnreadableFileError` with the reason it cannot."""
        ...


def format_of(path: PurePath) -> FileFormat | None:
    """The format a file's name says, or None for a file `index build` does not read."""
    suffixes = [suffix.lower() for suffix in path.suffixes]
    if suffixes[-2:] == [".jsonl", ".gz"]:
        return "jsonl"
    return _SUFFIXES.get(suffixes[-1]) if suffixes else None


def parser_for(file_format: Literal["html", "markdown", "text", "pdf"]) -> FileParser:
    parsers: dict[str, type[FileParser]] = {
        "html": HtmlParser,
        "markdown": MarkdownParser,
        "text": TextParser,
        "pdf": PdfParser,
    }
    return parsers[file_format]()
