"""`answer-service reranker train`: fine-tune a cross-encoder on a corpus's relevance judgments
and save it beside the index, where the service can load it by path."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

DEFAULT_MODEL_DIR = "reranker"


def add_reranker_commands(subparsers: Any) -> None:
    """Add `reranker train` to the `answer-service` subcommands (an argparse subparsers object)."""
    reranker = subparsers.add_parser("reranker", help="train a cross-encoder reranker")
    commands = reranker.add_subparsers(dest="reranker_command", required=True)
    train = commands.add_parser(
        "train",
        help="fine-tune MiniLM as a cross-encoder on BEIR judgments, with mined hard negatives",
    )
    train.add_argument("--index", type=Path, required=True, help="index directory")
    train.add_argument("--queries", type=Path, required=True, help="BEIR queries JSONL")
    train.add_argument("--qrels", type=Path, required=True, help="BEIR qrels TSV with header")
    train.add_argument("--out", type=Path, default=None, help="default: INDEX/reranker")
    # Unset options keep `TrainingConfig`'s defaults (not repeated here, nor imported yet).
    train.add_argument("--epochs", type=int)
    train.add_argument("--max-train-queries", type=int, help="default: all")
    train.add_argument(
        "--candidates", type=int, help="passages retrieved per query: mined, then reranked"
    )
    train.add_argument("--negatives", type=int, dest="negatives_per_query")
    train.add_argument("--max-tokens", type=int)
    train.add_argument("--seed", type=int)
    train.set_defaults(run=_train)


_CONFIG_OPTIONS = (
    "epochs",
    "max_train_queries",
    "candidates",
    "negatives_per_query",
    "max_tokens",
    "seed",
)


def _given(args: argparse.Namespace, names: tuple[str, ...]) -> dict[str, Any]:
    return {name: getattr(args, name) for name in names if getattr(args, name) is not None}


def _train(args: argparse.Namespace) -> int:
    from retrieval.errors import RetrievalError
    from retrieval.rerank.training import (
        REPORT_FILE,
        TrainingConfig,
        load_judgments,
        train_reranker,
    )

    out_dir: Path = args.out or args.index / DEFAULT_MODEL_DIR
    try:
        config = TrainingConfig(**_given(args, _CONFIG_OPTIONS))
        judgments = load_judgments(args.queries, args.qrels)
        report = train_reranker(args.index, judgments, config, out_dir)
        (out_dir / REPORT_FILE).write_text(report.to_json() + "\n", encoding="utf-8")
    except (RetrievalError, OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    before, after = report.before, report.after
    print(
        f"reranker {out_dir}: trained on {report.train_queries} queries "
        f"({report.train_pairs} pairs, {report.dev_queries} dev) in {report.train_s:.0f} s\n"
        f"held out {report.held_out_queries} queries, top {report.candidates} passages, "
        f"doc level:\n"
        f"  retrieval order  nDCG@10 {before.ndcg:.4f}  MRR@10 {before.mrr:.4f}\n"
        f"  reranked         nDCG@10 {after.ndcg:.4f}  MRR@10 {after.mrr:.4f}\n"
        f"rerank latency, {report.candidates} passages, median ({report.rerank_dtype}): "
        f"{report.rerank_ms_median:.0f} ms\n"
        f"report: {out_dir / REPORT_FILE}"
    )
    return 0
