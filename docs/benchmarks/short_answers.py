"""The short answer against the whole quote, on SQuAD questions of a development part of the
committed split (eval/splits/squad.json; its evaluation part is refused).

    python docs/benchmarks/short_answers.py --index ~/.cache/answer-service/indexes/eval-8b3a5f74f4634d2b \
        --part planner_training --sample 400 --out docs/benchmarks/short-answers.json \
        [--training-report var/span/run/report.json]

The service's pipeline in-process, built from its default settings on the index of
squad-v1.1-open's passages (what `answer-eval` builds), answer cache off; each question asks
`answer_mode: quote` (no SGLang needed). Per question: the quote (the answer's text), the
short answer the service sent (`short_answer` event; none where the head was not sure), and
the head's best span of the quote's first sentence whatever its score. SQuAD EM and F1 (the
official normalisation, the best over the gold answers) of

- `quote`: the whole quote, what a client showed before;
- `short`: the short answer where one was sent, else nothing (counts 0);
- `shown`: the short answer where one was sent, else the quote;
- `best_span`: the head's best span, never held back;

over all questions and over those whose quote holds a gold answer. The cost is the span head
alone, timed on each question's first quoted sentence after the run (warm, one at a time).
Lives here, not in eval/bench/, because eval/ is at its 7,000-line limit.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import random
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

from answer_service.pipeline.events import AnswerRequest, DoneEvent, ShortAnswerEvent, TokenEvent
from answer_service.runtime.components import Components
from answer_service.runtime.settings import Settings
from budget import Deadline
from retrieval.sentences.span import SpanReader
from retrieval.sentences.span_train import f1, normalize_answer

QUESTIONS = Path("/work/shared/data/squad-v1.1-open/questions.jsonl")
SPLIT = Path("eval/splits/squad.json")
TOKENIZER = Path.home() / ".cache/answer-service/models/smollm2-135m-instruct-bf16"
BUDGET_MS = 3000


def _questions(part: str, sample: int, seed: int) -> list[dict[str, Any]]:
    if part == "evaluation":
        raise SystemExit("the evaluation part is not for choosing or reporting this")
    articles = set(json.loads(SPLIT.read_text())["parts"][part])
    rows = [json.loads(line) for line in QUESTIONS.read_text().splitlines()]
    mine = [r for r in rows if r["gold_passage_id"].rsplit("-", 1)[0] in articles]
    return random.Random(seed).sample(mine, min(sample, len(mine)))


def _best(prediction: str, golds: list[str]) -> tuple[float, float]:
    """SQuAD's EM and F1 of `prediction`: the best over the gold answers."""
    em = max(float(normalize_answer(prediction) == normalize_answer(g)) for g in golds)
    return em, max(f1(prediction, g) for g in golds)


async def _answer(components: Components, query: str) -> dict[str, Any]:
    pipeline = components.pipeline
    assert pipeline is not None
    request = AnswerRequest(query, BUDGET_MS, 5, answer_mode="quote")
    prepared = await pipeline.prepare(request, Deadline.after_ms(BUDGET_MS))
    quote, short, form, first_sentence = "", None, "", ""
    try:
        async for event in pipeline.events(prepared):
            match event:
                case ShortAnswerEvent(found):
                    short = found
                case TokenEvent(text):
                    quote += text
                case DoneEvent(stats, done_short):
                    form = stats.form
                    assert done_short == short
        first_sentence = prepared.quote[0].text if prepared.quote else ""
    finally:
        prepared.close_nowait()
    if short is not None:
        assert quote[short.start : short.end] == short.text
    return {
        "form": form,
        "quote": quote,
        "first_sentence": first_sentence,
        "short": None if short is None else short.text,
    }


