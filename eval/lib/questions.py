"""The one question type of eval/ (`Question`) and the two ways a questions file is read:
`read_questions`, strictly, for the commands that score answers (SQuAD-open: `_id`,
`question`, `answers`, an optional `gold_passage_id`); `read_load_questions`, leniently, for
load, where only the text is sent (SQuAD-open or BEIR queries: `question` or `text`)."""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from retrieval.errors import CorpusFormatError
from retrieval.jsonl import json_objects, unique_id


@dataclass(frozen=True, slots=True)
class Question:
    question_id: str
    question: str
    answers: tuple[str, ...] = ()
    gold_passage_id: str | None = None
    # Its gold passage was taken out of the index (`--remove-gold`): abstaining is right.
    gold_removed: bool = False


def read_questions(path: Path) -> list[Question]:
    """Questions JSONL; a bad line is refused with its line number."""
    questions: list[Question] = []
    seen: set[str] = set()
    for line_no, record in json_objects(path):
        question_id = unique_id(path, line_no, record, seen)
        text = record.get("question")
        answers, gold = record.get("answers", []), record.get("gold_passage_id")
        if not isinstance(text, str) or not text.strip():
            raise CorpusFormatError(path, line_no, "`question` must be a non-empty string")
        if not isinstance(answers, list) or not all(isinstance(a, str) for a in answers):
            raise CorpusFormatError(path, line_no, "`answers` must be a list of strings")
        if gold is not None and (not isinstance(gold, str) or not gold):
            raise CorpusFormatError(path, line_no, "`gold_passage_id` must be a string")
        questions.append(Question(question_id, text, tuple(answers), gold))
    return questions


def sample(questions: list[Question], size: int | None, seed: int) -> list[Question]:
    """A seeded sample of `size` in file order (all where `size` is None or not smaller): the
    one `answer-eval answers --sample N --seed S` draws, so calibrations can draw the same."""
    if size is None or size >= len(questions):
        return questions
    chosen = set(random.Random(seed).sample(range(len(questions)), size))
    return [q for n, q in enumerate(questions) if n in chosen]


def read_load_questions(path: Path, shuffle_seed: int | None = None) -> list[Question]:
    """Questions JSONL: SQuAD-open (`_id`, `question`) or BEIR queries (`_id`, `text`); a line
    without `_id` is named by its line number. File order unless `shuffle_seed` is given."""
    questions: list[Question] = []
    for line_no, record in json_objects(path):
        text = record.get("question", record.get("text"))
        if not isinstance(text, str) or not text.strip():
            raise CorpusFormatError(path, line_no, "needs a non-empty `question` or `text`")
        questions.append(Question(str(record.get("_id", line_no)), text))
    if not questions:
        raise CorpusFormatError(path, 0, "no questions")
    if shuffle_seed is not None:
        random.Random(shuffle_seed).shuffle(questions)
    return questions
