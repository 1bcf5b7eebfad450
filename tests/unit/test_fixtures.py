"""The data fixtures in tests/fixtures/ read with the service's own readers, hold together (every
gold passage and judged document is there) and refuse a SciFact subset larger than they hold."""

from __future__ import annotations

import pytest

from eval.lib.questions import read_questions
from retrieval.corpus import read_corpus
from tests.scifact import CORPUS, load_subset
from tests.support import FIXTURES, SQUAD_PASSAGES, SQUAD_QUESTIONS


def test_every_squad_question_has_its_gold_passage() -> None:
    passages = {document.doc_id for document in read_corpus(SQUAD_PASSAGES)}
    questions = read_questions(SQUAD_QUESTIONS)
    assert len(passages) == 150
    assert len(questions) == 827
    assert {question.gold_passage_id for question in questions} <= passages
    assert all(question.answers for question in questions)


def test_the_largest_scifact_subset_is_the_whole_fixture() -> None:
    subset = load_subset(150, 1350)
    assert len(subset.queries) == 150
    assert [d.doc_id for d in subset.documents] == [d.doc_id for d in read_corpus(CORPUS)]
    assert set().union(*subset.qrels.values()) <= {d.doc_id for d in subset.documents}


@pytest.mark.parametrize(("claims", "others"), [(151, 0), (1, 1351)])
def test_a_subset_past_the_fixture_is_refused(claims: int, others: int) -> None:
    with pytest.raises(ValueError, match="larger than the fixture"):
        load_subset(claims, others)


def test_each_fixture_folder_carries_its_license_and_provenance() -> None:
    for folder in ("squad", "scifact"):
        assert (FIXTURES / folder / "LICENSE.txt").is_file()
        assert (FIXTURES / folder / "PROVENANCE.txt").is_file()
