"""Measure answer quality per answer form and context size for the served model: the curves
`auto` chooses by (answer_service/pipeline/form_curves.json ships them for SmolLM2-135M).

    python -m eval.calibrate.form_curves --sglang-url http://127.0.0.1:30000 \\
        [--sample 60] [--out eval/results/form-curves.json] [--curves FILE]

Reads ../shared/data/squad-v1.1-open: a seeded sample of the planner-training part of the
committed split (eval/splits/squad.json), asked in-process one at a time with a roomy budget,
the planner off (so each configuration is exactly what it says) and no abstention (the curves
compare forms on the same questions; abstention is decided before the form). Quality: the share
of answers holding a gold answer string. Configurations: quote; focused with 1..3 excerpts;
passages with 1..5 passages.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from answer_service.runtime.settings import Settings
from budget.forms import AnswerForm
from eval.commands.answers import Ask, in_process_answering
from eval.commands.main import index_of
from eval.lib.data import SQUAD_DIR, shared, squad_part_of
from eval.lib.metrics import answer_recall, strip_citations
from eval.lib.questions import Question, read_questions
from eval.lib.results import measured_at, write_result
from retrieval.embedder import EmbedderConfig, SentenceTransformerEmbedder

CURVES = Path(__file__).resolve().parents[2] / "answer_service" / "pipeline" / "form_curves.json"
SIZES: dict[AnswerForm, tuple[int, ...]] = {
    "quote": (1,),
    "focused": (1, 2, 3),
    "passages": (1, 2, 3, 4, 5),
}


def sample(count: int, seed: int) -> list[Question]:
    questions = [
        q
        for q in read_questions(shared(SQUAD_DIR / "questions.jsonl"))
        if q.gold_passage_id and squad_part_of(q.gold_passage_id) == "planner_training"
    ]
    return random.Random(seed).sample(questions, min(count, len(questions)))


async def quality(
    settings: Settings, questions: Sequence[Question], form: AnswerForm, size: int
) -> dict[str, Any]:
    top_k = 5 if form == "quote" else size
    recalls, served = [], 0
    async with in_process_answering(settings) as source:
        for question in questions:
            record = await source.answer(question, Ask(30_000, top_k, form))
            served += record.form == form
            recalls.append(answer_recall(strip_citations(record.answer), question.answers))
    return {
        "form": form,
        "size": size,
        "answer_recall": round(sum(recalls) / len(recalls), 4),
        "answered_in_form": served,
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    questions = sample(args.sample, args.seed)
    embedder = SentenceTransformerEmbedder(EmbedderConfig())
    index = await asyncio.to_thread(index_of, shared(SQUAD_DIR / "passages.jsonl"), None, embedder)
    settings = Settings(
        index_dir=index,
        sglang_url=args.sglang_url,
        planner="off",
        abstain_below=0.0,
        answer_cache_ttl_s=0,
        reranker_model=None,
    )
    rows = []
    for form, sizes in SIZES.items():
        for size in sizes:
            rows.append(await quality(settings, questions, form, size))
            logging.getLogger(__name__).info("measured %s", rows[-1])
    curves = {
        form: [
            next(r["answer_recall"] for r in rows if r["form"] == form and r["size"] == n)
            for n in sizes
        ]
        for form, sizes in SIZES.items()
    }
    return {"curves": curves, "rows": rows, "questions": len(questions)}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m eval.calibrate.form_curves")
    parser.add_argument("--sglang-url", default="http://127.0.0.1:30000")
    parser.add_argument("--sample", type=int, default=60)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("eval/results/form-curves.json"))
    parser.add_argument("--curves", type=Path, default=CURVES, help="the file the service loads")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    result = asyncio.run(run(args))
    curves = {
        "model": "the SGLang server at --sglang-url (SmolLM2-135M-Instruct for the shipped file)",
        "measured_by": "python -m eval.calibrate.form_curves",
        "commit": measured_at(),
        "questions": result["questions"],
        "curves": result["curves"],
    }
    args.curves.write_text(json.dumps(curves, indent=1) + "\n", encoding="utf-8")
    write_result(
        args.out,
        "calibrate-form-curves",
        {"sample": args.sample, "seed": args.seed, "sglang_url": args.sglang_url},
        {"part": "planner_training of eval/splits/squad.json", "questions": result["questions"]},
        {"curves": result["curves"], "configurations": result["rows"]},
    )
    print(json.dumps(result["curves"], indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
