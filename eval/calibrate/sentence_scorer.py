"""Learn the sentence scorer's weights on SQuAD and measure quoted answers, on the committed split.

    python -m eval.calibrate.sentence_scorer --out eval/results/sentence-scorer.json \\
        [--weights retrieval/sentences/scorer.json] [--top-k 5]

Reads ../shared/data/squad-v1.1-open. The whole corpus (48 articles) is indexed as the service
indexes it; every question is retrieved for (hybrid, top `--top-k`), and each sentence of the
retrieved passages is a training example, labelled by whether it holds a gold answer string
(SQuAD normalisation). A logistic model is fitted on the scorer-training articles; the quote's
selection and the abstention threshold are chosen on the same articles; everything is then
measured on the evaluation articles (the planner-training ones with `--measure-on
planner_training`, while choosing), beside a naive picker (IDF-weighted word overlap). The
scorer puts the answering sentence first, calibrated to a probability (retrieval/sentences/scorer.py).
Abstention reads the answerable model (retrieval/sentences/answerable.py), learned on the
first `--abstention-train` questions of SQuAD train (10,000 from 400-odd articles, none in the
split; over an index of all of SQuAD train): each is asked as it is and again as if its own gold
document were not in the index (the rest of its article, which resembles it most, stays), and
a logistic model learns from the first pass whether the quote holds a gold answer. Its
threshold, chosen on the same questions, answers the most questions right when
`--unanswerable-share` of them (one in five, as the planner benchmark asks) cannot be answered
from the corpus, abstaining there being right, with no more than `--max-false-abstention` of the
answerable ones whose answer was retrieved refused (the best sentence's probability beside it).
Then the sentence reader (retrieval/sentences/reader.py, learned by
`python -m eval.calibrate.sentence_reader`) is mixed in (eval/calibrate/read_mix.py): where
and how much it reads and how much its score counts, fitted on the training questions as the
shipped reader reads them (learned on SQuAD train, it never saw them), with the quote's
selection chosen again for the reread order. Abstention still reads the first pass. The
evaluation questions are read by the shipped reader too, beside the first pass alone
(`--no-reader`: no mix is learned).
The weights the service loads are written to `--weights`.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from scipy.optimize import minimize  # type: ignore[import-untyped]

from eval.calibrate.quote_metrics import naive, platt, quote_metrics, scored, selection
from eval.calibrate.read_mix import fit_mix, frontier, live, lookup, reread_all
from eval.calibrate.sentence_examples import Example, examples_of, part_questions, retriever_for
from eval.calibrate.sentence_reader import train_questions
from eval.lib.data import SQUAD_DIR, SQUAD_TRAIN_DIR, shared
from eval.lib.metrics import answer_recall
from eval.lib.results import measured_at, write_result
from retrieval.sentences.answerable import AnswerableModel, answerable_features, fit_answerable
from retrieval.sentences.quote import QuoteConfig, select_quote
from retrieval.sentences.reader import ReaderConfig, ReadMix, SentenceReader, to_read
from retrieval.sentences.scorer import (
    FEATURES,
    ScoredSentence,
    ScorerWeights,
    SentenceModel,
    best_probabilities,
)

logger = logging.getLogger(__name__)

WEIGHTS = Path(__file__).resolve().parents[2] / "retrieval" / "sentences" / "scorer.json"


def fit(examples: Sequence[Example], l2: float = 1.0) -> ScorerWeights:
    """A conditional logit over each question's quotable candidates (what it learns is to put
    the answering sentence first), then a one-variable logistic on its score against every
    candidate's label (the probability abstention reads)."""
    usable = [e for e in examples if len(e.found)]
    x = np.vstack([e.features for e in usable])
    mean, scale = x.mean(axis=0), x.std(axis=0)
    mean[0], scale[0] = 0.0, 1.0  # the bias column stays 1
    scale[scale == 0] = 1.0
    groups = []
    for e in usable:
        ok = np.asarray([c.ref.whole and c.ref.kind != "code" for c in e.found])
        target = e.labels * ok
        if target.any():
            groups.append((((e.features - mean) / scale)[ok], (target / target.sum())[ok]))

    def loss(w: npt.NDArray[np.float64]) -> tuple[float, npt.NDArray[np.float64]]:
        total = 0.5 * l2 * float(np.sum(w[1:] ** 2))
        gradient = l2 * w
        gradient[0] = 0.0
        for z, t in groups:
            s = z @ w
            top = s.max()
            p = np.exp(s - top)
            norm = p.sum()
            total -= float(t @ (s - top - np.log(norm)))
            gradient += z.T @ (p / norm - t)
        return total, gradient

    result = minimize(loss, np.zeros(x.shape[1]), jac=True, method="L-BFGS-B")
    w = result.x
    ranked = ScorerWeights(
        FEATURES, tuple(map(float, w)), tuple(map(float, mean)), tuple(map(float, scale))
    )
    scores = np.concatenate([SentenceModel(ranked).scores(e.features) for e in usable])
    labels = np.concatenate([e.labels for e in usable])
    slope, intercept = platt(scores, labels)
    return dataclasses.replace(ranked, slope=slope, intercept=intercept)


