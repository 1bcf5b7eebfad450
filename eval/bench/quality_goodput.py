"""Goodput with a quality floor: the metrics of `eval/bench/planner_goodput.py`, pure, over the
`LevelRun`s of the load engine whose records kept their answers.

Definitions (the latency ones are those of `eval/lib/latency_stats.py`):
- `quality_answered`: mean answer-string recall (`eval/squad_metrics.answer_recall`, `[n]`
  markers stripped) over the requests that returned an answer (finished `ok`); None when none
  did. `quality_all`: the same sum over every arrival of the level, a request without an answer
  (rejected, errored, timed out, dropped) counting 0;
- the quality floor: `quality_answered` of the deepest fixed configuration at the lowest rate,
  minus `FLOOR_MARGIN`;
- `goodput_rps`: the highest rate at which SLO attainment is >= 90% and `quality_answered` is
  >= the floor; 0.0 when no rate passes both. Without a floor (none could be measured) only
  attainment counts, as in DistServe;
- `mean_plan_passages`, `mean_plan_rerank_depth`, `mean_plan_retrieve_k`: means of the `plan`
  event's choices over the requests that reported them; `mean_passages_in_prompt` the same for
  the `done` event's count; `cuts`: how many cuts of each stage and reason the plans made.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from eval.lib.latency_stats import GOODPUT_ATTAINMENT, LevelRun, RequestRecord, level_metrics
from eval.lib.squad_metrics import answer_recall, strip_citations

FLOOR_MARGIN = 0.02
# Quality is a mean of 0/1 values: a level exactly on the floor must not fail it by rounding.
_FLOOR_TOLERANCE = 1e-9

Golds = Mapping[str, Sequence[str]]


@dataclass(frozen=True, slots=True)
class LevelOutcome:
    """What goodput is judged on at one rate."""

    rate_rps: float
    attainment: float | None
    quality: float | None


def recall_of(record: RequestRecord, golds: Golds) -> float | None:
    """The answer's recall against its question's gold answers; None without an answer."""
    if record.status != "ok" or record.answer is None:
        return None
    return answer_recall(strip_citations(record.answer), golds.get(record.question_id, ()))


@dataclass(frozen=True, slots=True)
class AnswerQuality:
    """`answered_mean` is `quality_answered`, `all_mean` `quality_all` (module docstring)."""

    answered_mean: float | None
    all_mean: float | None
    answered: int


def answer_quality(records: Sequence[RequestRecord], golds: Golds) -> AnswerQuality:
    recalls = [recall for r in records if (recall := recall_of(r, golds)) is not None]
    return AnswerQuality(
        sum(recalls) / len(recalls) if recalls else None,
        sum(recalls) / len(records) if records else None,
        len(recalls),
    )


def quality_floor(quality: float | None, margin: float = FLOOR_MARGIN) -> float | None:
    return None if quality is None else quality - margin


def goodput_with_floor(levels: Iterable[LevelOutcome], floor: float | None) -> float:
    """The highest rate meeting the SLO at >= 90% and, where there is a floor, the floor."""

    def passes(level: LevelOutcome) -> bool:
        if level.attainment is None or level.attainment < GOODPUT_ATTAINMENT:
            return False
        if floor is None:
            return True
        return level.quality is not None and level.quality >= floor - _FLOOR_TOLERANCE

    return max((level.rate_rps for level in levels if passes(level)), default=0.0)


def cut_name(cut: str) -> str:
    """A cut as tallied: `stage/reason` for the service's `{"stage", "reason", ...}` objects
    (kept as JSON text in the record), else the cut's text itself."""
    try:
        value = json.loads(cut)
    except ValueError:
        return cut
    if isinstance(value, dict) and "stage" in value:
        return "/".join(str(value[key]) for key in ("stage", "reason") if key in value)
    return cut


def _mean(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return round(sum(present) / len(present), 3) if present else None


def _rounded(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)


def level_summary(run: LevelRun, slo_ms: float, golds: Golds) -> dict[str, Any]:
    """One rate of one configuration, as the benchmark reports it."""
    metrics = level_metrics(run, slo_ms)
    records = run.records
    quality = answer_quality(records, golds)
    cuts = Counter(cut_name(cut) for r in records for cut in (r.plan_cuts or ()))
    return {
        "rate": run.level,
        "slo_attainment": _rounded(metrics["slo_attainment"]),
        "quality_answered": _rounded(quality.answered_mean),
        "quality_all": _rounded(quality.all_mean),
        "answered": quality.answered,
        "arrivals": metrics["arrivals"],
        "sent": metrics["sent"],
        "ok": metrics["ok"],
        "rejected": metrics["rejected"],
        "errored": metrics["errored"],
        "timeouts": metrics["timeouts"],
        "dropped_by_client": metrics["dropped_by_client"],
        "ttft_p50_ms": metrics["ttft_ms"].get("p50"),
        "ttft_p95_ms": metrics["ttft_ms"].get("p95"),
        "server_ttft_p50_ms": metrics["server_ttft_ms"].get("p50"),
        "e2e_p50_ms": metrics["e2e_ms"].get("p50"),
        "mean_plan_passages": _mean(r.plan_passages for r in records),
        "mean_plan_rerank_depth": _mean(r.plan_rerank_depth for r in records),
        "mean_plan_retrieve_k": _mean(r.plan_retrieve_k for r in records),
        "mean_passages_in_prompt": _mean(r.passages_in_prompt for r in records),
        "plans_reported": sum(r.plan_passages is not None for r in records),
        "cuts": dict(sorted(cuts.items())),
        "cached_token_share": _rounded(metrics["cached_token_share"]),
        "stage_p50_ms": metrics["stage_p50_ms"],
        "elapsed_s": metrics["elapsed_s"],
    }


def outcomes(levels: Iterable[Mapping[str, Any]]) -> list[LevelOutcome]:
    return [
        LevelOutcome(level["rate"], level["slo_attainment"], level["quality_answered"])
        for level in levels
    ]


def lowest_rate_quality(levels: Sequence[Mapping[str, Any]]) -> tuple[float, float | None]:
    """(rate, quality_answered) of the lowest rate of a configuration's levels."""
    lowest = min(levels, key=lambda level: float(level["rate"]))
    return float(lowest["rate"]), lowest["quality_answered"]
