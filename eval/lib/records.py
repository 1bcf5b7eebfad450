"""Committed results as a small summary JSON with its per-request records beside it.

A command's `--out` file holds everything: metrics, configuration, and the per-request records
under `requests` (or `records`): a list, or lists by level, configuration or variant. Those
records are most of the bytes, so a result committed to the repository is split:

- `NAME.json`: every key but the records, in the same order, the records' key replaced by
  `records_file`: `{"path": "NAME.requests.jsonl.gz", "key": "requests", "records": N}`, and
  where the records were grouped (by level, configuration, variant) `"groups": [names]`;
- `NAME.<key>.jsonl.gz` beside it: one record per line, in the order they were written; a
  grouped record also names its group under `group`. gzip's header carries no name and no
  time, so the same records give the same bytes.

`with_records` puts a summary back together, so whatever reads a result reads either form.

    python -m eval.lib.records docs/benchmarks/planner-goodput.json ...   # split in place
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

RECORDS_FILE = "records_file"
RECORD_KEYS = ("requests", "records")
GROUP = "group"


class RecordsError(Exception):
    """A result's records cannot be split off or read back; the message says why."""


def _records_key(result: dict[str, Any]) -> str | None:
    for key in RECORD_KEYS:
        value = result.get(key)
        if isinstance(value, list) and value:
            return key
        if isinstance(value, dict) and value and all(isinstance(v, list) for v in value.values()):
            return key
    return None


def _lines(records: list[Any] | dict[str, list[Any]]) -> list[str]:
    if isinstance(records, list):
        return [json.dumps(record) for record in records]
    lines = []
    for group, members in records.items():
        for record in members:
            if not isinstance(record, dict) or GROUP in record:
                raise RecordsError(f"a record of {group!r} is not an object without `{GROUP}`")
            lines.append(json.dumps({GROUP: group, **record}))
    return lines


def gzip_bytes(text: str) -> bytes:
    """`text` gzipped with no file name and time 0 in the header: the same text, the same bytes."""
    buffer = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buffer, compresslevel=9, mtime=0) as out:
        out.write(text.encode("utf-8"))
    return buffer.getvalue()


def split(path: Path) -> Path | None:
    """Move the records of the result at `path` into a gzipped JSONL file beside it and rewrite
    `path` as the summary; returns the records file, or None when there were no records."""
    result = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(result, dict) or RECORDS_FILE in result:
        return None
    key = _records_key(result)
    if key is None:
        return None
    records = result[key]
    lines = _lines(records)
    target = path.with_name(f"{path.stem}.{key}.jsonl.gz")
    pointer: dict[str, Any] = {"path": target.name, "key": key, "records": len(lines)}
    if isinstance(records, dict):
        pointer["groups"] = list(records)
    summary = {
        (RECORDS_FILE if name == key else name): (pointer if name == key else value)
        for name, value in result.items()
    }
    target.write_bytes(gzip_bytes("".join(line + "\n" for line in lines)))
    path.write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    return target


def _read_lines(target: Path) -> list[Any]:
    try:
        with gzip.open(target, "rt", encoding="utf-8") as lines:
            return [json.loads(line) for line in lines if line.strip()]
    except (OSError, EOFError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RecordsError(f"cannot read its records file {target}: {exc}") from exc


def with_records(result: dict[str, Any], folder: Path) -> dict[str, Any]:
    """`result` as its command wrote it: a summary's records read back from `folder`; any
    other result unchanged."""
    pointer = result.get(RECORDS_FILE)
    if pointer is None:
        return result
    if not isinstance(pointer, dict) or not isinstance(name := pointer.get("path"), str):
        raise RecordsError(f"`{RECORDS_FILE}` is not an object with a `path`")
    if Path(name).name != name:
        raise RecordsError(f"`{RECORDS_FILE}.path` {name!r} is not a file name beside the summary")
    key = str(pointer.get("key", "requests"))
    lines = _read_lines(folder / name)
    records: list[Any] | dict[str, list[Any]] = lines
    if (groups := pointer.get("groups")) is not None:
        grouped: dict[str, list[Any]] = {str(group): [] for group in groups}
        for line in lines:
            group = line.pop(GROUP, None) if isinstance(line, dict) else None
            if group not in grouped:
                raise RecordsError(f"a record of group {group!r}, not one of {list(grouped)}")
            grouped[group].append(line)
        records = grouped
    restored = {(key if field == RECORDS_FILE else field): value for field, value in result.items()}
    restored[key] = records  # in the place the pointer held
    return restored


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m eval.lib.records", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("results", type=Path, nargs="+", help="result JSON files, split in place")
    for path in parser.parse_args(argv).results:
        target = split(path)
        print(f"{path}: {'no records' if target is None else f'records in {target.name}'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
