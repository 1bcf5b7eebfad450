"""Reading JSONL files (plain or .gz) line by line, with the line number of anything bad."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from retrieval.errors import CorpusFormatError


def open_text(path: Path) -> IO[str]:
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8")
    return path.open("r", encoding="utf-8")


def json_objects(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(1-based line number, object) for each non-blank line; a line that is not a JSON object
    raises `CorpusFormatError` naming the file and line."""
    with open_text(path) as lines:
        for line_no, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise CorpusFormatError(path, line_no, f"not valid JSON ({exc.msg})") from exc
            if not isinstance(record, dict):
                raise CorpusFormatError(path, line_no, "expected a JSON object")
            yield line_no, record


def unique_id(path: Path, line_no: int, record: dict[str, Any], seen: set[str]) -> str:
    """The record's `_id`: a non-empty string not seen before in the file."""
    record_id = record.get("_id")
    if not isinstance(record_id, str) or not record_id.strip():
        raise CorpusFormatError(path, line_no, "`_id` must be a non-empty string")
    if record_id in seen:
        raise CorpusFormatError(path, line_no, f"duplicate `_id` {record_id!r}")
    seen.add(record_id)
    return record_id
