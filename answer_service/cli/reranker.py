"""`answer-service reranker train`: train a reranker on relevance judgments, from one or more
(index, queries, qrels) sources: a full fine-tune of the packaged MiniLM saved as a CrossEncoder
folder the service loads by path, or with `--builtin` the adapter file the builtin reranker
ships (`ANSWER_RERANKER_MODEL=builtin`; copy `reranker.npz` over retrieval/rerank/'s)."""

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
        help="train MiniLM as a cross-encoder on BEIR judgments, with mined hard negatives",
        description="Each --index goes with the --queries and --qrels given in the same place "
        "(repeat the three for each source). Queries may carry `answers` (a list of strings): "
        "a passage holding one is never a negative. A --builtin run resumes from its "
        "checkpoint in --out.",
    )
    train.add_argument("--index", type=Path, action="append", required=True, help="index")
    train.add_argument(
        "--queries", type=Path, action="append", required=True, help="BEIR queries JSONL(.gz)"
    )
    train.add_argument(
        "--qrels", type=Path, action="append", required=True, help="BEIR qrels TSV(.gz), header"
    )
    train.add_argument("--out", type=Path, default=None, help="default: (first) INDEX/reranker")
    train.add_argument(
        "--builtin",
        action="store_true",
        help="train the builtin reranker's adapters instead of every weight",
    )
    # Unset options keep `TrainingConfig`'s defaults (not repeated here, nor imported yet).
    train.add_argument("--epochs", type=int)
    train.add_argument("--max-train-queries", type=int, help="per source; default: all")
    train.add_argument("--max-held-out-queries", type=int, help="per source; default: all")
    train.add_argument("--first-layer", type=int, help="--builtin: the first adapted layer")
    train.add_argument(
        "--start-from",
        type=Path,
        help="--builtin: an adapter file to train further (e.g. retrieval/sentences/reader.npz)",
    )
    train.add_argument(
        "--candidates", type=int, help="passages retrieved per query: mined, then reranked"
    )
    train.add_argument("--negatives", type=int, dest="negatives_per_query")
    train.add_argument("--max-tokens", type=int)
    train.add_argument("--seed", type=int)
    train.set_defaults(run=_train)


_CONFIG_OPTIONS = (
    "builtin",
    "epochs",
    "max_train_queries",
    "max_held_out_queries",
    "first_layer",
    "start_from",
    "candidates",
    "negatives_per_query",
    "max_tokens",
    "seed",
)


def _given(args: argparse.Namespace, names: tuple[str, ...]) -> dict[str, Any]:
    return {name: getattr(args, name) for name in names if getattr(args, name) is not None}


def _train(args: argparse.Namespace) -> int:
    from retrieval.errors import RetrievalError
    from retrieval.rerank.training import REPORT_FILE, load_judgments, train_reranker
    from retrieval.rerank.training_data import Source, TrainingConfig

    if not len(args.index) == len(args.queries) == len(args.qrels):
        print("error: give --queries and --qrels once for each --index", file=sys.stderr)
        return 2
    out_dir: Path = args.out or args.index[0] / DEFAULT_MODEL_DIR
    try:
        config = TrainingConfig(**_given(args, _CONFIG_OPTIONS))
        sources = [
            Source(index, tuple(load_judgments(queries, qrels)))
            for index, queries, qrels in zip(args.index, args.queries, args.qrels, strict=True)
        ]
        report = train_reranker(sources, config, out_dir)
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
        + "".join(
            f"  {source.index_dir}: {source.held_out_queries} held out, nDCG@10 "
            f"{source.before.ndcg:.4f} -> {source.after.ndcg:.4f}\n"
            for source in report.sources
        )
        + f"rerank latency, {report.candidates} passages, median ({report.rerank_dtype}): "
        f"{report.rerank_ms_median:.0f} ms\n"
        f"report: {out_dir / REPORT_FILE}"
    )
    return 0
