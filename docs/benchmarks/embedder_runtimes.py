"""The embedder's runtimes on the CPU side by side in one run: torch at float32 (the service's
CPU path before ONNX Runtime), ONNX Runtime at float32 and at int8 (the default now).

    python docs/benchmarks/embedder_runtimes.py --work /tmp/runtimes \
        --out docs/benchmarks/embedder-runtimes.json [--squad-sample 300]

1. The build's model time: the passage pass with its pooled sentence vectors (`embed_passages`,
   as `index build` calls it) over the 92 manual pages `sentence_pooling.py` uses, the three
   runtimes alternated by call (256 passages each) so they meet the same load, as process CPU
   seconds and wall seconds; and each runtime's passage and sentence vectors against torch's
   (cosine).
2. A question's embedding, one at a time as the service embeds it: 200 questions from the
   manual's and SQuAD's development sets, the runtimes alternated per question; median ms.
3. The quotes, over indexes built by torch float32 and by ONNX Runtime int8, each answered with
   its own runtime (`answer-eval answers --answer-mode quote` with SGLang the repository's fake:
   a quote needs no model), on the same development sets as sentence_pooling.py: the manual's
   48 development questions and a seeded sample of SQuAD's planner-training part. ONNX Runtime
   at float32 gives torch's vectors (part 1 measures how near), so it is not answered apart.
   The eval command builds its embedder from settings; the run picks the runtime by patching
   the one function that makes its config (`_RUNTIME_PATCH`), as no setting chooses it.
4. `--full-build`, alone: the manual's whole build as the demo makes it (every page of the HTML
   folder, `build_index` with a fresh index), with ONNX Runtime int8 and then with torch float32,
   wall and CPU seconds and the load beside each; added to the JSON `--out` names.
5. `--scifact`, alone: SciFact's train claims of the split's scorer- and planner-training parts
   (eval/splits/scifact.json; never its evaluation part), retrieval over the whole train corpus
   built and queried with each of torch float32 and ONNX Runtime int8 (`answer-eval retrieval`):
   nDCG@10 and recall@100 of dense, lexical and hybrid; added to the JSON `--out` names.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from sentence_pooling import (
    QUESTIONS,
    _timed,
    answered,
    commit_now,
    development_sets,
    write_result,
)

from answer_service.cli.manual import SOURCE_URL
from eval.lib.data import SCIFACT_DIR, SQUAD_DIR
from retrieval.embedder import EmbedderConfig, SentenceTransformerEmbedder
from retrieval.index.builder import build_index
from retrieval.index.faiss_index import read_passages
from retrieval.index.generations import served_generation
from retrieval.ingest.source import IngestOptions, open_source
from retrieval.sentences.store import embed_passages
from tests.fakes.fake_sglang import FakeSGLangState, create_fake_sglang
from tests.support import serve_in_thread

ARMS = {
    "torch-float32": EmbedderConfig(device="cpu", runtime="torch", dtype="float32"),
    "onnx-float32": EmbedderConfig(device="cpu", runtime="onnx", dtype="float32"),
    "onnx-int8": EmbedderConfig(device="cpu", runtime="onnx", dtype="int8"),
}
ANSWERED = ("torch-float32", "onnx-int8")
_SMOLLM2 = Path.home() / ".cache/answer-service/models/smollm2-135m-instruct-bf16"
_RUNTIME_PATCH = """
import dataclasses, functools, os, sys
import answer_service.runtime.components as components
import eval.commands.main as commands
made = components.embedder_config
runtime, dtype = os.environ["BENCH_EMBEDDER"].split("-")
components.embedder_config = lambda settings, device: dataclasses.replace(
    made(settings, device=device), runtime=runtime, dtype=dtype)
