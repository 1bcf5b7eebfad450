"""Committed results split into a summary and its gzipped records (`eval/lib/records.py`)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from eval.lib.records import RecordsError, main, split, with_records


def _result(requests: object) -> dict[str, Any]:
    return {
        "command": "planner-goodput",
        "metrics": {"goodput_rps": 0.7},
        "config": {"rates": [0.7, 1.4]},
        "requests": requests,
        "timestamp": "2026-11-30T00:00:00+00:00",
    }


GROUPED = {
    "deep": [{"question_id": "q1", "ttft_ms": 900.5}, {"question_id": "q2", "ttft_ms": None}],
    "empty": [],
    "planner": [{"question_id": "q1", "answer": "Paris \u00e9t\u00e9 [1]"}],
}


@pytest.mark.parametrize("requests", [GROUPED, [{"question_id": "q1", "itl_ms": [1.5, 2.0]}]])
def test_a_split_result_reads_back_as_written(tmp_path: Path, requests: object) -> None:
    path = tmp_path / "run.json"
    written = _result(requests)
    path.write_text(json.dumps(written))

    target = split(path)

    assert target == tmp_path / "run.requests.jsonl.gz"
    summary = json.loads(path.read_text())
    assert list(summary) == ["command", "metrics", "config", "records_file", "timestamp"]
    assert summary["records_file"]["path"] == "run.requests.jsonl.gz"
    assert summary["records_file"]["records"] == (3 if isinstance(requests, dict) else 1)
    restored = with_records(summary, tmp_path)
    assert restored == written
    assert list(restored) == list(written)


def test_the_records_file_is_the_same_bytes_every_time(tmp_path: Path) -> None:
    contents = []
    for name in ("a", "b"):
        path = tmp_path / name / "run.json"
        path.parent.mkdir()
        path.write_text(json.dumps(_result(GROUPED)))
        target = split(path)
        assert target is not None
        contents.append(target.read_bytes())
    assert contents[0] == contents[1]
    with gzip.open(tmp_path / "a" / "run.requests.jsonl.gz", "rt") as lines:
        first = json.loads(next(lines))
    assert first == {"group": "deep", "question_id": "q1", "ttft_ms": 900.5}


def test_a_result_without_records_or_already_split_is_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "small.json"
    path.write_text(json.dumps({"command": "retrieval", "metrics": {}}))
    assert split(path) is None
    assert main([str(path)]) == 0
    split_once = tmp_path / "run.json"
    split_once.write_text(json.dumps(_result(GROUPED)))
    split(split_once)
    before = split_once.read_text()
    assert split(split_once) is None
    assert split_once.read_text() == before


def test_a_missing_or_misplaced_records_file_is_an_error(tmp_path: Path) -> None:
    summary = {"command": "load", "records_file": {"path": "gone.requests.jsonl.gz"}}
    with pytest.raises(RecordsError, match=r"gone\.requests\.jsonl\.gz"):
        with_records(summary, tmp_path)
    with pytest.raises(RecordsError, match="not a file name"):
        with_records({"records_file": {"path": "../elsewhere.jsonl.gz"}}, tmp_path)
