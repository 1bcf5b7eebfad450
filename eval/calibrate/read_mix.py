"""How the sentence reader's scores join the scorer's (retrieval/sentences/reader.py `ReadMix`),
learned by `python -m eval.calibrate.sentence_scorer` on the scorer-training articles.

The reader is learned on SQuAD train (`python -m eval.calibrate.sentence_reader`), which shares
no article with the split, so its scores of the scorer-training questions
are those of a reader that never saw them: the shipped reader reads them as it serves. Each depth, doubt and weight of a small grid is tried
with the quote's selection chosen for it; the one whose quotes answer the most training
questions at the median length allowed is kept, then its combined score is calibrated to a
probability.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from eval.calibrate.quote_metrics import platt, quote_metrics, scored, selection_for
from eval.lib.metrics import answer_recall
from retrieval.sentences.quote import QuoteConfig
from retrieval.sentences.reader import Read, ReadMix, SentenceReader, reread
from retrieval.sentences.scorer import Candidate, ScoredSentence, SentenceModel

# The grid. Under ONNX Runtime in int8 a read of four sentences takes about 20 ms on two AVX2
# cores (docs/benchmarks/reader-training.json), so up to six are read, only in doubt (a doubt
# under 1: a sure scorer is not read), so that most quotes keep their first token in tens of
# milliseconds. With the reader learned on six articles, reading eight or every time measured
# no better (docs/answers.md); the reader learned on SQuAD train is tried again at 6.
DEPTHS = (3, 4, 6)
DOUBTS = (0.5, 0.6, 0.8)
WEIGHTS = (0.5, 1.0, 2.0)


def live(reader: SentenceReader, question: str) -> Read:
    """The reader's scores of a question's candidates, each sentence read once (the mix's grid
    asks for the same ones again)."""
    known: dict[str, float] = {}

    def read(found: Sequence[Candidate]) -> npt.NDArray[np.float64]:
        todo = [c for c in found if c.text not in known]
        if todo:
            known.update(zip((c.text for c in todo), reader.read(question, todo), strict=True))
        return np.asarray([known[c.text] for c in found], dtype=np.float64)

    return read


def fit_mix(
    examples: Sequence[Any],
    model: SentenceModel,
    reads: dict[str, Read],
    max_median_words: float,
) -> tuple[ReadMix, QuoteConfig, list[dict[str, Any]]]:
    """The mix (and the quote's selection for it) that answers the most of `examples`."""
    first = {e.question.question_id: scored(e, model) for e in examples}
    tried: list[dict[str, Any]] = []
    best: tuple[float, ReadMix, QuoteConfig] | None = None
    for depth, doubt, weight in itertools.product(DEPTHS, DOUBTS, WEIGHTS):
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
