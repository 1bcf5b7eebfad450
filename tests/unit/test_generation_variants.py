"""`eval.calibrate.generation_variants`: a variant's spec names its form, size and settings."""

from __future__ import annotations

from answer_service.runtime.settings import Settings
from eval.calibrate.generation_variants import parse_variant


def test_a_variant_spec_gives_its_form_size_and_settings() -> None:
    name, form, size, settings = parse_variant(
        "f2:focused:2:frequency_penalty=0.3,unsupported=drop"
    )
    assert (name, form, size) == ("f2", "focused", 2)
    assert Settings(**settings).frequency_penalty == 0.3
    assert Settings(**settings).unsupported == "drop"
    assert parse_variant("q:quote:5") == ("q", "quote", 5, {})


def test_a_per_form_setting_is_given_as_json() -> None:
    *_, settings = parse_variant('p1:passages:1:copy_bias={"focused": 4}')
    assert Settings(**settings).copy_bias == {"focused": 4.0}
