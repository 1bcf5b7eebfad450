from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from retrieval.errors import CorpusFormatError
from retrieval.judgments import Query, read_qrels, read_queries


def test_reads_queries_and_qrels(tmp_path: Path) -> None:
    queries = tmp_path / "q.jsonl"
    queries.write_text('{"_id": "1", "text": "what?"}\n\n{"_id": "2", "text": "why?", "x": 1}\n')
    qrels = tmp_path / "qrels.tsv"
    qrels.write_text("query-id\tcorpus-id\tscore\n1\td1\t1\n1\td2\t0\n2\td3\t2\n")
    assert read_queries(queries) == [Query("1", "what?"), Query("2", "why?")]
    assert read_qrels(qrels) == {"1": {"d1": 1, "d2": 0}, "2": {"d3": 2}}


@pytest.mark.parametrize(
    ("content", "line", "reason"),
    [
        ('{"_id": "1", "text": "a"}\n{oops\n', 2, "not valid JSON"),
        ('{"_id": "1", "text": "a"}\n{"_id": "1", "text": "b"}\n', 2, "duplicate `_id`"),
        ('{"text": "a"}\n', 1, "`_id` must be a non-empty string"),
        ('{"_id": "1", "text": " "}\n', 1, "`text` must be a non-empty string"),
    ],
)
def test_bad_query_lines_are_refused(tmp_path: Path, content: str, line: int, reason: str) -> None:
    path = tmp_path / "q.jsonl"
    path.write_text(content)
    with pytest.raises(CorpusFormatError, match=f"q.jsonl:{line}: {reason}"):
        read_queries(path)


@pytest.mark.parametrize(
    ("content", "line", "reason"),
    [
        ("qid\tdid\tscore\n", 1, "expected the header"),
        ("query-id\tcorpus-id\tscore\n1\td1\n", 2, "expected 3 tab-separated fields"),
        (
            "query-id\tcorpus-id\tscore\n1\td1\t1\n1\td2\thigh\n",
            3,
            "score 'high' is not an integer",
        ),
    ],
)
def test_bad_qrels_lines_are_refused(tmp_path: Path, content: str, line: int, reason: str) -> None:
    path = tmp_path / "qrels.tsv"
    path.write_text(content)
    with pytest.raises(CorpusFormatError, match=f"qrels.tsv:{line}: {reason}"):
        read_qrels(path)


def test_reads_question_files_with_answers_and_gzipped_qrels(tmp_path: Path) -> None:
    """The project's question files (`question`, top-level `answers`) and BEIR lines with
    `metadata.answers` read alike; qrels may be gzipped."""
    queries = tmp_path / "q.jsonl.gz"
    with gzip.open(queries, "wt") as out:
        out.write('{"_id": "1", "question": "who?", "answers": ["Ada", " "]}\n')
        out.write('{"_id": "2", "text": "when?", "metadata": {"answers": ["1843"]}}\n')
    qrels = tmp_path / "qrels.tsv.gz"
    with gzip.open(qrels, "wt") as out:
        out.write("query-id\tcorpus-id\tscore\n1\td1\t1\n")
    assert read_queries(queries) == [Query("1", "who?", ("Ada",)), Query("2", "when?", ("1843",))]
    assert read_qrels(qrels) == {"1": {"d1": 1}}


def test_answers_that_are_not_a_list_of_strings_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "q.jsonl"
    path.write_text('{"_id": "1", "text": "who?", "answers": "Ada"}\n')
    with pytest.raises(CorpusFormatError, match=r"q\.jsonl:1: `answers` must be a list of strings"):
        read_queries(path)
