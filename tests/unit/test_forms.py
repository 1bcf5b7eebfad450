"""Choosing the answer form (budget/forms.py): the best expected quality that fits the time
left, the faster among near-equals, the fastest when nothing fits."""

from __future__ import annotations

import pytest

from budget.forms import AnswerForm, QualityCurves, choose_form

CURVES = {"quote": (0.6,), "focused": (0.5, 0.7, 0.7), "passages": (0.4, 0.75, 0.8)}


def cost(form: AnswerForm, size: int) -> float:
    return {"quote": 5.0, "focused": 300.0 * size, "passages": 600.0 * size}[form]


def test_the_best_quality_that_fits() -> None:
    choice = choose_form(CURVES, cost, 10_000.0, 3)
    assert (choice.form, choice.context) == ("passages", 3)
    assert choice.expected_quality == pytest.approx(0.8)


def test_less_time_takes_a_cheaper_form() -> None:
    assert choose_form(CURVES, cost, 700.0, 3).form == "focused"  # focused x2 at 600 ms
    assert choose_form(CURVES, cost, 100.0, 3).form == "quote"


def test_near_equal_quality_goes_to_the_faster() -> None:
    # focused x2 and x3 are both 0.7: the two-excerpt prompt is faster.
    choice = choose_form(CURVES, cost, 1_000.0, 3)
    assert (choice.form, choice.context) == ("focused", 2)


def test_nothing_fits_gives_the_fastest_and_says_so() -> None:
    choice = choose_form(CURVES, cost, 1.0, 3)
    assert choice.form == "quote"
    assert "nothing fits" in choice.reason


def test_the_allowed_forms_and_the_context_limit_bound_the_choice() -> None:
    # One passage or excerpt at most: neither beats the quote's 0.6 there.
    assert choose_form(CURVES, cost, 10_000.0, 1).form == "quote"
    better = {**CURVES, "focused": (0.65, 0.7, 0.7)}
    assert choose_form(better, cost, 10_000.0, 1).context == 1
    only = choose_form(CURVES, cost, 10_000.0, 3, allowed=("quote",))
    assert only.form == "quote"


def test_curves_must_be_shares() -> None:
    with pytest.raises(ValueError, match="quality curve"):
        QualityCurves({"quote": (1.5,)})
