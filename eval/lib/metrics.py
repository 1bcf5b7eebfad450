"""Answer metrics, in one place: SQuAD v1.1's official exact match and F1, answer-string recall,
citation precision and recall against a gold passage, and abstention; then quality within the
SLO, Q_c(rate), over the load engine's records (answers kept) of every configuration of
`eval/bench/planner_quality_slo.py` on the same arrivals. (Latency percentiles and goodput over
the load engine's records are in `eval/lib/latency_stats.py`.)

`normalize_answer`, `exact_match` and `f1` follow the official SQuAD v1.1 evaluation script
(lower-case, strip punctuation, drop the articles a/an/the, collapse whitespace; F1 over the
bag of normalised tokens; the maximum over the gold answers).

Quality within the SLO. Definitions:
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
import re
import string
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from eval.lib.latency_stats import RequestRecord

_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_CITATION = re.compile(r"\[(\d{1,3})\]")

# What an answer that declines to answer says. The service's own refusal (and the model's,
# as the system prompt asks) uses the first; the others are common paraphrases.
_ABSTENTION = re.compile(
    r"\b(?:i\s+(?:do\s+not|don't|cannot|can't)\s+know"
    r"|(?:passages|context|sources)\s+(?:do|does)\s+not\s+(?:contain|say|mention|provide)"
    r"|(?:cannot|can't|unable\s+to)\s+(?:answer|find|determine)"
    r"|no\s+(?:relevant\s+)?information)\b",
    re.IGNORECASE,
)


_LISTED = re.compile(r"\b(closest|retrieved) (sources|passages) are (listed|shown)\b", re.I)


def normalize_answer(text: str) -> str:
    """The official SQuAD v1.1 normalisation."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in _PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def _f1_one(prediction: str, gold: str) -> float:
    predicted = normalize_answer(prediction).split()
    expected = normalize_answer(gold).split()
    same = sum((Counter(predicted) & Counter(expected)).values())
    if same == 0:
        return 0.0
    precision = same / len(predicted)
    recall = same / len(expected)
    return 2 * precision * recall / (precision + recall)


def exact_match(prediction: str, golds: Sequence[str]) -> float:
    """1.0 when the normalised prediction equals a normalised gold answer."""
    normalised = normalize_answer(prediction)
    return float(any(normalised == normalize_answer(gold) for gold in golds))


def f1(prediction: str, golds: Sequence[str]) -> float:
    """Token F1 against the best-matching gold answer."""
    return max((_f1_one(prediction, gold) for gold in golds), default=0.0)


def answer_recall(prediction: str, golds: Sequence[str]) -> float:
    """1.0 when a gold answer appears in the prediction, as whole normalised tokens."""
    haystack = f" {normalize_answer(prediction)} "
    return float(
        any(f" {needle} " in haystack for gold in golds if (needle := normalize_answer(gold)))
    )


def cited_numbers(answer: str) -> tuple[int, ...]:
    """The `[n]` markers in an answer, in order of first appearance."""
    return tuple(dict.fromkeys(int(n) for n in _CITATION.findall(answer)))


def strip_citations(answer: str) -> str:
    """The answer without its `[n]` markers, which are not part of the answer's words."""
    return _CITATION.sub(" ", answer)


def citation_precision(cited: Collection[str], gold: Collection[str]) -> float | None:
    """Share of cited passages that are gold; None when nothing is cited (undefined)."""
    if not cited:
        return None
    return len(set(cited) & set(gold)) / len(set(cited))


def citation_recall(cited: Collection[str], gold: Collection[str]) -> float | None:
    """Share of gold passages that are cited; None when there is no gold passage."""
    if not gold:
        return None
    return len(set(cited) & set(gold)) / len(set(gold))


def abstains(answer: str) -> bool:
    """Whether the answer declines to answer: it says it does not know and says nothing else
    (the service's "The closest sources are listed." aside). "I do not know" followed by a
    guess is an answer, and a wrong one if the guess is."""
    if not answer.strip():
        return True
    sentences = [s for s in re.split(r"(?<=[.!?])\s+", strip_citations(answer).strip()) if s]
    declines = [bool(_ABSTENTION.search(s)) or bool(_LISTED.search(s)) for s in sentences]
    return bool(_ABSTENTION.search(answer)) and all(declines)


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
    # Right with the short answer shown where the quote has one (else its whole answer).
    short_correct: bool = False

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
            "short_correct": self.short_correct,
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
    short = record.short_answer
    short_holds = holds_gold if short is None else ok and answer_recall(short, gold.answers) > 0
    ttft = record.client_ttft_ms
    return Arrival(
        arrival=arrival,
        question_id=record.question_id,
        correct=holds_gold or (gold.removed and abstained),
        short_correct=short_holds or (gold.removed and abstained),
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
        "short_quality_within_slo": _share([a.short_correct and a.within_slo for a in arrivals]),
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
