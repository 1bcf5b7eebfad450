"""`eval.calibrate.generation_variants`: a variant's spec names its form, size, settings and
the experiment's knobs."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from answer_service.runtime.settings import Settings
from eval.calibrate.generation_variants import parse_variant, split_overrides


def test_a_variant_spec_gives_its_form_size_and_settings() -> None:
    name, form, size, overrides = parse_variant(
        "f2:focused:2:frequency_penalty=0.3,unsupported=drop,prompt_example=false"
    )
    assert (name, form, size) == ("f2", "focused", 2)
    settings, experiment = split_overrides(overrides)
    assert experiment.frequency_penalty == 0.3
    assert experiment.prompt_example is False
    assert Settings(**settings).unsupported == "drop"
    assert parse_variant("q:quote:5") == ("q", "quote", 5, {})


def test_a_per_form_setting_is_given_as_json() -> None:
    *_, overrides = parse_variant('p1:passages:1:copy_bias={"focused": 4}')
    assert split_overrides(overrides)[1].copy_bias == {"focused": 4.0}
    with pytest.raises(ValidationError, match=r"per generated form .* not \['quote'\]"):
        split_overrides({"copy_bias": {"quote": 1.0}})
