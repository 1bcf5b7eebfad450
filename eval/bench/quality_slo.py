"""Quality within the SLO, Q_c(rate): the metrics of `eval/bench/planner_quality_slo.py`, pure,
over the load engine's records (answers kept) of every configuration on the same arrivals.

Definitions:
- an arrival is **correct** when its request finished `ok` and the answer holds a gold answer
  string (`[n]` markers stripped); for an arrival whose gold passage was removed from the index,
  also when the answer abstains. A refusal, an error, a timeout, a dropped arrival or an
  abstention on an answerable question is not correct;
- **within the SLO**: finished `ok` with the client's first token at or under the SLO;
- `quality_within_slo` (Q_c): the share of all arrivals both correct and within the SLO;
  `attainment`: the share within the SLO; `answer_recall`: the share of the answerable arrivals
  answered right (late or not); `abstention`: the share of all arrivals that abstained;
  `refused`: the share rejected (429/503) or dropped by the client; `mode_mix`: the share of
  arrivals answered by each form (`quote`, `focused`, `passages`, `abstain`, ...; `none` for
  arrivals that got no answer);
- at each rate, the **hindsight envelope** is the best fixed configuration's Q_c; the
  **per-query oracle** takes, arrival by arrival, the best of the fixed configurations on the
  same arrival; the planner's **gain** is its Q_c minus the best fixed one's, with a
  paired-bootstrap 95% interval over arrivals.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from eval.lib.latency_stats import RequestRecord
from eval.lib.squad_metrics import abstains, answer_recall, strip_citations

# Arrivals per configuration and rate that the benchmark asks for by default.
ARRIVALS = 300
BOOTSTRAP_RESAMPLES = 2000


@dataclass(frozen=True, slots=True)
class Gold:
    """What makes an answer to a question right: its gold answer strings, and whether its gold
    passage was removed from the index (then abstaining is right too)."""

    answers: tuple[str, ...]
    removed: bool = False


@dataclass(frozen=True, slots=True)
class Arrival:
    """One arrival as one configuration served it."""

    arrival: int
    question_id: str
    correct: bool
    within_slo: bool
    abstained: bool
    refused: bool
    removed: bool
    form: str
    status: str
    ttft_ms: float | None

    @property
    def good(self) -> bool:
        return self.correct and self.within_slo

    def line(self, slo_ms: float, config: str, rate: float) -> dict[str, Any]:
        """Its line of `planner-quality-slo.requests.jsonl.gz`."""
        return {
            "slo_ms": slo_ms,
            "config": config,
            "rate": rate,
            "arrival": self.arrival,
            "question_id": self.question_id,
            "correct": self.correct,
            "within_slo": self.within_slo,
            "form": self.form,
            "status": self.status,
            "removed": self.removed,
            "ttft_ms": None if self.ttft_ms is None else round(self.ttft_ms, 1),
        }


def judge(record: RequestRecord, arrival: int, gold: Gold, slo_ms: float) -> Arrival:
    ok = record.status == "ok" and record.answer is not None
    answer = record.answer or ""
    abstained = ok and (record.form == "abstain" or abstains(answer))
    holds_gold = ok and answer_recall(strip_citations(answer), gold.answers) > 0
    ttft = record.client_ttft_ms
    return Arrival(
        arrival=arrival,
        question_id=record.question_id,
        correct=holds_gold or (gold.removed and abstained),
        within_slo=ok and ttft is not None and ttft <= slo_ms,
        abstained=abstained,
        refused=record.status in ("rejected", "dropped"),
        removed=gold.removed,
        form=(record.form or "unknown") if ok else "none",
        status=record.status,
        ttft_ms=ttft,
    )


def arrival_numbers(records: Sequence[RequestRecord], planned: Sequence[float]) -> list[int]:
    """Each record's place among the level's planned arrivals (the index every configuration
    shares), matched on its planned offset."""
    place = {round(offset, 6): n for n, offset in enumerate(planned)}
    numbers = []
    for record in records:
        if record.planned_offset_s is None:
            raise ValueError(f"record of {record.question_id} has no planned arrival time")
        numbers.append(place[round(record.planned_offset_s, 6)])
    return numbers


def judged_level(
    records: Sequence[RequestRecord],
    planned: Sequence[float],
    golds: Mapping[str, Gold],
    slo_ms: float,
) -> list[Arrival]:
    """The level's arrivals in arrival order, each judged."""
    numbers = arrival_numbers(records, planned)
    if sorted(numbers) != list(range(len(planned))):
        raise ValueError(f"{len(records)} records for {len(planned)} planned arrivals")
    judged = [
        judge(record, number, golds[record.question_id], slo_ms)
        for record, number in zip(records, numbers, strict=True)
    ]
    return sorted(judged, key=lambda a: a.arrival)


