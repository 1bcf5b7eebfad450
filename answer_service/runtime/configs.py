"""The one place the settings become the small configs each part is given: the pipeline's
(retrieval, prompt, generation, citations, planning), the retriever's search, the reranker's
and the embedder's. Nothing below `answer_service/runtime` reads the settings.

`Experiment` holds what the service fixes at what was measured best and an eval command varies
in-process (`Components.create(settings, experiment)`); no environment variable reaches it."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, get_args, get_origin, get_type_hints

from answer_service.pipeline.answer_pipeline import PipelineConfig
from answer_service.pipeline.answer_stream import CitationConfig
from answer_service.pipeline.forms import FormConfig, read_form_choice, read_form_curves
from answer_service.pipeline.generation_steps import GenerationConfig
from answer_service.pipeline.planning import DEFAULT_QUALITY, PlanningConfig, read_quality_curves
from answer_service.pipeline.retrieval_steps import RetrievalConfig
from answer_service.runtime.calibration import CalibrationConfig
from answer_service.runtime.settings import (
    FORM_CURVES,
    QUALITY_CURVES,
    SENTENCE_SCORER,
    Settings,
)
from budget.forms import FormQuality
from generation.prefix_order import PromptLayout
from generation.stages import PromptConfig
from retrieval.embedder import EmbedderConfig
from retrieval.index.ann import SearchDepth
from retrieval.rerank.base import RerankerConfig
from retrieval.sentences.answerable import AnswerableModel
from retrieval.sentences.quote import read_quote_config
from retrieval.sentences.scorer import ScorerWeights

# A query's depth in an approximate index (exact search ignores it): IVF lists visited and
# HNSW candidates. On 100,000 SciFact-based vectors they reach recall@10 0.908 and 0.985 of
# exact search in under 0.2 ms, where rerank costs hundreds (eval/results/stage-costs.json,
# docs/retrieval.md#stage-costs; measured by eval.bench.stage_costs, removed in issue 39, last
# at 51f22ed).
SEARCH_DEPTH = SearchDepth(nprobe=16, ef_search=64)


@dataclass(frozen=True, slots=True)
class Experiment:
    """What the eval commands vary and the service holds at its defaults (each measured in
    docs/answers.md or docs/prefix-reuse.md)."""

    # Passage order: cache_aware continues the prefix SGLang most likely holds
    # (generation/prefix_order.py); eval.bench.prefix_reuse compared the layouts
    # (removed in issue 39, last at 51f22ed; docs/prefix-reuse.md).
    prompt_layout: PromptLayout = "cache_aware"
    # cache_aware only: places that may go to passages ranked just below top_k (slack), or to
    # passages another question put on a remembered prefix (adopt); neither paid for itself.
    prompt_cache_slack: int = 0
    prompt_cache_adopt: int = 0
    # The worked question and answer before the question: a small model copies its short,
    # cited answer (docs/answers.md).
    prompt_example: bool = True
    # SGLang's penalties: a frequency penalty of 0.3 cut the loops the guard stopped but cost
    # answer recall (docs/answers.md), so none.
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    # Per generated form, the logit bias on the prompt's passage tokens: whole passages only,
    # where it raised recall; it made focused excerpts' answers worse (docs/answers.md).
    copy_bias: Mapping[str, float] = field(default_factory=lambda: {"passages": 4.0})
    # Sentences on each side of a chosen one in a focused excerpt: without them answers came
    # faster but worse (generation-variants-neighbours.json, removed in issue 39, last at
    # 51f22ed; docs/answers.md).
    focused_neighbours: int = 1
    # Reread the scorer's best sentences with the learned cross-encoder where the scorer is in
    # doubt (docs/answers.md; off: the scorer's order, as `answers-quote-no-reader.json` ran).
    sentence_reader: bool = True
    # Find the short answer inside a quote with the span head (retrieval/sentences/span.py;
    # docs/answers.md); off: quotes alone.
    short_answer: bool = True
    # What `auto` expects of each form: the curves, or the per-query model over them
    # (budget/query_quality.py, fitted by eval.calibrate.form_choice, removed in issue 39, last
    # at 51f22ed; `form_choice_file`, default the one shipped), which did not beat the curves
    # (docs/planner.md).
    form_quality: Literal["curves", "per_query"] = "curves"
    form_choice_file: Path | None = None
    # Over several workers (`sglang_workers`): `prefix` sends a prompt where its passages were
    # sent before (generation/prefix_routing.py); `round_robin` ignores the cache, the baseline
    # docs/prefix-reuse.md measures it against.
    sglang_routing: Literal["prefix", "round_robin"] = "prefix"
    # The rerank depth with the planner off (`ANSWER_PLANNER=false`): the fixed
    # configurations the planner is measured against (eval.bench.planner_quality_slo).
    fixed_rerank_depth: int = 20
    # Log the event loop's stack when it is kept this long past due (0: off;
    # answer_service/runtime/observability/loop_lag.py): a diagnosis, not a service setting.
    loop_stall_ms: int = 0

    def __post_init__(self) -> None:
        if self.fixed_rerank_depth < 0:
            raise ValueError("fixed_rerank_depth must be 0 (no rerank) or more")
        unknown = sorted(set(self.copy_bias) - {"focused", "passages"})
        if unknown:
            raise ValueError(f"copy_bias is per generated form (focused, passages), not {unknown}")
        if any(not 0.0 <= bias <= 10.0 for bias in self.copy_bias.values()):
            raise ValueError("copy_bias values must be between 0 and 10")


SHIPPED = Experiment()


def experiment_of(assignments: Sequence[str]) -> Experiment:
    """The shipped knobs with `KEY=VALUE` assignments over them (an eval command's
    `--experiment`): `sentence_reader=false`, `prompt_layout=relevance`,
    `copy_bias=passages:4,focused:0`, ...; a ValueError naming what is wrong otherwise."""
    hints = get_type_hints(Experiment)
    changes: dict[str, object] = {}
    for assignment in assignments:
        key, sep, value = assignment.partition("=")
        if not sep or key not in hints:
            raise ValueError(f"not KEY=VALUE with KEY one of {', '.join(hints)}: {assignment!r}")
        shipped = getattr(SHIPPED, key)
        try:
            if key == "copy_bias":
                pairs = (part.split(":") for part in value.split(",") if part)
                changes[key] = {form: float(bias) for form, bias in pairs}
            elif isinstance(shipped, bool):
                changes[key] = {"true": True, "false": False}[value.strip().lower()]
            elif isinstance(shipped, int | float):
                changes[key] = type(shipped)(value)
            elif get_origin(hints[key]) is Literal and value not in get_args(hints[key]):
                raise ValueError(f"one of {get_args(hints[key])}")
            else:
                changes[key] = Path(value) if key == "form_choice_file" else value
        except (KeyError, ValueError) as exc:
            raise ValueError(f"{assignment!r}: not a value for {key} ({exc})") from exc
    return dataclasses.replace(SHIPPED, **changes)  # type: ignore[arg-type]


# Embedding and search get at least this long, whatever their slice of the plan: over ten
# times their p95 on 2 cores (docs/retrieval.md#stage-costs), so a plan's misjudged slice
# never cuts retrieval short.
RETRIEVAL_FLOOR_MS = 250
# The most generation slots the warm-up measures a worker for (1, 2, 4, ... prompts at once
# while a doubling still raises throughput 1.25x; budget/concurrency.py).
MAX_GENERATION_SLOTS = 16


def pipeline_config(
    settings: Settings, served_model: str | None, experiment: Experiment = SHIPPED
) -> PipelineConfig:
    slack = experiment.prompt_cache_slack if experiment.prompt_layout == "cache_aware" else 0
    return PipelineConfig(
        generation=GenerationConfig(
            served_model=served_model or "unknown",
            max_new_tokens=settings.max_new_tokens,
            next_token_timeout_s=settings.next_token_timeout_s,
            frequency_penalty=experiment.frequency_penalty,
            repetition_penalty=experiment.repetition_penalty,
            copy_bias=experiment.copy_bias,
        ),
        retrieval=RetrievalConfig(
            floor_ms=RETRIEVAL_FLOOR_MS,
            mode=settings.retrieval_mode,
            depth=SEARCH_DEPTH,
            slack=slack,
        ),
        prompt=PromptConfig(
            max_prompt_tokens=settings.max_prompt_tokens,
            layout=experiment.prompt_layout,
            slack=experiment.prompt_cache_slack,
            adopt=experiment.prompt_cache_adopt,
            example=experiment.prompt_example,
            vocabulary=any(experiment.copy_bias.values()),
        ),
        citations=CitationConfig(
            unsupported=settings.unsupported,
            loop_guard=settings.loop_guard,
        ),
        forms=FormConfig(
            mode=settings.mode,
            quote=read_quote_config(settings.calibrated(SENTENCE_SCORER)),
            answerable=AnswerableModel.read(settings.calibrated(SENTENCE_SCORER)),
            neighbours=experiment.focused_neighbours,
        ),
        form_quality=form_quality(settings, experiment),
        planning=planning_config(settings, slack, experiment.fixed_rerank_depth),
        routing=experiment.sglang_routing,
        ttft_timeout_factor=settings.ttft_timeout_factor,
        abstain_below=settings.abstain_below,
        record_content=settings.record_content,
    )


def planning_config(
    settings: Settings, retrieve_slack: int, fixed_rerank_depth: int = SHIPPED.fixed_rerank_depth
) -> PlanningConfig:
    """The planner's; its depths, margins, admission quantile, burst window and a tier's longest
    wait are PlanningConfig's own (docs/planner.md), the depth it reranks to when off the
    experiment's."""
    return PlanningConfig(
        enabled=settings.planner != "off",
        fixed_rerank_depth=fixed_rerank_depth,
        retrieve_slack=retrieve_slack,
        slots_per_worker=settings.generation_slots_per_worker or 1,
        tier_weights=tuple(settings.tier_weights.items()),
        default_tier=settings.default_tier,
        queue_max=settings.generation_queue_max,
        fleet_workers=settings.fleet_workers,
        quality=read_quality_curves(curves)
        if (curves := settings.calibrated(QUALITY_CURVES))
        else DEFAULT_QUALITY,
    )


