from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from answer_service.runtime.configs import (
    SHIPPED,
    Experiment,
    experiment_of,
    pipeline_config,
    planning_config,
)
from answer_service.runtime.keys.auth import ApiKey, digest, write_api_keys
from answer_service.runtime.settings import REMOVED, Settings


@pytest.mark.parametrize("value", ["", "none", "None"])
def test_an_empty_reranker_turns_the_stage_off(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("ANSWER_RERANKER_MODEL", value)
    assert Settings().reranker_model is None


def test_environment_and_otel_alias(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANSWER_DEFAULT_TTFT_BUDGET_MS", "1500")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318")
    settings = Settings()
    assert settings.default_ttft_budget_ms == 1500
    assert settings.otel_exporter_otlp_endpoint == "http://collector:4318"
    assert settings.reranker_model == "builtin"


def test_a_mistyped_override_is_refused() -> None:
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        Settings(reranker_modle="x")  # type: ignore[call-arg]


def test_bad_values_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANSWER_DEFAULT_TTFT_BUDGET_MS", "0")
    with pytest.raises(ValidationError, match="default_ttft_budget_ms"):
        Settings()


def test_the_copy_bias_is_per_generated_form() -> None:
    """An eval's knob, the service's fixed: whole passages only, by measurement."""
    assert SHIPPED.copy_bias == {"passages": 4.0}
    assert pipeline_config(Settings(), "m").generation.copy_bias == {"passages": 4.0}
    assert pipeline_config(Settings(), "m", Experiment(copy_bias={})).prompt.vocabulary is False
    with pytest.raises(ValueError, match=r"per generated form .* not \['quote'\]"):
        Experiment(copy_bias={"quote": 1.0})
    with pytest.raises(ValueError, match="between 0 and 10"):
        Experiment(copy_bias={"focused": -1.0})


def test_the_rerank_depth_with_the_planner_off_is_an_experiment() -> None:
    """The fixed configurations the planner is measured against: eval's knob, 20 shipped."""
    assert pipeline_config(Settings(), "m").planning.fixed_rerank_depth == 20
    deeper = experiment_of(["fixed_rerank_depth=30"])
    assert pipeline_config(Settings(planner=False), "m", deeper).planning.fixed_rerank_depth == 30
    with pytest.raises(ValueError, match="fixed_rerank_depth"):
        experiment_of(["fixed_rerank_depth=-1"])


def test_planner_settings_are_validated(tmp_path: Path) -> None:
    assert Settings().planner == "calibrated"
    assert [Settings(planner=v).planner for v in (True, False, "priors")] == [
        "calibrated",
        "off",
        "priors",
    ]
    with pytest.raises(ValidationError, match="planner"):
        Settings(planner="sometimes")
    with pytest.raises(ValidationError, match="default_tier 'gold' is not in tier_weights"):
        Settings(default_tier="gold")
    with pytest.raises(ValidationError, match="weight > 0"):
        Settings(tier_weights={"a": 0})
    with pytest.raises(ValidationError, match="holds none of"):
        Settings(calibration_dir=tmp_path)
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "quality-curves.json").write_text('{"metrics": {}}')
    with pytest.raises(ValidationError, match="is not a quality-curves result"):
        Settings(calibration_dir=bad)
    (tmp_path / "good").mkdir()
    good = tmp_path / "good" / "quality-curves.json"
    good.write_text(
        json.dumps(
            {
                "metrics": {
                    "depths": {
                        "0": {"gold_in_top_n": [0.5, 0.7]},
                        "20": {"gold_in_top_n": [0.6, 0.8]},
                    },
                    "quote_by_depth": {"0": 0.7, "20": 0.75},
                }
            }
        )
    )
    settings = Settings(calibration_dir=good.parent)
    assert settings.calibrated("quality-curves.json") == good
    assert settings.calibrated("form-curves.json") is None  # the shipped one
    assert planning_config(settings, 0).quality != planning_config(Settings(), 0).quality
    assert planning_config(settings, 0).quality.quote_by_depth == {0: 0.7, 20: 0.75}


def test_a_key_whose_tier_is_not_served_is_refused_at_start_up(tmp_path: Path) -> None:
    """A key of a tier the generation gate has no queue for would get a 500 whenever it had
    to wait for a slot: the key file is refused when it is loaded instead."""
    path = tmp_path / "keys.json"
    write_api_keys(path, [ApiKey("gold-team", digest("ask_gold"), "gold")])
    with pytest.raises(ValidationError, match=r"key 'gold-team': tier 'gold' is not one of"):
        Settings(api_keys_file=path)
    served = {"gold": 2.0, "standard": 1.0}
    assert Settings(api_keys_file=path, tier_weights=served).api_keys_file == path


@pytest.mark.parametrize(("value", "planner"), [("true", "calibrated"), ("false", "off")])
def test_the_planner_reads_true_and_false_as_before(
    monkeypatch: pytest.MonkeyPatch, value: str, planner: str
) -> None:
    monkeypatch.setenv("ANSWER_PLANNER", value)
    assert Settings().planner == planner


def test_a_removed_setting_is_refused_with_its_replacement(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An unknown `ANSWER_` variable is ignored by pydantic-settings: one that used to be a
    setting would leave a deployment quietly without it."""
    monkeypatch.setenv("ANSWER_SGLANG_GPU", "1")
    with pytest.raises(ValidationError, match=r"sglang_gpu was removed \(placement: sglang="):
        Settings()
    monkeypatch.delenv("ANSWER_SGLANG_GPU")
    monkeypatch.setenv("TEMPERATURE", "0.7")  # not ours
    assert Settings().max_new_tokens == 160
    with pytest.raises(ValidationError, match="index_device was removed"):
        Settings(index_device="cpu")  # type: ignore[call-arg]


def test_every_removed_setting_is_in_the_changelog() -> None:
    changelog = (Path(__file__).parents[2] / "docs" / "changelog.md").read_text()
    missing = [name for name in REMOVED if f"ANSWER_{name.upper()}" not in changelog]
    assert not missing


def test_an_eval_knob_is_set_by_name_and_a_wrong_one_is_refused() -> None:
    knobs = experiment_of(
        ["sentence_reader=false", "prompt_layout=relevance", "copy_bias=passages:2,focused:0"]
    )
    assert knobs.sentence_reader is False
    assert knobs.prompt_layout == "relevance"
    assert dict(knobs.copy_bias) == {"passages": 2.0, "focused": 0.0}
    assert knobs.focused_neighbours == SHIPPED.focused_neighbours  # the rest as shipped
    for wrong in ("temperature=1", "prompt_layout=sideways", "sentence_reader=maybe", "x"):
        with pytest.raises(ValueError, match=r"KEY|not a value"):
            experiment_of([wrong])
