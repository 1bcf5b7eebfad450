"""Resumable runs: each finished item is appended to a JSONL file beside the output, so an
interrupted run picks up where it stopped. The file is removed once the result is written."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


class RunCheckpoint:
    def __init__(self, out: Path, identity: dict[str, Any]) -> None:
        self.path = out.with_name(out.name + ".partial.jsonl")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._identity = json.dumps(identity, sort_keys=True)
        self.done: dict[str, Any] = self._load()
        self._file = self.path.open("a", encoding="utf-8")
        if not self.done:
            self._file.write(json.dumps({"identity": self._identity}) + "\n")
            self._file.flush()

    def _load(self) -> dict[str, Any]:
        """What a previous run of the same identity finished; anything else starts afresh."""
        if not self.path.is_file():
            return {}
        lines = self.path.read_text(encoding="utf-8").splitlines()
        try:
            header = json.loads(lines[0]) if lines else {}
        except json.JSONDecodeError:
            header = {}
        if header.get("identity") != self._identity:
            self.path.unlink()
            return {}
        done: dict[str, Any] = {}
        for line in lines[1:]:
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                break  # a line cut short by the interruption
            done[record["key"]] = record["value"]
        return done

    def record(self, key: str, value: Any) -> None:
        self.done[key] = value
        self._file.write(json.dumps({"key": key, "value": value}) + "\n")
        self._file.flush()

    def finish(self) -> None:
        self._file.close()
        self.path.unlink(missing_ok=True)

    def close(self) -> None:
        self._file.close()