commands.EmbedderConfig = functools.partial(commands.EmbedderConfig, runtime=runtime, dtype=dtype)
from eval.commands.main import main
sys.argv[0] = "answer-eval"
sys.exit(main())
"""


def _passes(index: Path, embedders: dict[str, SentenceTransformerEmbedder]) -> dict[str, Any]:
    passages = list(read_passages(served_generation(index) / "passages.jsonl"))
    totals = {arm: {"cpu_s": 0.0, "wall_s": 0.0} for arm in embedders}
    made: dict[str, list[Any]] = {arm: [] for arm in embedders}
    for at in range(0, len(passages), 256):
        batch = passages[at : at + 256]
        for arm, embedder in embedders.items():
            timing = _timed(lambda b=batch, e=embedder, m=made[arm]: m.append(embed_passages(b, e)))
            for key, value in timing.items():
                totals[arm][key] += value
    base = made["torch-float32"]
    report: dict[str, Any] = {"passages": len(passages)}
    for arm in embedders:
        passage_cos = np.concatenate(
            [(a.vectors * b.vectors).sum(axis=1) for a, b in zip(made[arm], base, strict=True)]
        )
        sentence_cos = []
        for a, b in zip(made[arm], base, strict=True):
            kept = np.abs(b.sentence_vectors).sum(axis=1) > 0
            x = a.sentence_vectors[kept].astype(np.float32)
            y = b.sentence_vectors[kept].astype(np.float32)
            sentence_cos.append(
                (x * y).sum(axis=1) / np.linalg.norm(x, axis=1) / np.linalg.norm(y, axis=1)
            )
        sentences = np.concatenate(sentence_cos)
        report[arm] = {
            **{key: round(value, 1) for key, value in totals[arm].items()},
            "cpu_vs_torch": round(totals[arm]["cpu_s"] / totals["torch-float32"]["cpu_s"], 3),
            "passage_cosine_to_torch": _spread(passage_cos),
            "sentence_cosine_to_torch": _spread(sentences),
        }
    return report


def _spread(values: np.ndarray) -> dict[str, float]:
    return {
        "min": round(float(values.min()), 4),
        "p10": round(float(np.percentile(values, 10)), 4),
        "median": round(float(np.median(values)), 4),
    }


def _questions() -> list[str]:
    manual = [json.loads(line)["question"] for line in QUESTIONS.read_text().splitlines()]
    squad = [json.loads(line)["question"] for line in (SQUAD_DIR / "questions.jsonl").open()]
    return (manual + squad[:: max(1, len(squad) // 152)])[:200]


def _query_ms(embedders: dict[str, SentenceTransformerEmbedder]) -> dict[str, Any]:
    spent: dict[str, list[float]] = {arm: [] for arm in embedders}
    for question in _questions():
        for arm, embedder in embedders.items():
            started = time.perf_counter()
            embedder.encode([question], batch_size=1)
            spent[arm].append((time.perf_counter() - started) * 1000)
    return {
        arm: {
            "questions": len(ms),
            "median_ms": round(statistics.median(ms), 2),
            "p90_ms": round(float(np.percentile(ms, 90)), 2),
        }
        for arm, ms in spent.items()
    }


def _full_builds(work: Path) -> dict[str, Any]:
    from answer_service.cli.manual import manual_pages
    from answer_service.runtime.settings import default_cache_dir

    pages = manual_pages(default_cache_dir())
    report: dict[str, Any] = {}
    for arm in ANSWERED[::-1]:
        embedder = SentenceTransformerEmbedder(ARMS[arm])
        source = open_source([pages], IngestOptions(source_url=SOURCE_URL))
        built: list[Any] = []
        timing = _timed(
            lambda e=embedder, s=source, a=arm, b=built: b.append(
                build_index(s, work / f"full-{a}", e, force=True, progress=False)
            )
        )
        report[arm] = {
            "passages": built[0].manifest.passage_count,
            **timing,
            "load_1min_at_end": round(os.getloadavg()[0], 2),
        }
        print(arm, report[arm], flush=True)
    return report


def _scifact(work: Path) -> dict[str, Any]:
    data = SCIFACT_DIR
    parts = json.loads((Path("eval/splits/scifact.json")).read_text())["parts"]
    kept = set(parts["scorer_training"]) | set(parts["planner_training"])
    queries = work / "scifact-queries.jsonl"
    lines = (data / "queries.train.jsonl").read_text().splitlines()
    queries.write_text("".join(f"{line}\n" for line in lines if json.loads(line)["_id"] in kept))
    report: dict[str, Any] = {"claims": len(kept), "parts": "scorer_training + planner_training"}
    for arm in ANSWERED:
        out = work / f"scifact-{arm}.json"
        command = [sys.executable, "-c", _RUNTIME_PATCH, "retrieval", "--corpus"]
        command += [str(data / "corpus.jsonl"), "--queries", str(queries)]
        command += ["--qrels", str(data / "qrels" / "train.tsv")]
        command += ["--index", str(work / f"scifact-{arm}"), "--out", str(out)]
        started = time.perf_counter()
        subprocess.run(command, check=True, env=os.environ | {"BENCH_EMBEDDER": arm})
        metrics = json.loads(out.read_text())["metrics"]
        report[arm] = {
            mode: {key: round(metrics[mode][key], 4) for key in ("ndcg@10", "recall@100")}
            for mode in ("dense", "lexical", "hybrid")
        } | {"build_and_queries_wall_s": round(time.perf_counter() - started, 1)}
        print(arm, report[arm], flush=True)
    return report


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--squad-sample", type=int, default=300)
    parser.add_argument("--tokenizer", default=str(_SMOLLM2))
    parser.add_argument("--full-build", action="store_true", help="only part 4, into --out")
    parser.add_argument("--scifact", action="store_true", help="only part 5, into --out")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    if args.full_build or args.scifact:
        result = json.loads(args.out.read_text())
        if args.full_build:
            result["full_manual_build"] = {"commit": commit_now(), **_full_builds(args.work)}
        if args.scifact:
            result["scifact_retrieval"] = {"commit": commit_now(), **_scifact(args.work)}
        args.out.write_text(json.dumps(result, indent=1) + "\n")
        return
    embedders = {arm: SentenceTransformerEmbedder(config) for arm, config in ARMS.items()}
    for embedder in embedders.values():
        embedder.warm_up()
    sets = development_sets(args.work, args.squad_sample)
    results: dict[str, Any] = {"question_embedding": _query_ms(embedders)}
    print(json.dumps(results, indent=1), flush=True)
    fake = create_fake_sglang(FakeSGLangState(model_path=args.tokenizer))
    with serve_in_thread(fake) as url:
        for name, (source, questions, extra) in sets.items():
            entry: dict[str, Any] = {}
            for arm in ANSWERED:
                index = args.work / f"{name}-{arm}"
                started = time.perf_counter()
                report = build_index(source, index, embedders[arm], force=True, progress=False)
                entry[f"build_wall_s {arm}"] = round(time.perf_counter() - started, 1)
                entry["passages"] = report.manifest.passage_count
                out = args.work / f"answers-{name}-{arm}.json"
                entry[arm] = answered(
                    index,
                    questions,
                    out,
                    url,
                    extra,
                    program=("-c", _RUNTIME_PATCH),
                    env=os.environ | {"BENCH_EMBEDDER": arm},
                )
            if name == "manual":
                entry["passage_passes"] = _passes(args.work / "manual-torch-float32", embedders)
            results[name] = entry
            print(name, json.dumps(entry, indent=1), flush=True)
    command = "python docs/benchmarks/embedder_runtimes.py --work DIR "
    write_result(
        args.out, command + f"--squad-sample {args.squad_sample}", args.squad_sample, results
    )


if __name__ == "__main__":
    main()
