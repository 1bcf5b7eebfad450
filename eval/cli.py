"""`answer-eval`: measure the service offline. Each command writes its metrics under a
top-level `metrics` object with the configuration, dataset counts, software versions and a
timestamp, shows a progress bar, and resumes an interrupted run."""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import json
import logging
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from eval.checkpoint import RunCheckpoint
from eval.retrieval_quality import HttpRanking, InProcessRanking, evaluate_retrieval
from retrieval.corpus import corpus_checksum
from retrieval.embedder import DEFAULT_EMBEDDER, EmbedderConfig, SentenceTransformerEmbedder
from retrieval.errors import RetrievalError
from retrieval.indexer import build_index
from retrieval.judgments import read_qrels, read_queries
from retrieval.retriever import Retriever

logger = logging.getLogger(__name__)

_PACKAGES = (
    "answer-service",
    "faiss-cpu",
    "sentence-transformers",
    "torch",
    "bm25s",
    "ir-measures",
    "transformers",
)


def _versions() -> dict[str, str]:
    versions = {"python": sys.version.split()[0]}
    for package in _PACKAGES:
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            continue
    return versions


def _write(
    out: Path,
    command: str,
    config: dict[str, Any],
    dataset: dict[str, Any],
    metrics: dict[str, Any],
) -> None:
    result = {
        "command": command,
        "metrics": metrics,
        "config": config,
        "dataset": dataset,
        "versions": _versions(),
        "timestamp": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")


def _open_retriever(args: argparse.Namespace) -> Retriever:
    """The index of `--corpus`: `--index` checked against it, or built (resumably) under
    `--index` / the cache."""
    embedder = SentenceTransformerEmbedder(EmbedderConfig(model=args.embedder))
    checksum = corpus_checksum(args.corpus)
    index_dir = args.index or Path.home() / ".cache" / "answer-service" / "indexes" / (
        f"eval-{checksum.removeprefix('sha256:')[:16]}"
    )
    if args.index is None or not (index_dir / "manifest.json").is_file():
        build_index(args.corpus, index_dir, embedder)
    return Retriever.open(index_dir, embedder, corpus_checksum=checksum)


async def _retrieval(args: argparse.Namespace) -> int:
    queries = read_queries(args.queries)
    qrels = read_qrels(args.qrels)
    identity = {
        "command": "retrieval",
        "corpus": corpus_checksum(args.corpus),
        "queries": str(args.queries),
        "qrels": str(args.qrels),
        "url": args.url,
        "index": str(args.index),
        "depth": args.depth,
    }
    checkpoint = RunCheckpoint(args.out, identity)
    try:
        if args.url:
            async with httpx.AsyncClient(timeout=httpx.Timeout(60.0)) as http:
                result = await evaluate_retrieval(
                    HttpRanking(http, args.url), queries, qrels, checkpoint, depth=args.depth
                )
        else:
            retriever = await asyncio.to_thread(_open_retriever, args)
            try:
                result = await evaluate_retrieval(
                    InProcessRanking(retriever), queries, qrels, checkpoint, depth=args.depth
                )
            finally:
                retriever.close()
    except BaseException:
        checkpoint.close()
        raise
    _write(
        args.out,
        "retrieval",
        {**identity, "embedder": args.embedder},
        {"queries": result.queries, "judged_queries": result.judged},
        result.metrics,
    )
    checkpoint.finish()
    for mode, metrics in result.metrics.items():
        print(f"{mode:8} " + "  ".join(f"{name} {value:.4f}" for name, value in metrics.items()))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="answer-eval", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    retrieval = commands.add_parser("retrieval", help="nDCG@10, recall@10/100, MRR@10 per mode")
    retrieval.add_argument("--corpus", type=Path, required=True, help="BEIR corpus JSONL")
    retrieval.add_argument("--queries", type=Path, required=True, help="BEIR queries JSONL")
    retrieval.add_argument("--qrels", type=Path, required=True, help="BEIR qrels TSV")
    retrieval.add_argument("--index", type=Path, help="an index of the corpus (else built)")
    retrieval.add_argument("--url", help="evaluate a running service instead")
    retrieval.add_argument("--embedder", default=DEFAULT_EMBEDDER)
    retrieval.add_argument("--depth", type=int, default=100, help="passages ranked per query")
    retrieval.add_argument("--out", type=Path, required=True)
    retrieval.set_defaults(run=_retrieval)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    logging.getLogger("faiss.loader").setLevel(logging.WARNING)
    try:
        code: int = asyncio.run(args.run(args))
    except (RetrievalError, OSError, httpx.HTTPError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return code


if __name__ == "__main__":
    raise SystemExit(main())
