"""Answer metrics of `answer-eval answers` against the official SQuAD normalisation and
hand-computed cases, and the question loader on malformed files."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from eval.commands.answers import AnswerRecord, score_answers
from eval.lib.metrics import (
    abstains,
    answer_recall,
    citation_precision,
    citation_recall,
    cited_numbers,
    exact_match,
    f1,
    normalize_answer,
)
from eval.lib.questions import Question, read_questions
from retrieval.errors import CorpusFormatError


@pytest.mark.parametrize(
    ("raw", "normalised"),
    [
        # Lower-case, punctuation removed, articles dropped, whitespace collapsed.
        ("The Denver Broncos", "denver broncos"),
        ("Levi's Stadium.", "levis stadium"),
        ("  an   apple,  a pear ", "apple pear"),
        ("Theory of the Atom", "theory of atom"),
        ("Them and another", "them and another"),  # articles only as whole words
        ("$1.2 billion", "12 billion"),
    ],
)
def test_official_normalisation(raw: str, normalised: str) -> None:
    assert normalize_answer(raw) == normalised


def test_exact_match_takes_the_best_gold() -> None:
    assert exact_match("the Denver Broncos!", ["Broncos", "Denver Broncos"]) == 1.0
    assert exact_match("Denver", ["Denver Broncos"]) == 0.0


def test_f1_by_hand() -> None:
    # prediction tokens: denver broncos won; gold: denver broncos -> P 2/3, R 1, F1 0.8.
    assert f1("Denver Broncos won", ["Denver Broncos"]) == pytest.approx(0.8)
    # best over golds: "carolina" shares nothing, "broncos" gives P 1/3 R 1 -> 0.5.
    assert f1("Denver Broncos won", ["Carolina", "Broncos"]) == pytest.approx(0.5)
    assert f1("", ["x"]) == 0.0
    # repeated tokens count with multiplicity: "x y y" vs "y y z" share 2 -> P = R = 2/3.
    assert f1("x y y", ["y y z"]) == pytest.approx(2 / 3)


def test_answer_recall_needs_whole_tokens() -> None:
    assert answer_recall("It was the Denver Broncos [1].", ["Denver Broncos"]) == 1.0
    assert answer_recall("Denverite fans", ["Denver"]) == 0.0
    assert answer_recall("anything", ["the"]) == 0.0  # a gold that normalises to nothing


def test_citations() -> None:
    assert cited_numbers("A [2] and B [1][2], see [10].") == (2, 1, 10)
    assert citation_precision(["a", "b"], ["a"]) == 0.5
    assert citation_precision([], ["a"]) is None
    assert citation_recall(["a", "b"], ["a"]) == 1.0
    assert citation_recall(["b"], ["a"]) == 0.0
    assert citation_recall(["b"], []) is None


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        ("I do not know.", True),
        ("I don't know based on these passages.", True),
        ("The passages do not contain the answer.", True),
        ("", True),
        ("The Denver Broncos won [1].", False),
        ("Nobody knows the exact number, but it is 5.", False),
    ],
)
def test_abstention(answer: str, expected: bool) -> None:
    assert abstains(answer) is expected


def _record(
    qid: str, answer: str, sources: tuple[str, ...], cited: tuple[str, ...]
) -> AnswerRecord:
    return AnswerRecord(qid, "ok", answer, sources, cited, ttft_ms=100.0, e2e_ms=200.0)


def test_score_answers_by_hand() -> None:
    questions = [
        Question("q1", "who?", ("Denver Broncos",), "d1"),
        Question("q2", "where?", ("Santa Clara",), "d2"),
        Question("q3", "unanswerable?", (), None),
    ]
    records = [
        _record("q1", "Denver Broncos [1][2].", ("d1", "d9"), ("d1", "d9")),
        _record("q2", "I do not know.", ("d3", "d2"), ()),
        _record("q3", "I don't know", (), ()),
    ]
    metrics = score_answers(questions, records)
    assert metrics["exact_match"] == 0.5
    assert metrics["answer_recall"] == 0.5
    assert metrics["citation_precision"] == 0.5  # only q1 cites: 1 of 2 is gold
    assert metrics["citation_recall"] == 0.5  # q1's gold cited, q2's not
    assert metrics["gold_in_sources"] == 1.0
    assert metrics["abstention_rate"] == 1.0
    assert metrics["false_abstention_rate"] == 0.5
    assert metrics["ttft_ms"]["p50"] == 100.0
    assert metrics["ok"] == 3
    assert metrics["errored"] == 0


def test_repetition_counts_what_the_reader_got_and_stops_apart() -> None:
    questions = [Question(f"q{i}", "how?", ("two minutes",), "d1") for i in range(3)]
    loop = "Green tea steeps for two minutes."
    records = [
        _record("q0", f"{loop} The water is hot. {loop}", ("d1",), ()),
        # Stopped by the guard before the repeat was shown: the answer itself does not repeat.
        dataclasses.replace(_record("q1", loop, ("d1",), ()), finish_reason="repetition"),
        _record("q2", "Green tea steeps. Green tea steeps.", ("d1",), ()),  # under four words
    ]
    metrics = score_answers(questions, records)
    assert metrics["repetition_rate"] == pytest.approx(1 / 3, abs=1e-3)
    assert metrics["repetition_stopped_rate"] == pytest.approx(1 / 3, abs=1e-3)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "not valid JSON"),
        ('["a"]', "expected a JSON object"),
        ('{"question": "q?", "answers": []}', "`_id`"),
        ('{"_id": "x", "question": " ", "answers": []}', "`question`"),
        ('{"_id": "x", "question": "q?", "answers": "Paris"}', "`answers`"),
        ('{"_id": "x", "question": "q?", "answers": [], "gold_passage_id": 3}', "gold_passage_id"),
    ],
)
def test_malformed_question_files_name_the_line(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "questions.jsonl"
    path.write_text('{"_id": "ok", "question": "fine?", "answers": ["yes"]}\n\n' + line + "\n")
    with pytest.raises(CorpusFormatError, match=message) as caught:
        read_questions(path)
    assert caught.value.line_no == 3


def test_duplicate_question_ids_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "questions.jsonl"
    path.write_text('{"_id": "a", "question": "q?"}\n{"_id": "a", "question": "r?"}\n')
    with pytest.raises(CorpusFormatError, match="duplicate"):
        read_questions(path)
