"""Bytes to text: UTF-8 (with or without a BOM), or the encoding the file itself declares.

No guessing: a file that is neither UTF-8 nor declares its encoding is refused, since a wrong
guess indexes mojibake that no question will ever match.
"""

from __future__ import annotations

import codecs
import re

from retrieval.errors import UnreadableFileError

# How far into a file a declaration is looked for (the HTML standard's prescan reads 1024 bytes).
_PRESCAN_BYTES = 1024
_SNIFF_BYTES = 8192
# <meta charset="..."> or <meta http-equiv="Content-Type" content="...; charset=...">, and
# <?xml ... encoding="..."?>: what the HTML and XML standards let a page declare.
_DECLARATION = re.compile(
    rb"""<meta[^>]*?charset\s*=\s*["']?\s*([A-Za-z0-9._:-]+)|<\?xml[^>]*?encoding\s*=\s*["']([A-Za-z0-9._:-]+)""",
    re.IGNORECASE,
)


def check_not_binary(data: bytes) -> None:
    if not data.strip():
        raise UnreadableFileError("empty file")
    if b"\x00" in data[:_SNIFF_BYTES]:
        raise UnreadableFileError("binary file (NUL bytes), not text")


def decode_text(data: bytes, *, markup: bool = False) -> str:
    """`data` as text; `markup`: an HTML or XML page, whose declared encoding is honoured."""
    check_not_binary(data)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as utf8_error:
        declared = declared_encoding(data) if markup else None
        if declared is None:
            raise UnreadableFileError(
                f"not UTF-8 (byte {utf8_error.start}) and no encoding declared"
            ) from utf8_error
        try:
            return data.decode(declared)
        except (LookupError, UnicodeDecodeError) as exc:
            raise UnreadableFileError(f"not readable as its declared {declared}: {exc}") from exc


def declared_encoding(data: bytes) -> str | None:
    match = _DECLARATION.search(data[:_PRESCAN_BYTES])
    if match is None:
        return None
    name = (match.group(1) or match.group(2)).decode("ascii")
    try:
        return codecs.lookup(name).name
    except LookupError:
        return None