@dataclass(frozen=True, slots=True)
class Asked:
    """Per question: the evidence abstention reads, whether the quote holds a gold answer, and
    whether any retrieved sentence does."""

    evidence: npt.NDArray[np.float64]
    right: npt.NDArray[np.bool_]
    reachable: npt.NDArray[np.bool_]


def asked(
    examples: Sequence[Example],
    model: SentenceModel,
    config: QuoteConfig,
    evidence: Callable[[list[ScoredSentence]], float],
) -> Asked:
    values, right = [], []
    for example in examples:
        ranked = scored(example, model)
        values.append(evidence(ranked))
        quote = select_quote(ranked, config, example.question.question)
        text = " ".join(q.text for q in quote)
        right.append(bool(quote) and answer_recall(text, example.question.answers) > 0)
    reachable = [bool(e.labels.any()) for e in examples]
    return Asked(np.asarray(values), np.asarray(right), np.asarray(reachable))


def best_probability(ranked: list[ScoredSentence]) -> float:
    return best_probabilities(ranked, 1)[0]


def abstention(
    answerable: Asked,
    removed: Asked,
    unanswerable_share: float,
    max_false: float,
    threshold: float | None = None,
) -> tuple[float, dict[str, Any]]:
    """The threshold on the evidence that answers the most questions right when
    `unanswerable_share` of them have no answer in the corpus (a quote holding the gold answer
    is right; so is abstaining where the answer was removed, or a quote that still holds it),
    abstaining on at most `max_false` of the answerable ones whose answer was retrieved. Given
    `threshold`, only measures it."""
    reachable = answerable.evidence[answerable.reachable]

    def measured(t: float) -> dict[str, float]:
        answered_right = float(np.mean(answerable.right & (answerable.evidence >= t)))
        said_right = float(np.mean((removed.evidence < t) | removed.right))
        return {
            "threshold": round(t, 4),
            "quality": round(
                (1 - unanswerable_share) * answered_right + unanswerable_share * said_right, 4
            ),
            "answer_recall": round(answered_right, 4),
            "false_abstention": round(float(np.mean(reachable < t)), 4),
            "abstention_when_removed": round(float(np.mean(removed.evidence < t)), 4),
            "right_when_removed": round(said_right, 4),
        }

    if threshold is None:
        values = np.unique(np.concatenate([[0.0], answerable.evidence, removed.evidence]))
        options = [measured(float(t)) for t in values]
        allowed = [o for o in options if o["false_abstention"] <= max_false] or options[:1]
        threshold = max(allowed, key=lambda o: o["quality"])["threshold"]
    # What other thresholds would trade: abstention with the answer removed against false
    # abstention, at the thresholds that refuse these shares of the reachable answerable ones.
    levels = (0.03, 0.05, 0.1, 0.15, 0.2, 0.3)
    tradeoff = [measured(float(np.quantile(reachable, q))) for q in levels]
    return threshold, {
        **measured(threshold),
        "tradeoff": tradeoff,
        "unanswerable_share": unanswerable_share,
        "answerable": len(answerable.right),
        "answerable_reachable": len(reachable),
        "removed": len(removed.right),
    }


