"""How quotes answer a set of SQuAD examples (the sentence scorer's command and the reader's mix
measure with it), and the quote's selection that answers the most of them at a length."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from eval.lib.metrics import answer_recall
from retrieval.sentences.quote import QuoteConfig, select_quote
from retrieval.sentences.scorer import ScoredSentence, SentenceModel
from retrieval.sentences.terms import content_terms


def platt(scores: npt.NDArray[np.float64], labels: npt.NDArray[np.float64]) -> tuple[float, float]:
    """The logistic sigmoid(a * score + b) that fits the labels best (Newton's method)."""
    z = np.column_stack([scores, np.ones_like(scores)])
    w = np.zeros(2)
    for _ in range(50):
        p = 1.0 / (1.0 + np.exp(-np.clip(z @ w, -30, 30)))
        gradient = z.T @ (p - labels)
        hessian = (z * (p * (1 - p))[:, None]).T @ z + 1e-6 * np.eye(2)
        step = np.linalg.solve(hessian, gradient)
        w -= step
        if np.abs(step).max() < 1e-10:
            break
    return float(w[0]), float(w[1])


def selection(
    examples: Sequence[Any], model: SentenceModel, max_median_words: float
) -> QuoteConfig:
    """The chance per word a further sentence must bring (`QuoteConfig.words_weight`) that
    answers the most training questions while keeping the median quote at most
    `max_median_words` words."""
    return selection_for(examples, lambda e: scored(e, model), max_median_words)


def selection_for(
    examples: Sequence[Any],
    rank: Callable[[Any], list[ScoredSentence]],
    max_median_words: float,
) -> QuoteConfig:
    """`selection` for the ranking `rank` gives."""
    best: tuple[float, QuoteConfig] | None = None
    for weight in (0.003, 0.004, 0.005, 0.006, 0.007, 0.008, 0.01, 0.012, 0.015, 0.02, 0.03):
        config = QuoteConfig(min_probability=0.0, words_weight=weight)
        found = quote_metrics(examples, rank, config)
        recall, median = found["answer_recall"], found["words_median"]
        if recall is None or median is None or median > max_median_words:
            continue
        if best is None or recall > best[0]:
            best = (float(recall), config)
    if best is None:
        return QuoteConfig(min_probability=0.0)
    return best[1]


def scored(example: Any, model: SentenceModel) -> list[ScoredSentence]:
    return model.rank(example.found, example.features)


def naive(example: Any, idf: Any) -> list[ScoredSentence]:
    """IDF-weighted overlap of the question's words, best first (the baseline). Its scores
    carry no chance of answering, so its quote is its best sentence (with the one that sentence
    leans on); `first_two_recall` is the two-sentence baseline."""
    asked = content_terms(example.question.question)
    scores = [idf.weighted_coverage(asked, content_terms(c.text)) for c in example.found]
    order = sorted(range(len(scores)), key=lambda i: -scores[i])
    return [ScoredSentence(example.found[i], scores[i]) for i in order]


def quote_metrics(
    examples: Sequence[Any],
    rank: Any,
    config: QuoteConfig,
    abstains: Callable[[Any], bool] | None = None,
) -> dict[str, float | int | None]:
    recalls: list[float] = []
    words: list[int] = []
    precise: list[float] = []
    first: list[bool] = []
    first_two: list[bool] = []
    abstained = 0
    for example in examples:
        ranked = rank(example)
        answers = example.question.answers
        top = [s for s in ranked if s.candidate.ref.whole and s.candidate.ref.kind != "code"]
        first.append(bool(top) and answer_recall(top[0].candidate.text, answers) > 0)
        first_two.append(any(answer_recall(s.candidate.text, answers) > 0 for s in top[:2]))
        quote = select_quote(ranked, config, example.question.question)
        if not quote or (abstains is not None and abstains(example)):
            abstained += 1
            recalls.append(0.0)
            continue
        text = " ".join(q.text for q in quote)
        recalls.append(answer_recall(text, answers))
        words.append(len(text.split()))
        gold = example.question.gold_passage_id
        precise.extend(float(q.passage.doc_id == gold) for q in quote)
    n = len(examples)
    return {
        "questions": n,
        "answer_recall": round(statistics.fmean(recalls), 4) if recalls else None,
        "first_sentence_recall": round(sum(first) / n, 4) if n else None,
        "first_two_recall": round(sum(first_two) / n, 4) if n else None,
        "citation_precision": round(statistics.fmean(precise), 4) if precise else None,
        "words_median": statistics.median(words) if words else None,
        "words_p90": float(np.percentile(words, 90)) if words else None,
        "words_max": max(words) if words else None,
        "abstained": abstained,
    }
