"""What a parser makes of one file: its title, its own URL if it declares one, and its sections."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Section:
    """Text under one heading path (page title first). `anchor` is the fragment that links to it
    in an HTML or Markdown page; `page` the 1-based PDF page it is on (a section that runs over
    pages is one `Section` a page, so each passage knows its page)."""

    heading_path: tuple[str, ...]
    text: str
    anchor: str | None = None
    page: int | None = None


@dataclass(frozen=True, slots=True)
class ParsedFile:
    """`url`: the page's own address (an HTML canonical link, Markdown front matter `url:`);
    `tags` and `modified` (ISO 8601) where the file declares them (Markdown front matter), else
    None: the file source then takes its folders and its mtime."""

    title: str
    sections: tuple[Section, ...]
    url: str | None = None
    tags: tuple[str, ...] | None = None
    modified: str | None = None
    # The parser dropped navigation with text in it (an HTML page's table of contents, its
    # navigation bars): a page with no other text is a navigation page, not an empty one.
    navigation: bool = False

    @property
    def has_text(self) -> bool:
        return any(section.text.strip() for section in self.sections)
