"""The per-query form model's learning command, on hand-made runs: configuration names, the
questions it learns from (answered in every configuration, none abstained), and the measure of
a per-query choice against the best single configuration and the oracle."""

from __future__ import annotations

import numpy as np
import pytest

from budget.query_quality import FEATURES
from eval.calibrate.form_choice import configuration, evaluate, fit, labelled


def test_configuration_names() -> None:
    assert configuration("quote") == ("quote", 1)
    assert configuration("focused-2") == ("focused", 2)
    assert configuration("passages-5") == ("passages", 5)
    for bad in ("focused", "summary-1", "passages-x"):
        with pytest.raises(ValueError, match="FORM-SIZE"):
            configuration(bad)


def _record(answer: str, form: str = "quote", status: str = "ok") -> dict[str, object]:
    return {"answer": answer, "form": form, "status": status}


def test_only_questions_answered_in_every_configuration_are_learned_from() -> None:
    answers = {"q1": ["Sicily"], "q2": ["Danube"], "q3": ["1969"]}
    runs = {
        "quote": {
            "q1": _record("Etna is on Sicily."),
            "q2": _record("I do not know.", form="abstain"),
            "q3": _record("In July 1969."),
        },
        "focused-2": {
            "q1": _record("It is in Italy.", form="focused"),
            "q2": _record("The Danube.", form="focused"),
            "q3": _record("", status="error"),
        },
    }
    common, right = labelled(runs, answers)
    assert common == ["q1"]
    assert right == {"quote": [True], "focused-2": [False]}


def test_a_choice_that_follows_the_feature_beats_the_best_single_configuration() -> None:
    # Quote right on the first half, focused on the second; one feature tells them apart.
    rng = np.random.default_rng(0)
    n = 200
    rows = np.zeros((n, len(FEATURES)))
    rows[:, 0] = 1.0
    tells = FEATURES.index("best_probability")
    rows[:, tells] = np.r_[rng.uniform(0.6, 1.0, n // 2), rng.uniform(0.0, 0.4, n // 2)]
    rows[:, FEATURES.index("answerable")] = rng.uniform(0, 1, n)  # noise
    right = {
        "quote": [True] * (n // 2) + [False] * (n // 2),
        "focused-2": [False] * (n // 2) + [True] * (n // 4) + [False] * (n // 4),
    }
    names = list(right)
    models = fit(names, right, rows, l2=1.0)
    result = evaluate(models, names, right, rows, resamples=200)
    assert result["best_single"] == "quote"
    assert result["share_right"] == {"quote": 0.5, "focused-2": 0.25}
    assert result["per_query"] == pytest.approx(0.75, abs=0.02)
    assert result["gain_over_best"] > 0.2
    assert result["gain_ci95"][0] > 0
    assert result["oracle"] == 0.75
