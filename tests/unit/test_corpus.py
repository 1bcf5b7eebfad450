from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from retrieval.corpus import Document, corpus_checksum, read_corpus
from retrieval.errors import CorpusFormatError


def _write(tmp_path: Path, *lines: str, name: str = "corpus.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_reads_documents_and_skips_blank_lines(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        '{"_id": "a", "title": "A", "text": "alpha"}',
        "",
        '{"_id": "b", "text": "beta", "extra": 1}',
    )
    assert list(read_corpus(path)) == [Document("a", "A", "alpha"), Document("b", "", "beta")]


def test_reads_gzip(tmp_path: Path) -> None:
    path = tmp_path / "corpus.jsonl.gz"
    with gzip.open(path, "wt", encoding="utf-8") as handle:
        handle.write('{"_id": "a", "title": "A", "text": "alpha"}\n')
    assert [d.doc_id for d in read_corpus(path)] == ["a"]


@pytest.mark.parametrize(
    ("bad_line", "reason"),
    [
        ("{not json", "not valid JSON"),
        ('["a list"]', "expected a JSON object"),
        ('{"title": "x", "text": "y"}', "`_id` must be a non-empty string"),
        ('{"_id": 5, "text": "y"}', "`_id` must be a non-empty string"),
        ('{"_id": "a#1", "text": "y"}', "must not contain '#'"),
        ('{"_id": "z", "title": "x"}', "`text` must be a string"),
        ('{"_id": "z", "title": 3, "text": "y"}', "`title` must be a string"),
        ('{"_id": "first", "text": "again"}', "duplicate `_id`"),
    ],
)
def test_bad_line_is_rejected_with_its_number(tmp_path: Path, bad_line: str, reason: str) -> None:
    path = _write(tmp_path, '{"_id": "first", "text": "ok"}', "", bad_line)
    with pytest.raises(CorpusFormatError) as caught:
        list(read_corpus(path))
    assert caught.value.line_no == 3
    assert reason in str(caught.value)
    assert f"{path}:3:" in str(caught.value)


def test_checksum_tracks_content(tmp_path: Path) -> None:
    one = _write(tmp_path, '{"_id": "a", "text": "x"}', name="one.jsonl")
    two = _write(tmp_path, '{"_id": "a", "text": "y"}', name="two.jsonl")
    assert corpus_checksum(one).startswith("sha256:")
    assert corpus_checksum(one) != corpus_checksum(two)
    assert corpus_checksum(one) == corpus_checksum(one)
