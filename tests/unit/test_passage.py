from __future__ import annotations

import re
from collections.abc import Sequence

import pytest

from retrieval.corpus import Document
from retrieval.passage import ChunkingConfig, split_document


class WordSpanner:
    """Whitespace tokens, as character spans: a stand-in with the same contract."""

    def token_spans(self, text: str) -> Sequence[tuple[int, int]]:
        return [match.span() for match in re.finditer(r"\S+", text)]


def _doc(words: int) -> Document:
    return Document("doc", "Title", " ".join(f"w{i}" for i in range(words)))


def test_windows_overlap_and_have_stable_ids() -> None:
    passages = list(split_document(_doc(10), WordSpanner(), ChunkingConfig(4, 1)))
    assert [p.passage_id for p in passages] == ["doc#0", "doc#1", "doc#2"]
    assert [p.text for p in passages] == ["w0 w1 w2 w3", "w3 w4 w5 w6", "w6 w7 w8 w9"]
    assert all(p.title == "Title" and p.doc_id == "doc" for p in passages)
    assert [p.position for p in passages] == [0, 1, 2]


def test_text_is_the_exact_slice_of_the_document() -> None:
    document = Document("d", "", "  alpha   beta\n\ngamma  delta ")
    for passage in split_document(document, WordSpanner(), ChunkingConfig(2, 1)):
        assert document.text[passage.start_char : passage.end_char] == passage.text


def test_short_and_empty_documents() -> None:
    assert [p.text for p in split_document(_doc(3), WordSpanner(), ChunkingConfig(4, 1))] == [
        "w0 w1 w2"
    ]
    assert list(split_document(Document("e", "", "   "), WordSpanner(), ChunkingConfig())) == []


def test_last_window_is_not_a_pure_overlap() -> None:
    passages = list(split_document(_doc(7), WordSpanner(), ChunkingConfig(4, 1)))
    assert [p.text for p in passages] == ["w0 w1 w2 w3", "w3 w4 w5 w6"]


@pytest.mark.parametrize(("size", "overlap"), [(0, 0), (4, 4), (4, -1)])
def test_bad_chunking_is_refused(size: int, overlap: int) -> None:
    with pytest.raises(ValueError, match="must be"):
        ChunkingConfig(size, overlap)
