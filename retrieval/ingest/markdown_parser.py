"""Markdown files: front matter, then sections at the headings (markdown-it-py, CommonMark).

The text indexed is what a reader sees: inline markup, link targets and HTML blocks are dropped,
code is kept. Front matter (YAML) may give `title:` and `url:`; without a title the first
level-1 heading is the page title, else the file's name. Anchors are GitHub's heading slugs
(lower case, punctuation dropped, spaces to hyphens, `-1`, `-2` for repeats).
"""

from __future__ import annotations

import datetime
import re
from typing import Any

import yaml
from markdown_it import MarkdownIt
from markdown_it.token import Token
from mdit_py_plugins.front_matter import front_matter_plugin

from retrieval.errors import UnreadableFileError
from retrieval.ingest.decoding import decode_text
from retrieval.ingest.parsed import ParsedFile, Section

_SLUG_DROP = re.compile(r"[^\w\- ]", re.UNICODE)


class MarkdownParser:
    def __init__(self) -> None:
        self._markdown = MarkdownIt("commonmark").use(front_matter_plugin)

    def parse(self, data: bytes, name: str) -> ParsedFile:
        tokens = self._markdown.parse(decode_text(data))
        meta = _front_matter(tokens)
        title = _string(meta.get("title")) or _first_h1(tokens) or name
        url = _string(meta.get("url"))
        modified = _date(meta.get("modified", meta.get("date")))
        sections = tuple(_sections(tokens, title))
        return ParsedFile(title, sections, url, _tags(meta.get("tags")), modified)


def _front_matter(tokens: list[Token]) -> dict[str, Any]:
    if not tokens or tokens[0].type != "front_matter":
        return {}
    try:
        meta = yaml.safe_load(tokens[0].content)
    except yaml.YAMLError as exc:
        raise UnreadableFileError(f"front matter is not valid YAML: {exc}") from exc
    return meta if isinstance(meta, dict) else {}


def _string(value: object) -> str | None:
    return value.strip() or None if isinstance(value, str) else None


def _tags(value: object) -> tuple[str, ...] | None:
    """Front matter `tags:` as a list, or as one string of comma-separated tags."""
    if isinstance(value, str):
        value = value.split(",")
    if not isinstance(value, list):
        return None
    return tuple(dict.fromkeys(tag for item in value if (tag := str(item).strip())))


def _date(value: object) -> str | None:
    """A front matter date (YAML gives a date or datetime for an unquoted one) as ISO 8601."""
    if isinstance(value, datetime.datetime | datetime.date):
        return value.isoformat()
    return _string(value)


def _first_h1(tokens: list[Token]) -> str | None:
    for at, token in enumerate(tokens):
        if token.type == "heading_open" and token.tag == "h1":
            return _inline_text(tokens[at + 1]) or None
    return None


def _sections(tokens: list[Token], title: str) -> list[Section]:
    sections: list[Section] = []
    path: list[tuple[int, str]] = []
    anchor: str | None = None
    lines: list[str] = []
    slugs: dict[str, int] = {}

    def close() -> None:
        if lines:
            heading_path = (title, *(text for _, text in path))
            sections.append(Section(heading_path, "\n".join(lines), anchor))
        lines.clear()

    at = 0
    while at < len(tokens):
        token = tokens[at]
        if token.type == "heading_open":
            close()
            level, text = int(token.tag[1:]), _inline_text(tokens[at + 1])
            while path and path[-1][0] >= level:
                path.pop()
            if path or text != title:
                path.append((level, text))
            anchor = _slug(text, slugs)
            at += 3  # heading_open, inline, heading_close
            continue
        if token.type == "inline":
            text = _inline_text(token)
            if text:
                lines.append(text)
        elif token.type in ("fence", "code_block") and token.content.strip():
            lines.append(token.content.rstrip("\n"))
        at += 1
    close()
    return sections


def _inline_text(token: Token) -> str:
    parts: list[str] = []
    for child in token.children or ():
        if child.type in ("text", "code_inline"):
            parts.append(child.content)
        elif child.type in ("softbreak", "hardbreak"):
            parts.append(" ")
        elif child.type == "image":
            parts.append(child.content)
    return " ".join("".join(parts).split())


def _slug(text: str, seen: dict[str, int]) -> str:
    slug = _SLUG_DROP.sub("", text.lower()).replace(" ", "-")
    count = seen.get(slug, 0)
    seen[slug] = count + 1
    return slug if count == 0 else f"{slug}-{count}"
