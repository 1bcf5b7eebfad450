"""The builtin passage reranker (retrieval/rerank/builtin.py): its training data, its cost per
pair under each runtime, and the answers it gives on the development sets beside no reranker.

    python docs/benchmarks/builtin_reranker.py data --work var/rr
    answer-service reranker train --builtin \
        --index var/rr/squad-train-index --queries ../shared/data/squad-v1.1-train/questions.jsonl.gz \
        --qrels ../shared/data/squad-v1.1-train/qrels.tsv.gz \
        --index var/rr/scifact-index --queries var/rr/scifact-train-queries.jsonl \
        --qrels var/rr/scifact-train-qrels.tsv \
        --max-train-queries 2000 --max-held-out-queries 300 --negatives 3 --out var/rr/q2k
    cp var/rr/q2k/reranker.npz retrieval/rerank/    # ship it: the answers read the package's
    python docs/benchmarks/builtin_reranker.py measure --work var/rr --run var/rr/q2k \
        --out docs/benchmarks/builtin-reranker.json

`data` writes SciFact's judged claims of the committed split's scorer- and planner-training
parts (eval/splits/scifact.json), never its evaluation part; SQuAD train is read as it is (its
questions carry their answers, which keep answering passages out of the negatives). The
indexes are built with `answer-service index build` over ../shared/data's corpora.

`measure` reads the run's training report where `--run` names one (nDCG@10 of each source's
held-out queries, the hybrid order against the reranked one), times its adapter's (else the
shipped one's) read of 10 and 30 SciFact
passages under ONNX Runtime int8 and float32 and torch float32 (bf16 where the CPU has it), and
answers the development sets of `sentence_pooling.py` in quote mode (3 s budgets), the planner
off, without a reranker and with the shipped builtin one at depths 10, 20 and 30. Never an
evaluation part. Lives here, not in eval/bench/,
because eval/ is at its line limit.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
from sentence_pooling import answer_arms, write_result

from eval.lib.data import SCIFACT_DIR, scifact_claims, shared
from retrieval.embedder import EmbedderConfig, SentenceTransformerEmbedder, pick_dtype
from retrieval.judgments import read_qrels, read_queries
from retrieval.rerank.builtin import ADAPTER_FILE, shipped_adapter
from retrieval.sentences.reader import ReaderConfig, SentenceReader


def write_data(work: Path) -> None:
    """SciFact's training parts as BEIR queries and qrels."""
    work.mkdir(parents=True, exist_ok=True)
    claims = scifact_claims("scorer_training") | scifact_claims("planner_training")
    queries = read_queries(shared(SCIFACT_DIR / "queries.train.jsonl"))
    qrels = read_qrels(shared(SCIFACT_DIR / "qrels" / "train.tsv"))
    kept = [q for q in queries if q.query_id in claims and q.query_id in qrels]
    with (work / "scifact-train-queries.jsonl").open("w") as out:
        out.writelines(json.dumps({"_id": q.query_id, "text": q.text}) + "\n" for q in kept)
    with (work / "scifact-train-qrels.tsv").open("w") as out:
        out.write("query-id\tcorpus-id\tscore\n")
        for q in kept:
            out.writelines(
                f"{q.query_id}\t{d}\t{g}\n" for d, g in sorted(qrels[q.query_id].items())
            )
    print(f"{len(kept)} SciFact training claims of {len(claims)} in the two parts")


def _passages() -> list[str]:
    """30 SciFact abstracts as the reranker reads them (title line, then text)."""
    with shared(SCIFACT_DIR / "corpus.jsonl").open() as lines:
        docs = [json.loads(line) for _, line in zip(range(30), lines, strict=False)]
    return [f"{doc['title']}\n{doc['text']}" for doc in docs]


