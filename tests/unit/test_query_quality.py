"""The per-query form model: each request's own expected quality per form, from its first pass;
sizes it was not trained on expect nothing, forms it has no model for keep the curves, and
`auto` follows it request by request."""

from __future__ import annotations

from pathlib import Path

import pytest

from budget.forms import FormRequest, QualityCurves
from budget.query_quality import (
    FEATURES,
    ConfigurationModel,
    QueryQuality,
    feature_row,
    question_kind,
)
from tests.builders import make_index, make_pipeline
from tests.fakes.scripted_generation import ScriptedGeneration, words
from tests.unit.test_answer_forms import answer, done_of

CURVES = QualityCurves({"quote": (0.7,), "focused": (0.3, 0.35), "passages": (0.3, 0.3)})
UNIT = (0.0,) * len(FEATURES), (1.0,) * len(FEATURES)


def model(form: str, size: int, **weights: float) -> ConfigurationModel:
    row = [weights.get(name, 0.0) for name in FEATURES]
    return ConfigurationModel(form, size, tuple(row), *UNIT)  # type: ignore[arg-type]


def request(question: str, best: float) -> FormRequest:
    return FormRequest(
        10, best, 0.1, 5, answerable=0.5, best_cover=0.5, question_kind=question_kind(question)
    )


def test_question_kinds() -> None:
    assert question_kind("How many times was Newton sacked?") == "how_many"
    assert question_kind("Who won Super Bowl 50?") == "who"
    assert question_kind("When did the stadium open?") == "when"
    assert question_kind("Why is the sky blue?") == "why_how"
    assert question_kind("What does VACUUM FULL lock?") == "which_what"
    assert question_kind("Name the river.") == "other"


def test_each_request_gets_its_own_expectation() -> None:
    # The quote is right when its best sentence is likely; generation does better on "why".
    quality = QueryQuality(
        [
            model("quote", 1, bias=-2.0, best_probability=4.0),
            model("focused", 2, bias=-1.0, kind_why_how=2.0),
        ],
        CURVES,
    )
    sure = quality.expected(request("Who won Super Bowl 50?", best=0.9))
    why = quality.expected(request("Why did the stadium close?", best=0.2))
    assert sure["quote"][0] > sure["focused"][1]
    assert why["focused"][1] > why["quote"][0]
    assert sure["focused"][0] == 0.0  # one excerpt was never trained on
    assert sure["passages"] == CURVES.curves["passages"]  # no model: the curves stand
    assert len(feature_row(request("Who?", 0.5))) == len(FEATURES)


def test_a_model_file_over_other_features_is_refused() -> None:
    with pytest.raises(ValueError, match="must be over"):
        QueryQuality.from_json({"features": ["bias"], "configurations": []}, CURVES)
    with pytest.raises(ValueError, match="no answer form"):
        model("summary", 1)


async def test_auto_chooses_per_request_by_the_model(tmp_path: Path) -> None:
    index_dir = make_index(tmp_path)
    generation = ScriptedGeneration(words("Sicily."))
    quality = QueryQuality(
        [
            model("quote", 1, bias=1.0, kind_why_how=-4.0),
            model("passages", 1, bias=-1.0, kind_why_how=3.0),
        ],
        CURVES,
    )
    pipeline, _ = make_pipeline(
        index_dir, workers=[generation], answer_mode="auto", form_quality=quality
    )
    quoted = await answer(pipeline, "Where is Mount Etna?")
    assert done_of(quoted).stats.form == "quote"
    generated = await answer(pipeline, "Why is Mount Etna on Sicily?")
    stats = done_of(generated).stats
    assert (stats.form, stats.passages_in_prompt) == ("passages", 1)