def fit_abstention(
    train: Sequence[Example],
    removed: Sequence[Example],
    model: SentenceModel,
    config: QuoteConfig,
    l2: float,
) -> AnswerableModel:
    """The answerable model: whether the quote holds a gold answer, from the first pass, learned
    on questions asked as they are and with their gold document left out (threshold 0 here)."""
    rows, labels = [], []
    for example in [*train, *removed]:
        ranked = scored(example, model)
        rows.append(answerable_features(ranked))
        quote = select_quote(ranked, config, example.question.question)
        text = " ".join(q.text for q in quote)
        labels.append(float(bool(quote) and answer_recall(text, example.question.answers) > 0))
    weights, mean, scale = fit_answerable(np.vstack(rows), np.asarray(labels), l2)
    return AnswerableModel(weights, mean, scale, threshold=0.0)


async def squad_train_asked(count: int, top_k: int) -> tuple[list[Example], list[Example]]:
    """SQuAD train's first `count` questions (sentence_reader.py's seeded order), each retrieved
    for as it is and as if its gold document were not in the index."""
    questions = train_questions(count)
    retriever = await asyncio.to_thread(
        retriever_for, shared(SQUAD_TRAIN_DIR / "passages.jsonl.gz")
    )
    try:
        kept = await examples_of(retriever, questions, top_k)
        removed = await examples_of(retriever, questions, top_k, leave_out_gold=True)
    finally:
        retriever.close()
    return kept, removed