def _share(values: Sequence[bool]) -> float | None:
    return round(sum(values) / len(values), 4) if values else None


def level_quality(arrivals: Sequence[Arrival]) -> dict[str, Any]:
    """One configuration at one rate (module docstring)."""
    answerable = [a for a in arrivals if not a.removed]
    forms = Counter(a.form for a in arrivals)
    return {
        "quality_within_slo": _share([a.good for a in arrivals]),
        "attainment": _share([a.within_slo for a in arrivals]),
        "answer_recall": _share([a.correct for a in answerable]),
        "abstention": _share([a.abstained for a in arrivals]),
        "abstention_when_removed": _share([a.abstained for a in arrivals if a.removed]),
        "refused": _share([a.refused for a in arrivals]),
        "arrivals": len(arrivals),
        "removed_arrivals": len(arrivals) - len(answerable),
        "mode_mix": {form: round(n / len(arrivals), 4) for form, n in sorted(forms.items())},
    }


def paired_gain(
    mine: Sequence[bool],
    theirs: Sequence[bool],
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = 0,
) -> dict[str, float]:
    """Mean of mine - theirs over paired arrivals, with a bootstrap 95% interval."""
    n = len(mine)
    if n == 0 or n != len(theirs):
        raise ValueError(f"paired samples of {n} and {len(theirs)}")
    diff = [float(a) - float(b) for a, b in zip(mine, theirs, strict=True)]
    rng = random.Random(seed)
    draws = sorted(sum(diff[rng.randrange(n)] for _ in range(n)) / n for _ in range(resamples))
    return {
        "gain": round(sum(diff) / n, 4),
        "ci95_low": round(draws[int(0.025 * resamples)], 4),
        "ci95_high": round(draws[int(0.975 * resamples) - 1], 4),
    }


def rate_comparison(
    levels: Mapping[str, Sequence[Arrival]], fixed: Sequence[str], planner: str | None
) -> dict[str, Any]:
    """At one rate: the envelope, the per-query oracle and the planner against both, from every
    configuration's judged arrivals of that rate (the same arrivals in each)."""
    present = [name for name in fixed if name in levels]
    if not present:
        return {}
    counts = {len(levels[name]) for name in present}
    if len(counts) != 1:
        raise ValueError(f"configurations saw different arrival counts: {sorted(counts)}")
    good = {name: [a.good for a in levels[name]] for name in present}
    share = {name: sum(good[name]) / len(good[name]) for name in present}
    best = max(present, key=lambda name: share[name])
    oracle = [any(column) for column in zip(*good.values(), strict=True)]
    result: dict[str, Any] = {
        "envelope": round(share[best], 4),
        "best_fixed": best,
        "oracle": _share(oracle),
        "oracle_headroom": paired_gain(oracle, good[best]),
    }
    if planner is not None and planner in levels:
        mine = [a.good for a in levels[planner]]
        result["planner"] = _share(mine)
        result["planner_vs_best_fixed"] = paired_gain(mine, good[best])
        result["planner_within_3_points"] = share[best] - sum(mine) / len(mine) <= 0.03
    return result
