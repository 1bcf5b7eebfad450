"""How the sentence reader's scores join the scorer's (retrieval/sentences/reader.py `ReadMix`),
learned by `python -m eval.calibrate.sentence_scorer` on the scorer-training articles.

The reader is learned on SQuAD train (`python -m eval.calibrate.sentence_reader`), which shares
no article with the split, so its scores of the scorer-training questions
(`eval/results/sentence-reader-scores.json.gz`, looked up by sentence text; the file's
`out_of_fold` key is kept from when the reader was learned on folds of these articles) are
those of a reader that never saw them. Each depth, doubt and weight of a small grid is tried
with the quote's selection chosen for it; the one whose quotes answer the most training
questions at the median length allowed is kept, then its combined score is calibrated to a
probability.
"""

from __future__ import annotations

import dataclasses
import gzip
import itertools
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from eval.calibrate.quote_metrics import platt, quote_metrics, scored, selection_for
from eval.calibrate.sentence_reader import SCORES
from eval.lib.metrics import answer_recall
from retrieval.sentences.quote import QuoteConfig
from retrieval.sentences.reader import Read, ReadMix, SentenceReader, reread
from retrieval.sentences.scorer import Candidate, ScoredSentence, SentenceModel

# The grid. A read sentence costs about 15 ms on two AVX2 cores (one encoder pass of a ~60-token
# pair), so at most four are read, and only in doubt (a doubt under 1: a sure scorer is not
# read), so that most quotes keep their first token in tens of milliseconds. On the training
# questions, reading eight or every time measured no better (0.776 to 0.782 answer recall
# across a grid of depths 3, 4 and 8 and doubts up to always; docs/answers.md).
DEPTHS = (3, 4)
DOUBTS = (0.5, 0.6, 0.8)
WEIGHTS = (0.5, 1.0, 2.0)


class OutOfFold:
    """The reader's out-of-fold scores of the scorer-training questions."""

    def __init__(self, path: Path = SCORES) -> None:
        with gzip.open(path, "rt", encoding="utf-8") as f:
            self._scores: dict[str, dict[str, float]] = json.load(f)["out_of_fold"]
        # Sentences asked for that the file does not hold (the scorer's order changed since).
        self.missing = 0

    def read_for(self, question_id: str) -> Read:
        known = self._scores.get(question_id, {})

        def read(found: Sequence[Candidate]) -> npt.NDArray[np.float64]:
            floor = min(known.values(), default=0.0)
            values = []
            for candidate in found:
                value = known.get(candidate.text)
                if value is None:
                    self.missing += 1
                    value = floor
                values.append(value)
            return np.asarray(values, dtype=np.float64)

        return read


def live(reader: SentenceReader, question: str) -> Read:
    return lambda found: reader.read(question, found)


def fit_mix(
    examples: Sequence[Any],
    model: SentenceModel,
    reads: dict[str, Read],
    max_median_words: float,
    keep: ReadMix | None = None,
) -> tuple[ReadMix, QuoteConfig, list[dict[str, Any]]]:
    """The mix (and the quote's selection for it) that answers the most of `examples`; with
    `keep`, that mix's depth, doubt and weight, only its calibration and the selection fitted."""
    first = {e.question.question_id: scored(e, model) for e in examples}
    tried: list[dict[str, Any]] = []
    best: tuple[float, ReadMix, QuoteConfig] | None = None
    grid = (
        itertools.product(DEPTHS, DOUBTS, WEIGHTS)
        if keep is None
        else [(keep.depth, keep.doubt, keep.weight)]
    )
    for depth, doubt, weight in grid:
        mix = ReadMix(depth, doubt, weight)
        rank = lookup({qid: reread(first[qid], mix, reads[qid])[0] for qid in first})
        config = selection_for(examples, rank, max_median_words)
        found = quote_metrics(examples, rank, config)
        recall = float(found["answer_recall"] or 0.0)
        tried.append({**mix.to_json(), "words_weight": config.words_weight, **found})
        if best is None or recall > best[0]:
            best = (recall, mix, config)
    assert best is not None
    _, mix, config = best
    rankings = [
        reread(first[e.question.question_id], mix, reads[e.question.question_id])[0]
        for e in examples
    ]
    scores = np.concatenate([[s.score for s in r] for r in rankings])
    labels = np.concatenate(
        [np.asarray([_label(e, s) for s in r]) for e, r in zip(examples, rankings, strict=True)]
    )
    slope, intercept = platt(scores, labels)
    return dataclasses.replace(mix, slope=slope, intercept=intercept), config, tried


def lookup(ranked: dict[str, list[ScoredSentence]]) -> Callable[[Any], list[ScoredSentence]]:
    """An example's ranking, from rankings made beforehand (by question id)."""
    return lambda example: ranked[example.question.question_id]


def reread_all(
    examples: Sequence[Any], model: SentenceModel, mix: ReadMix, reads: dict[str, Read]
) -> dict[str, list[ScoredSentence]]:
    return {
        e.question.question_id: reread(scored(e, model), mix, reads[e.question.question_id])[0]
        for e in examples
    }


def fit_reader(
    train: Sequence[Any],
    model: SentenceModel,
    max_median_words: float,
    keep: ReadMix | None = None,
) -> tuple[ReadMix, QuoteConfig, dict[str, Any]]:
    """`fit_mix` on the out-of-fold scores, and what it tried."""
    oof = OutOfFold()
    reads = {e.question.question_id: oof.read_for(e.question.question_id) for e in train}
    mix, config, tried = fit_mix(train, model, reads, max_median_words, keep)
    return (
        mix,
        config,
        {
            "mix": mix.to_json(),
            "kept": keep is not None,
            "tried": tried,
            "missing_scores": oof.missing,
        },
    )


def frontier(
    examples: Sequence[Any], rank: Callable[[Any], list[ScoredSentence]]
) -> list[dict[str, Any]]:
    """Answer recall against the quote's median length, one point per price per word."""
    out = []
    for words_weight in (0.004, 0.005, 0.006, 0.007, 0.008, 0.01, 0.015):
        config = QuoteConfig(min_probability=0.0, words_weight=words_weight)
        found = quote_metrics(examples, rank, config)
        out.append(
            {
                "words_weight": words_weight,
                "answer_recall": found["answer_recall"],
                "words_median": found["words_median"],
            }
        )
    return out


def _label(example: Any, sentence: ScoredSentence) -> float:
    return answer_recall(sentence.candidate.text, example.question.answers)
