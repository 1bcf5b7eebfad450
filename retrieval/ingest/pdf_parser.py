"""PDF files: each page's text layer (pypdfium2, PDFium's bindings), sectioned by the outline.

A page belongs to the outline entry that starts on it or last started before it; where an entry
starts inside a page and its title is found in the page's text, the page is cut there. Without
an outline, each page is a section under the document's title. A section is kept a page at a
time, so every passage knows its page. A PDF with no text on any page (scanned, no OCR here) is
refused, as is one PDFium cannot open (corrupt, encrypted).
"""

from __future__ import annotations

from dataclasses import dataclass

import pypdfium2

from retrieval.errors import UnreadableFileError
from retrieval.ingest.parsed import ParsedFile, Section

_MAX_OUTLINE_DEPTH = 6


@dataclass(frozen=True, slots=True)
class _Entry:
    page_index: int
    heading_path: tuple[str, ...]


class PdfParser:
    def parse(self, data: bytes, name: str) -> ParsedFile:
        try:
            pdf = pypdfium2.PdfDocument(data)
        except pypdfium2.PdfiumError as exc:
            raise UnreadableFileError(f"not a readable PDF ({exc})") from exc
        try:
            title = (pdf.get_metadata_dict().get("Title") or "").strip() or name
            pages = [_page_text(pdf, index) for index in range(len(pdf))]
            entries = _outline(pdf, title)
        finally:
            pdf.close()
        if not any(text.strip() for text in pages):
            raise UnreadableFileError(
                "no text layer (a scanned PDF?); OCR is not supported, give its text instead"
            )
        return ParsedFile(title, tuple(_sections(pages, entries, title)))


def _page_text(pdf: pypdfium2.PdfDocument, index: int) -> str:
    text_page = pdf[index].get_textpage()
    try:
        return str(text_page.get_text_bounded()).replace("\r\n", "\n").replace("\r", "\n")
    finally:
        text_page.close()


def _outline(pdf: pypdfium2.PdfDocument, title: str) -> list[_Entry]:
    """Outline entries that point at a page, in page order, each with its heading path."""
    entries: list[_Entry] = []
    path: list[str] = []
    for bookmark in pdf.get_toc(max_depth=_MAX_OUTLINE_DEPTH):
        heading = " ".join((bookmark.get_title() or "").split())
        del path[bookmark.level :]
        path.append(heading)
        dest = bookmark.get_dest()
        page_index = dest.get_index() if dest is not None else None
        if heading and page_index is not None and 0 <= page_index < len(pdf):
            entries.append(_Entry(page_index, (title, *path)))
    entries.sort(key=lambda entry: entry.page_index)  # stable: same-page entries keep order
    return entries


def _sections(pages: list[str], entries: list[_Entry], title: str) -> list[Section]:
    sections: list[Section] = []
    current: tuple[str, ...] = (title,)
    pending = list(reversed(entries))
    for index, text in enumerate(pages):
        start = 0
        while pending and pending[-1].page_index == index:
            entry = pending.pop()
            cut = text.find(entry.heading_path[-1], start)
            # What precedes a heading on its page is kept unless it is only a running header
            # or a page number.
            if cut > start and any(char.isalpha() for char in text[start:cut]):
                _add(sections, current, text[start:cut], index)
                start = cut
            current = entry.heading_path
        _add(sections, current, text[start:], index)
    return sections


def _add(sections: list[Section], path: tuple[str, ...], text: str, index: int) -> None:
    if text.strip():
        sections.append(Section(path, text.strip(), page=index + 1))
