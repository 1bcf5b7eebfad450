from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

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


def test_passages_stay_inside_their_section_and_carry_its_place() -> None:
    from retrieval.corpus import DocumentSection
    from retrieval.embedder import passage_embedding_text

    text = "a b c\n\nd e"
    document = Document(
        "guide/page.html",
        "Page",
        text,
        sections=(
            DocumentSection(0, 5, ("Page", "Intro"), anchor="intro", url="https://x/p#intro"),
            DocumentSection(7, 10, ("Page", "Intro", "More"), page=3),
        ),
        path="guide/page.html",
        collection="docs",
    )
    passages = list(split_document(document, WordSpanner(), ChunkingConfig(4, 1)))
    # A 4-token window would take "d" into the first passage: sections cut it at "c".
    assert [p.text for p in passages] == ["a b c", "d e"]
    assert [p.passage_id for p in passages] == ["guide/page.html#0", "guide/page.html#1"]
    first, second = passages
    assert (first.anchor, first.url, first.page) == ("intro", "https://x/p#intro", None)
    assert (second.anchor, second.page) == (None, 3)
    assert second.heading_path == ("Page", "Intro", "More")
    assert {p.path for p in passages} == {"guide/page.html"}
    assert {p.collection for p in passages} == {"docs"}
    assert passage_embedding_text(second) == "Page \u203a Intro \u203a More\nd e"
    assert all(text[p.start_char : p.end_char] == p.text for p in passages)


def test_jsonl_passages_are_stored_as_before_and_old_lines_still_read(tmp_path: Path) -> None:
    from retrieval.index.faiss_index import passage_to_json, read_passages

    (plain,) = split_document(_doc(3), WordSpanner(), ChunkingConfig(4, 1))
    old_line = (
        '{"passage_id": "doc#0", "doc_id": "doc", "position": 0, "title": "Title", '
        '"text": "w0 w1 w2", "start_char": 0, "end_char": 8}'
    )
    assert passage_to_json(plain) == old_line
    with_heading = replace(plain, heading_path=("T", "S"), page=2)
    (tmp_path / "p.jsonl").write_text(
        old_line + "\n" + passage_to_json(with_heading) + "\n", encoding="utf-8"
    )
    assert list(read_passages(tmp_path / "p.jsonl")) == [plain, with_heading]
