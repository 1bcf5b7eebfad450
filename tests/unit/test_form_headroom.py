"""The per-question oracle over answer forms against the best single form (issue: choosing the
form per query): pure counting over answer-eval records."""

from __future__ import annotations

from eval.calibrate.form_headroom import headroom, right_by_form


def test_the_oracle_takes_each_questions_best_form() -> None:
    right = {
        "quote": [True, True, False, False],
        "passages": [False, True, True, False],
    }
    found = headroom(right, resamples=200)
    assert found["best_single"] == "quote"
    assert found["share_right"] == {"quote": 0.5, "passages": 0.5}
    assert found["oracle"] == 0.75
    assert found["headroom"] == 0.25
    assert found["right_only_in"] == {"quote": 0.25, "passages": 0.25}
    low, high = found["headroom_ci95"]
    assert 0.0 <= low <= 0.25 <= high


def test_an_abstention_or_a_failed_request_is_not_right() -> None:
    record = {"status": "ok", "answer": "Sicily [1].", "form": "quote"}
    runs = {
        "quote": [
            {**record, "question_id": "a"},
            {**record, "question_id": "b", "form": "abstain"},
        ],
        "passages": [
            {**record, "question_id": "a", "status": "error", "answer": None},
            {**record, "question_id": "b", "answer": "On Sicily."},
            {**record, "question_id": "c"},  # not asked in every run: left out
        ],
    }
    order, right = right_by_form(runs, {"a": ("Sicily",), "b": ("Sicily",), "c": ("Sicily",)})
    assert order == ["a", "b"]
    assert right == {"quote": [True, False], "passages": [False, True]}