async def run(args: argparse.Namespace) -> dict[str, Any]:
    passages = shared(SQUAD_DIR / "passages.jsonl")
    held = args.measure_on
    training, evaluation = part_questions("scorer_training"), part_questions(held)
    retriever = await asyncio.to_thread(retriever_for, passages)
    try:
        train = await examples_of(retriever, training, args.top_k)
        test = await examples_of(retriever, evaluation, args.top_k)
        idf = retriever.index.sentences.idf
    finally:
        retriever.close()
    weights = fit(train, l2=args.l2)
    model = SentenceModel(weights)
    chosen = selection(train, model, args.max_median_words)
    # Each question as if its own gold document were not in the index.
    retriever = await asyncio.to_thread(retriever_for, passages)
    try:
        removed_train = await examples_of(retriever, training, args.top_k, leave_out_gold=True)
        removed_test = await examples_of(retriever, evaluation, args.top_k, leave_out_gold=True)
    finally:
        retriever.close()
    share, most_false = args.unanswerable_share, args.max_false_abstention
    learned_on, removed_on = train, removed_train
    if args.abstention_train:
        learned_on, removed_on = await squad_train_asked(args.abstention_train, args.top_k)
    answerable = fit_abstention(learned_on, removed_on, model, chosen, args.l2)

    def evidence(ranked: list[ScoredSentence]) -> float:
        return answerable.probability(ranked)

    measures: dict[str, dict[str, Any]] = {}
    # The answerable model (what the service reads) beside the best sentence's probability.
    for name, signal in (("answerable", evidence), ("best_probability", best_probability)):
        threshold, on_learned = abstention(
            asked(learned_on, model, chosen, signal),
            asked(removed_on, model, chosen, signal),
            share,
            most_false,
        )
        _, on_train = abstention(
            asked(train, model, chosen, signal),
            asked(removed_train, model, chosen, signal),
            share,
            most_false,
            threshold=threshold,
        )
        _, on_test = abstention(
            asked(test, model, chosen, signal),
            asked(removed_test, model, chosen, signal),
            share,
            most_false,
            threshold=threshold,
        )
        measures[name] = {"threshold": threshold, "training": on_train, held: on_test}
        if args.abstention_train:
            measures[name]["squad_train"] = on_learned
    answerable = dataclasses.replace(answerable, threshold=measures["answerable"]["threshold"])

    def abstains(example: Example) -> bool:
        # Whether the sources answer at all is read on the first pass, reader or not.
        return answerable.probability(scored(example, model)) < answerable.threshold

    first_pass = {
        "quote": quote_metrics(test, lambda e: scored(e, model), chosen, abstains),
        "quote_without_abstention": quote_metrics(test, lambda e: scored(e, model), chosen),
    }
    mix: ReadMix | None = None
    config, reading = chosen, dict[str, Any]()
    rank_train: dict[str, list[ScoredSentence]] | None = None
    rank_test: dict[str, list[ScoredSentence]] | None = None
    if args.reader:
        reader = SentenceReader(ReaderConfig(device="cpu"))
        await asyncio.to_thread(reader.warm_up)
        reads_train = {e.question.question_id: live(reader, e.question.question) for e in train}
        mix, config, tried = fit_mix(train, model, reads_train, args.max_median_words)
        reading = {"mix": mix.to_json(), "tried": tried}
        reads_test = {e.question.question_id: live(reader, e.question.question) for e in test}
        rank_train = reread_all(train, model, mix, reads_train)
        rank_test = reread_all(test, model, mix, reads_test)
        reading[f"read_share_{held}"] = round(
            sum(bool(to_read(scored(e, model), mix)) for e in test) / max(len(test), 1), 4
        )
        # The reader at equal length: answer recall and median words of the quote (without
        # abstention) at each price per word, in the first pass's order and the reader's.
        reading["frontier"] = {
            name: {
                "first_pass": frontier(examples, lambda e: scored(e, model)),
                "reread": frontier(examples, lookup(ranked)),
            }
            for name, examples, ranked in (
                ("scorer_training", train, rank_train),
                (held, test, rank_test),
            )
        }

    def final(ranked: dict[str, list[ScoredSentence]] | None) -> Callable[[Example], Any]:
        return (lambda e: scored(e, model)) if ranked is None else lookup(ranked)

    return {
        "weights": weights,
        "config": config,
        "answerable": answerable,
        "mix": mix,
        "metrics": {
            "training": {
                "questions": len(train),
                "quote": quote_metrics(train, final(rank_train), config, abstains),
            },
            held: {
                "quote": quote_metrics(test, final(rank_test), config, abstains),
                "quote_without_abstention": quote_metrics(test, final(rank_test), config),
                "first_pass": first_pass,
                "naive_overlap": quote_metrics(test, lambda e: naive(e, idf), config),
            },
            "abstention": measures,
            "reader": reading,
        },
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m eval.calibrate.sentence_scorer")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--weights", type=Path, default=WEIGHTS)
    parser.add_argument("--top-k", type=int, default=5)
    parser.add_argument("--l2", type=float, default=1.0)
    parser.add_argument(
        "--unanswerable-share",
        type=float,
        default=0.2,
        help="share of questions whose answer is not in the corpus, for the abstention threshold",
    )
    parser.add_argument("--max-false-abstention", type=float, default=0.10)
    parser.add_argument(
        "--abstention-train",
        type=int,
        default=10_000,
        help="learn abstention and its threshold on SQuAD train's first N questions, each also "
        "asked with its gold passage left out (0: on the scorer-training part)",
    )
    parser.add_argument(
        "--no-reader",
        dest="reader",
        action="store_false",
        help="learn the scorer alone (no sentence reader mix in the weights file)",
    )
    parser.add_argument(
        "--max-median-words", type=float, default=34.0, help="for the quote's selection"
    )
    parser.add_argument(
        "--measure-on",
        choices=("planner_training", "evaluation"),
        default="evaluation",
        help="the part measured after fitting: planner_training while choosing, evaluation once",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    # Before the weights file is written, which would make every run's tree dirty.
    commit = measured_at()
    result = asyncio.run(run(args))
    weights: ScorerWeights = result["weights"]
    config: QuoteConfig = result["config"]
    answerable: AnswerableModel = result["answerable"]
    payload = {
        **weights.to_json(),
        "quote": dataclasses.asdict(config),
        "answerable": answerable.to_json(),
    }
    if result["mix"] is not None:
        payload["reader"] = result["mix"].to_json()
    args.weights.write_text(json.dumps(payload, indent=1) + "\n", encoding="utf-8")
    write_result(
        args.out,
        "calibrate-sentence-scorer",
        {
            "top_k": args.top_k,
            "l2": args.l2,
            "split": "eval/splits/squad.json",
            "reader": args.reader,
            "measured_on": args.measure_on,
            "abstention_train": args.abstention_train,
        },
        {"scorer_training": "articles of eval/splits/squad.json", "weights": str(args.weights)},
        {**result["metrics"], "weights": dict(zip(weights.names, weights.weights, strict=True))},
        commit=commit,
    )
    print(json.dumps(result["metrics"], indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