def cost_per_pair(adapter: Path, repeats: int) -> dict[str, Any]:
    """The time of one rerank of 10 and of 30 passages (median, p90) and per pair, by runtime:
    the shipped adapter read as `BuiltinReranker` reads it."""
    passages = [(text, "") for text in _passages()]
    claims = [q.text for q in read_queries(shared(SCIFACT_DIR / "queries.train.jsonl"))[:repeats]]
    bf16 = pick_dtype("auto", "cpu") == "bfloat16"
    arms = [("onnx", "int8"), ("onnx", "float32"), ("torch", "bfloat16" if bf16 else "float32")]
    out: dict[str, Any] = {"cpu_native_bf16": bf16, "repeats": len(claims)}
    for runtime, dtype in arms:
        reader = SentenceReader(
            ReaderConfig(adapter=adapter, device="cpu", runtime=runtime, dtype=dtype)
        )
        reader.warm_up()
        row: dict[str, Any] = {}
        for depth in (10, 30):
            ms = []
            for claim in claims:
                started = time.perf_counter()
                reader.scores(claim, passages[:depth])
                ms.append((time.perf_counter() - started) * 1000)
            row[f"depth_{depth}_ms_p50"] = round(float(np.percentile(ms, 50)), 1)
            row[f"depth_{depth}_ms_p90"] = round(float(np.percentile(ms, 90)), 1)
            row[f"depth_{depth}_ms_per_pair"] = round(float(np.percentile(ms, 50)) / depth, 2)
        out[f"{runtime} {dtype}"] = row
        print(runtime, dtype, row, flush=True)
    return out


def _report(run: Path) -> dict[str, Any]:
    report = json.loads((run / "training_report.json").read_text())
    keep: tuple[str, ...] = ("kind", "train_queries", "held_out_queries", "train_pairs")
    keep += ("candidates",)
    keep += ("train_s", "total_s", "rerank_ms_median", "before", "after", "sources", "config")
    return {key: report[key] for key in keep}


def measure(args: argparse.Namespace) -> None:
    # The shipped adapter unless a run is named (its training report is then kept too).
    adapter = args.run / ADAPTER_FILE if args.run else shipped_adapter()
    results: dict[str, Any] = {"adapter": str(adapter)}
    if args.run:
        results["training"] = _report(args.run)
    results["cost"] = cost_per_pair(adapter, args.repeats)
    embedder = SentenceTransformerEmbedder(EmbedderConfig())
    embedder.warm_up()
    # The planner off, the rerank depth fixed: the quote's answers by depth (the planner's
    # valuation of a quote's rerank, `QualityCurve.quote_by_depth`).
    fixed = {"ANSWER_PLANNER": "false"}
    arms = {"no reranker": (fixed, ["--reranker", "none"])}
    for depth in (10, 20, 30):
        flags = ["--reranker", "builtin", "--experiment", f"fixed_rerank_depth={depth}"]
        arms[f"depth {depth}"] = (fixed, flags)
    results |= answer_arms(args.work, args.squad_sample, embedder, arms)
    command = "python docs/benchmarks/builtin_reranker.py measure --work DIR "
    command += f"--run {args.run} " if args.run else ""
    command += f"--squad-sample {args.squad_sample}"
    write_result(args.out, command, args.squad_sample, results)


def main() -> None:
    parser = argparse.ArgumentParser()
    commands = parser.add_subparsers(dest="command", required=True)
    data = commands.add_parser("data")
    data.add_argument("--work", type=Path, required=True)
    measuring = commands.add_parser("measure")
    measuring.add_argument("--work", type=Path, required=True)
    measuring.add_argument("--run", type=Path, help="a training run's folder (else the shipped)")
    measuring.add_argument("--out", type=Path, required=True)
    measuring.add_argument("--squad-sample", type=int, default=300)
    measuring.add_argument("--repeats", type=int, default=40)
    args = parser.parse_args()
    if args.command == "data":
        write_data(args.work)
    else:
        measure(args)


if __name__ == "__main__":
    main()
