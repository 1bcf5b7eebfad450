"""Learn the per-query form model (budget/query_quality.py) and measure what choosing per query
buys over the best single form, from `answer-eval answers` runs of the same questions in each
configuration.

    python -m eval.calibrate.form_choice --out eval/results/form-choice.json \\
        [--model answer_service/pipeline/form_choice.json] \\
        --train quote=T1.json --train focused-2=T2.json --train passages-1=T3.json \\
        --evaluate quote=E1.json --evaluate focused-2=E2.json --evaluate passages-1=E3.json

The `--train` runs ask planner-training questions, the `--evaluate` runs evaluation questions
(`--part` of the committed split), each configuration named FORM-SIZE (`quote` alone has no
size). For every question the first pass is redone as the service does it (hybrid retrieval,
top 5, the shipped sentence scorer and answerable model), which gives its `FormRequest`; a
configuration answered it right when its answer holds a gold answer string. Questions the
service abstained on are left out: abstention is decided before the form, so the model is only
asked about questions that get an answer. One L2 logistic model per configuration is fitted on
the training runs; on the evaluation runs it is measured by the share right when each question
takes the configuration of the highest predicted chance, against the best single configuration
and the per-question oracle, with a paired-bootstrap interval over questions. The model file
the service loads is written to `--model`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import random
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from answer_service.pipeline.forms import form_request
from budget import Deadline
from budget.forms import FORMS, AnswerForm, FormRequest
from budget.query_quality import FEATURES, ConfigurationModel, feature_row
from eval.commands.main import index_of
from eval.lib.metrics import answer_recall, strip_citations
from eval.lib.paths import SQUAD_DIR, shared
from eval.lib.questions import Question, read_questions
from eval.lib.records import with_records
from eval.lib.results import write_result
from retrieval.embedder import EmbedderConfig, SentenceTransformerEmbedder
from retrieval.retriever import Retriever
from retrieval.search.base import SearchRequest
from retrieval.sentences.answerable import AnswerableModel, fit_answerable
from retrieval.stages import SentenceRequest

logger = logging.getLogger(__name__)

MODEL = Path(__file__).resolve().parents[2] / "answer_service" / "pipeline" / "form_choice.json"
TOP_K = 5

Runs = dict[str, dict[str, dict[str, Any]]]
"""Configuration name: question id: its record."""


def configuration(name: str) -> tuple[AnswerForm, int]:
    form, _, size = name.partition("-")
    for known in FORMS:
        if form == known and (known == "quote" or size.isdigit()):
            return known, int(size) if size else 1
    raise ValueError(f"{name!r}: expected quote or FORM-SIZE (focused-2, passages-1, ...)")


def read_runs(specs: Sequence[str]) -> Runs:
    runs: Runs = {}
    for spec in specs:
        name, _, path = spec.partition("=")
        configuration(name)
        result = json.loads(Path(path).read_text(encoding="utf-8"))
        records = with_records(result, Path(path).parent)["requests"]
        runs[name] = {r["question_id"]: r for r in records}
    return runs


def labelled(
    runs: Runs, answers: Mapping[str, Sequence[str]]
) -> tuple[list[str], dict[str, list[bool]]]:
    """The questions every run answered without abstaining, and which each run got right."""
    common = sorted(
        q
        for q in set.intersection(*(set(r) for r in runs.values()))
        if all(r[q]["status"] == "ok" and r[q].get("form") != "abstain" for r in runs.values())
    )
    right = {
        name: [
            answer_recall(strip_citations(records[q]["answer"] or ""), answers[q]) > 0
            for q in common
        ]
        for name, records in runs.items()
    }
    return common, right


async def form_requests(
    retriever: Retriever, answerable: AnswerableModel, questions: Sequence[Question]
) -> dict[str, FormRequest]:
    """Each question's first pass as the service's pipeline makes it."""
    out = {}
    search = retriever.search_stage("hybrid")
    for question in questions:
        deadline = Deadline.after_ms(60_000)
        vector = (await retriever.embed.run(question.question, deadline)).value
        hits = (await search.run(SearchRequest(question.question, vector, TOP_K), deadline)).value
        scored = (
            await retriever.sentences.run(
                SentenceRequest(question.question, vector, hits[:TOP_K]), deadline
            )
        ).value
        out[question.question_id] = form_request(
            question.question, scored, TOP_K, answerable.probability(scored)
        )
    return out


def fit(
    names: Sequence[str],
    right: Mapping[str, Sequence[bool]],
    rows: npt.NDArray[np.float64],
    l2: float,
) -> list[ConfigurationModel]:
    models = []
    for name in names:
        form, size = configuration(name)
        weights, mean, scale = fit_answerable(rows, np.asarray(right[name], dtype=float), l2)
        models.append(ConfigurationModel(form, size, weights, mean, scale))
    return models


def evaluate(
    models: Sequence[ConfigurationModel],
    names: Sequence[str],
    right: Mapping[str, Sequence[bool]],
    rows: npt.NDArray[np.float64],
    resamples: int = 2000,
) -> dict[str, Any]:
    """The per-query choice's share right against the best single configuration and the
    oracle, on questions answered in every configuration."""
    n = len(rows)
    predicted = np.asarray([[m.probability(row) for m in models] for row in rows])
    chosen = predicted.argmax(axis=1)
    got = np.asarray([right[names[c]][i] for i, c in enumerate(chosen)], dtype=float)
    share = {name: float(np.mean(right[name])) for name in names}
    best = max(names, key=lambda name: share[name])
    oracle = np.asarray([any(right[name][i] for name in names) for i in range(n)], dtype=float)
    gain = got - np.asarray(right[best], dtype=float)
    rng = random.Random(0)
    draws = sorted(
        float(np.mean([gain[rng.randrange(n)] for _ in range(n)])) for _ in range(resamples)
    )
    return {
        "questions": n,
        "share_right": {name: round(share[name], 4) for name in names},
        "best_single": best,
        "per_query": round(float(got.mean()), 4),
        "gain_over_best": round(float(gain.mean()), 4),
        "gain_ci95": [
            round(draws[int(0.025 * resamples)], 4),
            round(draws[int(0.975 * resamples) - 1], 4),
        ],
        "oracle": round(float(oracle.mean()), 4),
        "chosen": {name: int(np.sum(chosen == i)) for i, name in enumerate(names)},
        # How well each model's chance matches what happened (mean predicted against share).
        "mean_predicted": {
            name: round(float(predicted[:, i].mean()), 4) for i, name in enumerate(names)
        },
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    train_runs, test_runs = read_runs(args.train), read_runs(args.evaluate)
    names = list(train_runs)
    if set(test_runs) != set(names):
        raise SystemExit("--train and --evaluate must name the same configurations")
    questions = {q.question_id: q for q in read_questions(shared(SQUAD_DIR / "questions.jsonl"))}
    answers = {q: question.answers for q, question in questions.items()}
    train_ids, train_right = labelled(train_runs, answers)
    test_ids, test_right = labelled(test_runs, answers)
    embedder = SentenceTransformerEmbedder(EmbedderConfig())
    index = await asyncio.to_thread(index_of, shared(SQUAD_DIR / "passages.jsonl"), None, embedder)
    retriever = await asyncio.to_thread(Retriever.open, index, embedder)
    answerable = AnswerableModel.read()
    assert answerable is not None
    try:
        requests = await form_requests(
            retriever, answerable, [questions[q] for q in [*train_ids, *test_ids]]
        )
    finally:
        retriever.close()
    train_rows = np.asarray([feature_row(requests[q]) for q in train_ids])
    test_rows = np.asarray([feature_row(requests[q]) for q in test_ids])
    models = fit(names, train_right, train_rows, args.l2)
    return {
        "models": models,
        "metrics": {
            "training": evaluate(models, names, train_right, train_rows),
            "evaluation": evaluate(models, names, test_right, test_rows),
        },
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m eval.calibrate.form_choice")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--model", type=Path, default=MODEL)
    parser.add_argument("--train", action="append", required=True, help="NAME=answers.json")
    parser.add_argument("--evaluate", action="append", required=True, help="NAME=answers.json")
    parser.add_argument("--l2", type=float, default=3.0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    result = asyncio.run(run(args))
    models: list[ConfigurationModel] = result["models"]
    payload = {
        "features": list(FEATURES),
        "measured_by": "python -m eval.calibrate.form_choice",
        "configurations": [
            {
                "form": m.form,
                "size": m.size,
                "weights": list(m.weights),
                "mean": list(m.mean),
                "scale": list(m.scale),
            }
            for m in models
        ],
    }
    args.model.write_text(json.dumps(payload, indent=1) + "\n", encoding="utf-8")
    write_result(
        args.out,
        "calibrate-form-choice",
        {"train": args.train, "evaluate": args.evaluate, "l2": args.l2},
        {"train": "planner_training", "evaluate": "evaluation", "split": "eval/splits/squad.json"},
        result["metrics"],
    )
    print(json.dumps(result["metrics"], indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