def _score(question: dict[str, Any], answered: dict[str, Any], best: str) -> dict[str, Any]:
    golds = question["answers"]
    quote = answered["quote"] if answered["form"] == "quote" else ""
    short = answered["short"]
    out: dict[str, Any] = {
        "_id": question["_id"],
        "form": answered["form"],
        "holds": any(normalize_answer(g) in normalize_answer(quote) for g in golds) and bool(quote),
        "short": short,
        "best_span": best,
        "quote_words": len(quote.split()),
    }
    for name, text in (
        ("quote", quote),
        ("short", short or ""),
        ("shown", short if short is not None else quote),
        ("best_span", best),
    ):
        out[f"em_{name}"], out[f"f1_{name}"] = _best(text, golds)
    return out


def _means(records: list[dict[str, Any]]) -> dict[str, Any]:
    if not records:
        return {"questions": 0}
    out: dict[str, Any] = {"questions": len(records)}
    for name in ("quote", "short", "shown", "best_span"):
        for metric in ("em", "f1"):
            out[f"{metric}_{name}"] = round(
                statistics.mean(r[f"{metric}_{name}"] for r in records), 4
            )
    given = [r for r in records if r["short"] is not None]
    out["short_given"] = round(len(given) / len(records), 4)
    out["f1_of_given"] = round(statistics.mean(r["f1_short"] for r in given), 4) if given else None
    out["median_quote_words"] = statistics.median(r["quote_words"] for r in records)
    out["median_short_words"] = (
        statistics.median(len(r["short"].split()) for r in given) if given else None
    )
    return out


def _cost(reader: SpanReader, answered: list[dict[str, Any]]) -> dict[str, Any]:
    times_ms = []
    for row in answered:
        if not row["first_sentence"]:
            continue
        started_s = time.perf_counter()
        reader.spans(row["question"], [row["first_sentence"]])
        times_ms.append((time.perf_counter() - started_s) * 1000.0)
    times_ms.sort()
    return {
        "sentences": len(times_ms),
        "median_ms": round(statistics.median(times_ms), 2),
        "p90_ms": round(times_ms[int(0.9 * (len(times_ms) - 1))], 2),
    }


async def _run(index: Path, questions: list[dict[str, Any]]) -> dict[str, Any]:
    settings = Settings(index_dir=index, tokenizer=str(TOKENIZER), answer_cache_ttl_s=0)
    components = Components.create(settings)
    components.start_warm_up()
    await components.wait_ready()
    reader = components.span_reader
    if components.pipeline is None or reader is None:
        raise SystemExit(f"warm-up failed or no span head: {components.warm_up_error}")
    try:
        answered = []
        for question in questions:
            row = await _answer(components, question["question"])
            answered.append({**row, "question": question["question"]})
        best = [
            (reader.spans(a["question"], [a["first_sentence"]])[0] if a["first_sentence"] else None)
            for a in answered
        ]
        cost = _cost(reader, answered)
    finally:
        await components.aclose()
    records = [
        _score(q, a, b.text if b is not None else "")
        for q, a, b in zip(questions, answered, best, strict=True)
    ]
    return {
        "threshold": reader.meta.threshold,
        "summary": {
            "all": _means(records),
            "quote_holds_answer": _means([r for r in records if r["holds"]]),
        },
        "cost": cost,
        "records": records,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--index", type=Path, required=True)
    parser.add_argument("--part", default="planner_training")
    parser.add_argument("--sample", type=int, default=400)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True)
    # The trainer's report of the shipped head (its run folder's report.json), kept beside.
    parser.add_argument("--training-report", type=Path)
    args = parser.parse_args()
    questions = _questions(args.part, args.sample, args.seed)
    result = asyncio.run(_run(args.index, questions))
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    changed = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True
    ).stdout
    commit = commit.strip() + ("-dirty" if changed.strip() else "")
    out = {
        "benchmark": "short-answers",
        "commit": commit,
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime()),
        "machine": platform.machine(),
        "index": str(args.index),
        "config": {"part": args.part, "sample": args.sample, "seed": args.seed},
        "answer_mode": "quote",
        "ttft_budget_ms": BUDGET_MS,
        "training": (
            json.loads(args.training_report.read_text()) if args.training_report else None
        ),
        **result,
    }
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps({"summary": out["summary"], "cost": out["cost"]}, indent=1))


if __name__ == "__main__":
    main()
