"""The reader's example files (eval/calibrate/sentence_reader.py): what a training question
reads (its best answering sentence against the scorer's best others), and a file a killed run
cut short gives the records written before the cut."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from eval.calibrate.sentence_reader import _records, read_groups


def _record(qid: str, candidates: list[tuple[str, float, float, bool]]) -> str:
    found = [
        {"text": t, "title": "T", "label": label, "score": score, "quotable": quotable}
        for t, label, score, quotable in candidates
    ]
    record = {"question_id": qid, "part": "train", "article": "A", "question": "Q?"}
    return json.dumps(record | {"candidates": found}) + "\n"


def test_a_training_question_reads_its_best_answer_against_the_hardest_others(
    tmp_path: Path,
) -> None:
    path = tmp_path / "train.jsonl.gz"
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.write(
            _record(
                "q1",
                [
                    ("weak answer", 1.0, 0.1, True),
                    ("hard other", 0.0, 0.9, True),
                    ("code other", 0.0, 0.95, False),
                    ("best answer", 1.0, 0.5, True),
                    ("easy other", 0.0, 0.05, True),
                    ("middle other", 0.0, 0.3, True),
                ],
            )
        )
        f.write(_record("q2", [("only others", 0.0, 0.9, True)]))
    (group,) = read_groups(path, negatives=2)
    assert group.texts == ("best answer", "hard other", "middle other")
    assert group.labels.tolist() == [1.0, 0.0, 0.0]
    # Without `negatives`: the scorer's best quotable ones, answering or not.
    first, second = read_groups(path, depth=2)
    assert first.texts == ("hard other", "best answer")
    assert second.texts == ("only others",)


def test_a_file_cut_short_gives_the_records_before_the_cut(tmp_path: Path) -> None:
    path = tmp_path / "cut.jsonl.gz"
    whole = gzip.compress(_record("q1", []).encode()) + gzip.compress(_record("q2", []).encode())
    path.write_bytes(whole[:-12])
    assert [r["question_id"] for r in _records(path)] == ["q1"]
