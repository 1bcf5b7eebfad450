"""The sentence reader learned on SQuAD train against the one it replaces, side by side in one
run on the development sets, with the learning curve of the training runs.

    python docs/benchmarks/reader_training.py --work /tmp/reader-bench \
        --before 769a862 --runs var/reader/q1k var/reader/q4k var/reader/q16k \
        --dev var/reader/dev.jsonl.gz --out docs/benchmarks/reader-training.json

The learning curve: each run's (`python -m eval.calibrate.sentence_reader train`) training
questions and seconds, and how often the answering sentence comes first among the scorer's best
four on the split's planner-training part, by the scorer, the reader alone and the mix's sums.
The answers: the development sets of `sentence_pooling.py` (the manual's 48 development
questions over 92 of its pages, a seeded sample of SQuAD's planner-training part), answered in
quote mode (`answer-eval answers`, SGLang the repository's fake: a quote needs no model) three
ways over the same indexes: the shipped reader and scorer; the reader and scorer of `--before`
(from git, through `ANSWER_CALIBRATION_DIR`); the shipped scorer with the reader off. Never an
evaluation part. `--dev` (the split's example file): the shipped reader under torch float32 and
ONNX Runtime float32 and int8 on the planner-training questions' best four, its first and the
time of a read; the span head under torch and ONNX Runtime int8 on the answering sentences.
Lives here, not in eval/bench/, because eval/ is at its line limit.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import time
from pathlib import Path
from typing import Any

import numpy as np
from sentence_pooling import answer_arms, write_result

from retrieval.embedder import EmbedderConfig, SentenceTransformerEmbedder


def _calibration(rev: str, folder: Path) -> Path:
    """The reader adapter and scorer weights of commit `rev`, named as the calibration folder
    names them."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, path in (
        ("sentence-reader.npz", "retrieval/sentences/reader.npz"),
        ("sentence-scorer.json", "retrieval/sentences/scorer.json"),
    ):
        blob = subprocess.run(
            ["git", "show", f"{rev}:{path}"], capture_output=True, check=True
        ).stdout
        (folder / name).write_bytes(blob)
    return folder


def _curve(runs: list[Path]) -> list[dict[str, Any]]:
    out = []
    for run in runs:
        result = json.loads((run / "results.json").read_text())
        out.append(
            {
                "run": run.name,
                "train_questions": result["train_questions"],
                "train_articles": result["train_articles"],
                "train_seconds": result["train_seconds"],
                "config": result["config"],
                "planner_training_first_of_4": result["planner_training"]["depth_4"],
                "scorer_training_first_of_4": result["scorer_training"]["depth_4"],
            }
        )
    return out


def _runtimes(dev: Path) -> dict[str, Any]:
    """The shipped reader under each runtime on the planner-training questions' best four
    candidates: how often its first (alone, and in the shipped mix) answers, and the time of
    one read of four (median, p90)."""
    from eval.calibrate.sentence_reader import first_recall, read_groups
    from retrieval.sentences.reader import ReaderConfig, ReadMix, SentenceReader

    mix = ReadMix.read()
    assert mix is not None
    groups = [g for g in read_groups(dev, depth=4) if g.part == "planner_training" and g.texts]
    out: dict[str, Any] = {"questions": len(groups), "mix_weight": mix.weight}
    for runtime, dtype in (("torch", "float32"), ("onnx", "float32"), ("onnx", "int8")):
        reader = SentenceReader(ReaderConfig(device="cpu", runtime=runtime, dtype=dtype))
        reader.warm_up()
        scores, ms = {}, []
        for g in groups:
            started = time.perf_counter()
            values = reader.scores(g.question, list(zip(g.texts, g.titles, strict=True)))
            ms.append((time.perf_counter() - started) * 1000)
            scores[g.question_id] = dict(zip(g.texts, values.tolist(), strict=True))
        out[f"{runtime} {dtype}"] = {
            "first_of_4_reader": round(first_recall(groups, scores, math.inf, 4), 4),
            "first_of_4_mix": round(first_recall(groups, scores, mix.weight, 4), 4),
            "read_of_4_ms_p50": round(float(np.percentile(ms, 50)), 2),
            "read_of_4_ms_p90": round(float(np.percentile(ms, 90)), 2),
        }
        print(runtime, dtype, out[f"{runtime} {dtype}"], flush=True)
    return out


def _span_runtimes(dev: Path) -> dict[str, Any]:
    """The span head under each runtime on the planner-training questions' first answering
    sentence among the scorer's best four: SQuAD EM and F1 of its best span (threshold or
    not) and the time of one call (median)."""
    from eval.calibrate.sentence_examples import part_questions
    from eval.calibrate.sentence_reader import read_groups
    from retrieval.sentences.span import SpanConfig, SpanReader
    from retrieval.sentences.span_train import f1, normalize_answer

    answers = {q.question_id: q.answers for q in part_questions("planner_training")}
    asked = [
        (g.question, g.texts[int(np.argmax(g.labels > 0))], answers[g.question_id])
        for g in read_groups(dev, depth=4)
        if g.part == "planner_training" and g.labels.any()
    ]
    out: dict[str, Any] = {"sentences": len(asked)}
    for runtime in ("torch", "onnx"):
        head = SpanReader(SpanConfig(device="cpu", runtime=runtime))
        head.warm_up()
        ems, f1s, ms = [], [], []
        for question, sentence, golds in asked:
            started = time.perf_counter()
            (found,) = head.spans(question, [sentence])
            ms.append((time.perf_counter() - started) * 1000)
            text = found.text if found is not None else ""
            ems.append(max(normalize_answer(text) == normalize_answer(g) for g in golds))
            f1s.append(max(f1(text, g) for g in golds))
        out[runtime] = {
            "em": round(float(np.mean(ems)), 4),
            "f1": round(float(np.mean(f1s)), 4),
            "ms_p50": round(float(np.percentile(ms, 50)), 2),
        }
        print("span", runtime, out[runtime], flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--before", required=True, help="the commit whose reader is replaced")
    parser.add_argument("--runs", type=Path, nargs="*", default=[])
    parser.add_argument("--squad-sample", type=int, default=300)
    parser.add_argument("--dev", type=Path, help="the split's reader examples (runtimes)")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    before = _calibration(args.before, args.work / "before")
    embedder = SentenceTransformerEmbedder(EmbedderConfig())
    embedder.warm_up()
    results: dict[str, Any] = {"learning_curve": _curve(args.runs)}
    if args.dev:
        results["runtimes"] = _runtimes(args.dev)
        results["span_runtimes"] = _span_runtimes(args.dev)
    arms = {
        "shipped": ({}, []),
        f"before ({args.before})": ({"ANSWER_CALIBRATION_DIR": str(before)}, []),
        "reader off": ({}, ["--experiment", "sentence_reader=false"]),
    }
    results |= answer_arms(args.work, args.squad_sample, embedder, arms)
    command = f"python docs/benchmarks/reader_training.py --work DIR --before {args.before} "
    command += f"--runs {' '.join(str(r) for r in args.runs)} --squad-sample {args.squad_sample}"
    command += f" --dev {args.dev}" if args.dev else ""
    write_result(args.out, command, args.squad_sample, results)


if __name__ == "__main__":
    main()
