"""HTML pages: the main text, cut into sections at its headings (selectolax over lexbor).

The main text is `<main>` (or `[role=main]`, else `<body>`) without scripts, styles, navigation,
headers, footers, asides and forms, nor DocBook's navigation bars and tables of contents
(PostgreSQL's manual). A heading's anchor is its own id, else that of the element it opens
(`<section id>`, DocBook's `<div class="sect1" id>`), else its permalink (`<a href="#...">`).

The text is written as the sentence splitter reads it (retrieval/sentences/splitter.py): each
block a paragraph of its own, after a blank line, so a definition's term ("max_connections
(integer)") stays a line above its paragraph and never runs into its first sentence; a table's
cells are one line per row, joined by " · ". An admonition's title ("Note", "Tip") is a line of
its section, not a heading: it opens no section, so the text after the admonition stays under
the heading it belongs to.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from selectolax.lexbor import LexborHTMLParser, LexborNode

from retrieval.errors import UnreadableFileError
from retrieval.ingest.decoding import decode_text
from retrieval.ingest.parsed import ParsedFile, Section

_HEADINGS = {f"h{level}": level for level in range(1, 7)}
_DROPPED = "script, style, noscript, template, nav, header, footer, aside, form, svg, button"
_DROPPED_ROLES = ("navigation", "banner", "contentinfo", "search", "complementary")
_DROPPED_CLASSES = ("navheader", "navfooter", "headerlink", "toc")
# DocBook's admonitions, whose title is a heading element.
_ADMONITIONS = frozenset(["note", "tip", "warning", "caution", "important"])
_CELLS = frozenset(["td", "th"])
_CELL_SEPARATOR = " \u00b7 "
_CELL_END = "\x00"
_BLOCKS = frozenset(
    [
        "address",
        "article",
        "blockquote",
        "br",
        "dd",
        "details",
        "div",
        "dl",
        "dt",
        "figcaption",
        "figure",
        "hr",
        "li",
        "main",
        "ol",
        "p",
        "section",
        "summary",
        "table",
        "tbody",
        "thead",
        "tr",
        "ul",
    ]
)
# Trailing permalink marks that generators put inside headings.
_PERMALINK_MARKS = " #¶\u00a7\U0001f517"


@dataclass(slots=True)
class _Sections:
    """Accumulates lines under the current heading path; a heading closes the section."""

    title: str
    path: list[tuple[int, str]] = field(default_factory=list)
    anchor: str | None = None
    lines: list[str] = field(default_factory=list)
    words: list[str] = field(default_factory=list)
    done: list[Section] = field(default_factory=list)

    def text(self, value: str) -> None:
        self.words.append(value)

    def line(self) -> None:
        cells = (" ".join(cell.split()) for cell in "".join(self.words).split(_CELL_END))
        if line := _CELL_SEPARATOR.join(cell for cell in cells if cell):
            self.lines.append(line)
        self.words = []

    def cell(self) -> None:
        """Ends a table cell: the row's cells, empty ones left out, make one line."""
        self.words.append(_CELL_END)

    def preformatted(self, value: str) -> None:
        self.line()
        if value.strip():
            self.lines.append(value.strip("\n"))

    def heading(self, level: int, text: str, anchor: str | None) -> None:
        self.close()
        while self.path and self.path[-1][0] >= level:
            self.path.pop()
        if self.path or text != self.title:
            self.path.append((level, text))
        self.anchor = anchor

    def close(self) -> None:
        self.line()
        if self.lines:
            heading_path = (self.title, *(text for _, text in self.path))
            self.done.append(Section(heading_path, "\n\n".join(self.lines), self.anchor))
        self.lines = []


class HtmlParser:
    def parse(self, data: bytes, name: str) -> ParsedFile:
        tree = LexborHTMLParser(decode_text(data, markup=True))
        title_node = tree.css_first("title")
        first_heading = tree.css_first("h1")
        title = _clean(title_node.text() if title_node is not None else "")
        if not title and first_heading is not None:
            title = _heading_text(first_heading)
        root = tree.css_first("main") or tree.css_first("[role=main]") or tree.body
        if root is None:
            raise UnreadableFileError("no <body> in the page")
        navigation = _drop_chrome(root)
        sections = _Sections(title or name)
        _walk(root, sections)
        sections.close()
        canonical = tree.css_first('link[rel="canonical"]')
        url = canonical.attributes.get("href") if canonical is not None else None
        return ParsedFile(title or name, tuple(sections.done), url or None, navigation=navigation)


def _drop_chrome(root: LexborNode) -> bool:
    """Drop what is not the page's own text; True when navigation with text was among it."""
    navigation = False
    for node in root.css(_DROPPED):
        navigation |= node.tag == "nav" and bool(node.text(strip=True))
        node.decompose()
    for role in _DROPPED_ROLES:
        for node in root.css(f'[role="{role}"]'):
            navigation |= role == "navigation" and bool(node.text(strip=True))
            node.decompose()
    for name in _DROPPED_CLASSES:
        for node in root.css(f".{name}"):
            navigation |= name != "headerlink" and bool(node.text(strip=True))
            node.decompose()
    return navigation


def _walk(node: LexborNode, sections: _Sections) -> None:
    for child in node.iter(include_text=True):
        tag = child.tag
        if tag == "-text":
            sections.text(child.text_content or "")
        elif tag in _HEADINGS and not _is_admonition(child.parent):
            sections.heading(_HEADINGS[tag], _heading_text(child), _anchor_of(child))
        elif tag == "pre":
            sections.preformatted(child.text(deep=True))
        elif tag in _CELLS:
            _walk(child, sections)
            sections.cell()
        elif tag is not None and not tag.startswith("-"):
            block = tag in _BLOCKS or tag in _HEADINGS
            if block:
                sections.line()
            _walk(child, sections)
            if block:
                sections.line()


def _is_admonition(node: LexborNode | None) -> bool:
    classes = (node.attributes.get("class") or "").split() if node is not None else []
    return not _ADMONITIONS.isdisjoint(classes)


def _heading_text(node: LexborNode) -> str:
    return _clean(node.text(deep=True)).rstrip(_PERMALINK_MARKS)


def _clean(text: str) -> str:
    return " ".join(text.split())


def _anchor_of(heading: LexborNode) -> str | None:
    if heading.id:
        return heading.id
    named = heading.css_first("a[id], a[name]")
    if named is not None:
        return named.attributes.get("id") or named.attributes.get("name")
    parent = heading.parent
    for _ in range(4):  # DocBook nests a heading four deep in the div it opens
        if parent is None:
            break
        first = parent.css_first(", ".join(_HEADINGS))
        if first is None or first.mem_id != heading.mem_id:
            break
        if parent.id:
            return parent.id
        parent = parent.parent
    link = heading.css_first('a[href^="#"]')
    href = link.attributes.get("href") if link is not None else None
    return href[1:] if href and len(href) > 1 else None
