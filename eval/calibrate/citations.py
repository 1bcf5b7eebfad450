"""`answer-eval calibrate-citations`: measure the two thresholds of answer_service/pipeline/attribution.py
on SQuAD instead of guessing them.

The questions are split in two by a hash of their id: thresholds are chosen on one half
(`calibration`) and reported on the other (`held_out`).

- Abstention (`abstain_below`): each question is retrieved as the service retrieves it (hybrid,
  top k). Its evidence is how well the best of those k passages covers the question's terms.
  Answerable: questions whose gold passage is in the top k. Gold removed: the same questions
  with the gold passage taken out of the ranking (the next passage moves up), as if the index
  did not hold it. The threshold is the highest that abstains on at most `max_false_abstention`
  of the answerable questions; the report gives, on the held-out half, the false abstention
  rate and the abstention rate with the gold passage removed (split by whether another
  retrieved passage still contains a gold answer string).
- Citation support (`citation_threshold`): a claim is the question followed by its gold answer
  (what a correct answer sentence says). It is supported by its gold passage and by no
  retrieved passage lacking every gold answer string. The threshold maximises F1 of "coverage
  ≥ threshold" over those pairs.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from answer_service.pipeline.attribution import content_terms, coverage, evidence
from budget import Deadline
from eval.lib.questions import Question
from retrieval.passage import ScoredPassage
from retrieval.retriever import Retriever

_GRID = np.round(np.arange(0.0, 1.0001, 0.01), 2)


@dataclass(frozen=True, slots=True)
class Retrieved:
    question: Question
    passages: tuple[ScoredPassage, ...]  # top k + 1, in retrieval order

    def texts(self, *, without_gold: bool, k: int) -> list[str]:
        kept = [p for p in self.passages if not (without_gold and self.is_gold(p))]
        return [f"{p.passage.title}\n{p.passage.text}" for p in kept[:k]]

    def is_gold(self, passage: ScoredPassage) -> bool:
        return passage.passage.doc_id == self.question.gold_passage_id

    def holds_answer(self, text: str) -> bool:
        lowered = text.lower()
        return any(answer.lower() in lowered for answer in self.question.answers)


def half(question: Question) -> str:
    digest = hashlib.sha256(question.question_id.encode()).digest()
    return "calibration" if digest[0] % 2 == 0 else "held_out"


async def retrieve_all(
    retriever: Retriever, questions: Sequence[Question], k: int, progress: bool = True
) -> list[Retrieved]:
    out = []
    for question in tqdm(questions, desc="retrieve", unit="question", disable=not progress):
        deadline = Deadline.after_ms(30_000)
        found = await retriever.retrieve(question.question, k + 1, deadline, mode="hybrid")
        out.append(Retrieved(question, tuple(found.passages)))
    return out


def _rate(flags: Sequence[bool]) -> float | None:
    return round(float(np.mean(flags)), 4) if flags else None


def abstention_threshold(evidences: Sequence[float], max_false_abstention: float) -> float:
    """The highest grid threshold that abstains (evidence < t) on at most that share."""
    values = np.asarray(evidences)
    allowed = [t for t in _GRID if np.mean(values < t) <= max_false_abstention]
    return float(max(allowed))


def abstention_report(
    retrieved: Sequence[Retrieved], threshold: float, k: int
) -> dict[str, float | int | None]:
    answerable = [r for r in retrieved if any(r.is_gold(p) for p in r.passages[:k])]
    removed = [(r, r.texts(without_gold=True, k=k)) for r in retrieved]
    still = [(r, t) for r, t in removed if any(r.holds_answer(x) for x in t)]
    gone = [(r, t) for r, t in removed if not any(r.holds_answer(x) for x in t)]

    def abstains(r: Retrieved, texts: list[str]) -> bool:
        return evidence(r.question.question, texts) < threshold

    return {
        "questions": len(retrieved),
        "gold_in_top_k": len(answerable),
        "false_abstention_rate": _rate(
            [abstains(r, r.texts(without_gold=False, k=k)) for r in answerable]
        ),
        "abstention_rate_gold_removed": _rate([abstains(r, t) for r, t in removed]),
        "abstention_rate_gold_removed_no_answer_left": _rate([abstains(r, t) for r, t in gone]),
        "abstention_rate_gold_removed_answer_elsewhere": _rate([abstains(r, t) for r, t in still]),
    }


def support_pairs(retrieved: Sequence[Retrieved], k: int) -> tuple[list[float], list[bool]]:
    """(coverage, supported) for each claim against its gold passage and against the
    retrieved passages that hold no gold answer string."""
    scores: list[float] = []
    labels: list[bool] = []
    for r in retrieved:
        claim = content_terms(f"{r.question.question} {r.question.answers[0]}")
        for p in r.passages[:k]:
            text = f"{p.passage.title}\n{p.passage.text}"
            if r.is_gold(p) or not r.holds_answer(text):
                scores.append(coverage(claim, content_terms(text)))
                labels.append(r.is_gold(p))
    return scores, labels


def precision_recall(
    scores: Sequence[float], labels: Sequence[bool], threshold: float
) -> dict[str, float | None]:
    predicted = np.asarray(scores) >= threshold
    truth = np.asarray(labels, dtype=bool)
    tp = int(np.sum(predicted & truth))
    precision = tp / int(np.sum(predicted)) if predicted.any() else None
    recall = tp / int(np.sum(truth)) if truth.any() else None
    f1 = (
        2 * precision * recall / (precision + recall)
        if precision is not None and recall is not None and precision + recall > 0
        else None
    )
    return {
        "precision": None if precision is None else round(precision, 4),
        "recall": None if recall is None else round(recall, 4),
        "f1": None if f1 is None else round(f1, 4),
    }


def support_threshold(scores: Sequence[float], labels: Sequence[bool]) -> float:
    best = max(_GRID[1:], key=lambda t: precision_recall(scores, labels, t)["f1"] or 0.0)
    return float(best)


def calibrate(
    retrieved: Sequence[Retrieved], *, k: int, max_false_abstention: float
) -> dict[str, Any]:
    halves = {
        name: [r for r in retrieved if half(r.question) == name]
        for name in ("calibration", "held_out")
    }
    calibration, held_out = halves["calibration"], halves["held_out"]
    answerable = [r for r in calibration if any(r.is_gold(p) for p in r.passages[:k])]
    abstain_below = abstention_threshold(
        [evidence(r.question.question, r.texts(without_gold=False, k=k)) for r in answerable],
        max_false_abstention,
    )
    cal_scores, cal_labels = support_pairs(calibration, k)
    threshold = support_threshold(cal_scores, cal_labels)
    held_scores, held_labels = support_pairs(held_out, k)
    return {
        "abstain_below": abstain_below,
        "citation_threshold": threshold,
        "abstention": {
            "calibration": abstention_report(calibration, abstain_below, k),
            "held_out": abstention_report(held_out, abstain_below, k),
        },
        "citation_support": {
            "calibration": {
                "pairs": len(cal_labels),
                **precision_recall(cal_scores, cal_labels, threshold),
            },
            "held_out": {
                "pairs": len(held_labels),
                **precision_recall(held_scores, held_labels, threshold),
            },
        },
    }


def write(path: Path, config: dict[str, Any], result: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps({"command": "calibrate-citations", "config": config, **result}, indent=2) + "\n"
    )


def corpus_without(corpus: Path, removed: set[str], cache_dir: Path) -> Path:
    """A copy of the corpus JSONL without the documents in `removed` (kept in `cache_dir`,
    named by what it holds, so its index is built once)."""
    key = hashlib.sha256(
        (str(corpus.resolve()) + "\n" + "\n".join(sorted(removed))).encode()
    ).hexdigest()[:16]
    out = cache_dir / f"{corpus.stem}-without-{len(removed)}-{key}.jsonl"
    if not out.is_file():
        cache_dir.mkdir(parents=True, exist_ok=True)
        partial = out.with_suffix(".partial")
        with corpus.open() as source, partial.open("w") as sink:
            for line in source:
                if line.strip() and json.loads(line).get("_id") not in removed:
                    sink.write(line)
        partial.replace(out)
    return out
