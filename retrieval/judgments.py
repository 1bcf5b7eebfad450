"""Relevance judgments in the BEIR layout: queries (JSONL `_id`, `text`) and qrels (TSV with
the header `query-id corpus-id score`), each plain or gzipped. Bad lines are refused with their
line number.

A query line may also say what answers it: `answers`, a list of strings, at the top level or in
its `metadata` (the project's question files, with `question` for `text`, read as they are).
Training a reranker uses them to keep passages that hold an answer out of its negatives."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from retrieval.errors import CorpusFormatError
from retrieval.jsonl import json_objects, open_text, unique_id

QRELS_HEADER = ("query-id", "corpus-id", "score")


@dataclass(frozen=True, slots=True)
class Query:
    query_id: str
    text: str
    answers: tuple[str, ...] = ()


def read_queries(path: Path) -> list[Query]:
    queries: list[Query] = []
    seen: set[str] = set()
    for line_no, record in json_objects(path):
        query_id = unique_id(path, line_no, record, seen)
        text = record.get("text", record.get("question"))
        if not isinstance(text, str) or not text.strip():
            raise CorpusFormatError(path, line_no, "`text` must be a non-empty string")
        queries.append(Query(query_id, text, _answers(path, line_no, record)))
    return queries


def _answers(path: Path, line_no: int, record: dict[str, object]) -> tuple[str, ...]:
    metadata = record.get("metadata")
    raw = record.get("answers", metadata.get("answers") if isinstance(metadata, dict) else None)
    if raw is None:
        return ()
    if not isinstance(raw, list) or not all(isinstance(a, str) for a in raw):
        raise CorpusFormatError(path, line_no, "`answers` must be a list of strings")
    return tuple(a for a in raw if a.strip())


def read_qrels(path: Path) -> dict[str, dict[str, int]]:
    """{query id: {document id: grade}}, grades as given (> 0 means relevant)."""
    qrels: dict[str, dict[str, int]] = {}
    with open_text(path) as lines:
        header = next(lines, "").rstrip("\n").split("\t")
        if tuple(header) != QRELS_HEADER:
            raise CorpusFormatError(
                path, 1, f"expected the header {' '.join(QRELS_HEADER)!r} (tab-separated)"
            )
        for line_no, line in enumerate(lines, start=2):
            if not line.strip():
                continue
            fields = line.rstrip("\n").split("\t")
            if len(fields) != 3:
                raise CorpusFormatError(
                    path, line_no, f"expected 3 tab-separated fields, got {len(fields)}"
                )
            query_id, doc_id, grade = fields
            try:
                qrels.setdefault(query_id, {})[doc_id] = int(grade)
            except ValueError as exc:
                raise CorpusFormatError(
                    path, line_no, f"score {grade!r} is not an integer"
                ) from exc
    return qrels
