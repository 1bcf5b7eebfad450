"""Generated answers under variants of the service's settings, on the same planner-training
questions: what chose the prompt's worked example, the sampling penalties (none), the
unsupported-sentence policy (mark) and the focused context's size.

    python -m eval.calibrate.generation_variants --out eval/results/generation-variants.json \\
        --variant NAME:FORM:SIZE[:KEY=VALUE,...] ... [--sample 100] [--seed 1]

Reads ../shared/data/squad-v1.1-open: a seeded sample of the planner-training part of the
committed split (eval/splits/squad.json, the sampler of eval.calibrate.form_curves), asked
in-process one at a time with a roomy budget, the planner off (each variant is exactly its
form and size), no abstention and no answer cache. A variant's KEY=VALUE pairs are settings
(`answer_service/runtime/settings.py`, e.g. `unsupported=drop`) or the knobs the service holds
fixed (`Experiment` in `answer_service/runtime/configs.py`, e.g. `prompt_example=false`,
`frequency_penalty=0.3`, `copy_bias={"focused": 4}`). Per variant: `answer-eval`'s answer metrics;
per question: the answer and how generation ended, so variants can be compared question by
question.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter

from answer_service.runtime.configs import Experiment
from answer_service.runtime.settings import Settings
from eval.calibrate.form_curves import sample
from eval.commands.answers import Ask, in_process_answering, score_answers
from eval.commands.main import index_of
from eval.lib.paths import SQUAD_DIR, shared
from eval.lib.results import write_result
from retrieval.embedder import EmbedderConfig, SentenceTransformerEmbedder

KEPT = (
    "answer_recall",
    "f1",
    "repetition_rate",
    "repetition_stopped_rate",
    "unsupported_sentence_rate",
    "citation_precision",
    "words",
    "ttft_ms_model",
)


def parse_variant(spec: str) -> tuple[str, str, int, dict[str, Any]]:
    """NAME:FORM:SIZE[:KEY=VALUE,...]; a VALUE that opens with `{` is JSON (a per-form
    setting: `copy_bias={"passages": 4}`, one key, as a comma ends the pair)."""
    name, form, size, *rest = spec.split(":", 3)
    pairs = (pair.split("=", 1) for pair in rest[0].split(",")) if rest else ()
    settings = {key: json.loads(value) if value.startswith("{") else value for key, value in pairs}
    return name, form, int(size), settings


def split_overrides(overrides: dict[str, Any]) -> tuple[dict[str, Any], Experiment]:
    """A variant's KEY=VALUEs: the service's settings, and the experiment's knobs (the ones
    the service holds fixed, `answer_service.runtime.configs.Experiment`), read as pydantic
    reads a setting (`false`, `0.3`)."""
    knobs = {key: overrides[key] for key in overrides if key in Experiment.__dataclass_fields__}
    settings = {key: value for key, value in overrides.items() if key not in knobs}
    return settings, TypeAdapter(Experiment).validate_python(knobs)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    questions = sample(args.sample, args.seed)
    embedder = SentenceTransformerEmbedder(EmbedderConfig())
    index = await asyncio.to_thread(index_of, shared(SQUAD_DIR / "passages.jsonl"), None, embedder)
    variants: dict[str, Any] = {}
    for spec in args.variant:
        name, form, size, overrides = parse_variant(spec)
        setting_overrides, experiment = split_overrides(overrides)
        settings = Settings(
            index_dir=index,
            sglang_url=args.sglang_url,
            planner="off",
            abstain_below=0.0,
            answer_cache_ttl_s=0,
            reranker_model=None,
            **setting_overrides,
        )
        records = []
        async with in_process_answering(settings, experiment) as source:
            for question in questions:
                records.append(await source.answer(question, Ask(60_000, size, form)))  # type: ignore[arg-type]
        metrics = score_answers(questions, records)
        variants[name] = {
            "form": form,
            "size": size,
            "settings": overrides,
            **{key: metrics[key] for key in KEPT},
            "answers": [
                {"question_id": q.question_id, "answer": r.answer, "finish_reason": r.finish_reason}
                for q, r in zip(questions, records, strict=True)
            ],
        }
        logging.getLogger(__name__).info("variant %s recall %s", name, metrics["answer_recall"])
    return {"questions": len(questions), "variants": variants}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m eval.calibrate.generation_variants")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--variant", action="append", required=True)
    parser.add_argument("--sglang-url", default="http://127.0.0.1:30000")
    parser.add_argument("--sample", type=int, default=100)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    result = asyncio.run(run(args))
    write_result(
        args.out,
        "calibrate-generation-variants",
        {"variants": args.variant, "sample": args.sample, "seed": args.seed},
        {"part": "planner_training of eval/splits/squad.json"},
        result,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