def form_quality(settings: Settings, experiment: Experiment = SHIPPED) -> FormQuality:
    curves = read_form_curves(settings.calibrated(FORM_CURVES))
    if experiment.form_quality == "curves":
        return curves
    return read_form_choice(curves, experiment.form_choice_file)


def calibration_config(settings: Settings) -> CalibrationConfig:
    """The warm-up's stage timing: on with the planner unless switched off; it measures each
    worker's generation slots unless they are configured."""
    return CalibrationConfig(
        enabled=settings.planner == "calibrated",
        mode=settings.retrieval_mode,
        max_slots=MAX_GENERATION_SLOTS if settings.generation_slots_per_worker is None else None,
    )


def scorer_weights(settings: Settings) -> ScorerWeights:
    return ScorerWeights.read(settings.calibrated(SENTENCE_SCORER))


def embedder_config(settings: Settings, *, device: str) -> EmbedderConfig:
    """The embedder's, on the device the placement gave it (runtime/placement.py)."""
    return EmbedderConfig(
        model=settings.embedder_model, device=device, cache_dir=settings.cache_dir
    )


def reranker_config(settings: Settings, *, device: str) -> RerankerConfig:
    """The reranker's, on the device the placement gave it (runtime/placement.py)."""
    return RerankerConfig(
        model=settings.reranker_model,
        device=device,
        cache_dir=settings.cache_dir,
    )
