"""`answer-eval`: measure the service offline. Each command writes its metrics under a
top-level `metrics` object with the configuration, dataset counts, software versions and a
timestamp, shows a progress bar, and resumes an interrupted run."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import logging
import sys
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import httpx

from answer_service.errors import ServiceError
from answer_service.runtime.configs import experiment_of
from answer_service.runtime.settings import Settings
from budget.forms import MODES
from eval.calibrate.citations import calibrate, corpus_without, retrieve_all
from eval.calibrate.citations import write as write_calibration
from eval.commands.answers import (
    AnsweringSource,
    Ask,
    HttpAnswering,
    collect_answers,
    in_process_answering,
    score_answers,
)
from eval.commands.load import add_load_command
from eval.commands.report import add_report_command
from eval.commands.retrieval_quality import HttpRanking, InProcessRanking, evaluate_retrieval
from eval.lib.checkpoint import RunCheckpoint
from eval.lib.data import PARTS, squad_part_of
from eval.lib.questions import Question, read_questions, sample
from eval.lib.results import measured_at
from eval.lib.results import write_result as _write
from retrieval.corpus import corpus_checksum
from retrieval.embedder import DEFAULT_EMBEDDER, EmbedderConfig, SentenceTransformerEmbedder
from retrieval.errors import RetrievalError
from retrieval.index.builder import build_index
from retrieval.judgments import read_qrels, read_queries
from retrieval.retriever import Retriever

logger = logging.getLogger(__name__)

_CACHE = Path.home() / ".cache" / "answer-service"


def index_of(corpus: Path, index: Path | None, embedder: SentenceTransformerEmbedder) -> Path:
    """The index of `corpus`: `index` where it holds one, else built (resumably) there or in
    the cache; checked against the corpus when opened."""
    checksum = corpus_checksum(corpus)
    index_dir = index or _CACHE / "indexes" / (f"eval-{checksum.removeprefix('sha256:')[:16]}")
    if index is None or not (index_dir / "manifest.json").is_file():
        build_index(corpus, index_dir, embedder)
    return index_dir


def _open_retriever(args: argparse.Namespace) -> Retriever:
    embedder = SentenceTransformerEmbedder(EmbedderConfig(model=args.embedder))
    index_dir = index_of(args.corpus, args.index, embedder)
    return Retriever.open(index_dir, embedder, corpus_checksum=corpus_checksum(args.corpus))


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


def _chosen(args: argparse.Namespace) -> list[Question]:
    questions = read_questions(args.questions)
    if getattr(args, "part", None):
        questions = [
            q
            for q in questions
            if q.gold_passage_id and squad_part_of(q.gold_passage_id) == args.part
        ]
    questions = sample(questions, args.sample, args.seed)
    if args.limit is not None:
        questions = questions[: args.limit]
    return questions


async def _answers(args: argparse.Namespace) -> int:
    questions = _chosen(args)
    if args.remove_gold:
        if args.passages is None or args.url:
            raise ServiceError("--remove-gold needs --passages and in-process answering")
        gold = {q.gold_passage_id for q in questions if q.gold_passage_id}
        args.passages = corpus_without(args.passages, gold, _CACHE / "corpora")
        # Without their gold passages abstaining is right (and so is an answer that still holds
        # the gold string, found in another passage).
        questions = [
            dataclasses.replace(q, gold_passage_id=None, gold_removed=True) for q in questions
        ]
    identity = {
        "command": "answers",
        "questions": str(args.questions),
        "limit": args.limit,
        "sample": args.sample,
        "seed": args.seed,
        "passages": corpus_checksum(args.passages) if args.passages else None,
        "url": args.url,
        "ttft_budget_ms": args.ttft_budget_ms,
        "top_k": args.top_k,
        "answer_mode": args.answer_mode,
        "part": args.part,
        "remove_gold": args.remove_gold,
    }
    checkpoint = RunCheckpoint(args.out, identity)
    config: dict[str, Any] = {**identity, "concurrency": args.concurrency}
    try:
        async with contextlib.AsyncExitStack() as stack:
            source: AnsweringSource
            if args.url:
                timeout = httpx.Timeout(args.request_timeout_s)
                http = await stack.enter_async_context(httpx.AsyncClient(timeout=timeout))
                source = HttpAnswering(http, args.url)
            else:
                settings = await asyncio.to_thread(_in_process_settings, args)
                config["settings"] = settings.model_dump(mode="json")
                experiment = experiment_of(args.experiment)
                config["experiment"] = args.experiment
                source = await stack.enter_async_context(in_process_answering(settings, experiment))
            records = await collect_answers(
                source,
                questions,
                checkpoint,
                Ask(args.ttft_budget_ms, args.top_k, args.answer_mode),
                concurrency=args.concurrency,
            )
    except BaseException:
        checkpoint.close()
        raise
    metrics = score_answers(questions, records)
    _write(
        args.out,
        "answers",
        config,
        {
            "questions": len(questions),
            "answerable": sum(bool(q.answers) for q in questions),
            "with_gold_passage": sum(bool(q.gold_passage_id) for q in questions),
        },
        metrics,
        {"requests": [asdict(r) for r in records]},
    )
    checkpoint.finish()
    print(json.dumps(metrics, indent=2))
    return 0


async def _calibrate(args: argparse.Namespace) -> int:
    questions = [q for q in _chosen(args) if q.gold_passage_id and q.answers]
    retriever = await asyncio.to_thread(_open_retriever, args)
    try:
        retrieved = await retrieve_all(retriever, questions, args.top_k)
    finally:
        retriever.close()
    result = calibrate(retrieved, k=args.top_k, max_false_abstention=args.max_false_abstention)
    config = {
        "questions": str(args.questions),
        "corpus": corpus_checksum(args.corpus),
        "sample": args.sample,
        "seed": args.seed,
        "top_k": args.top_k,
        "mode": "hybrid",
        "max_false_abstention": args.max_false_abstention,
        "embedder": args.embedder,
    }
    write_calibration(args.out, config, result)
    print(json.dumps(result, indent=2))
    return 0


def _in_process_settings(args: argparse.Namespace) -> Settings:
    """The service's settings (environment included) with the index of `--passages`."""
    if args.passages is None and args.index is None:
        raise ServiceError("in-process answering needs --passages (or --index), or --url")
    embedder = SentenceTransformerEmbedder(EmbedderConfig(model=args.embedder))
    index_dir = (
        args.index if args.passages is None else index_of(args.passages, args.index, embedder)
    )
    overrides: dict[str, Any] = {"index_dir": index_dir, "embedder_model": args.embedder}
    if args.sglang_url:
        overrides["sglang_url"] = args.sglang_url
    if args.reranker is not None:
        overrides["reranker_model"] = args.reranker
    return Settings(**overrides)


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

    answers = commands.add_parser(
        "answers", help="EM/F1, answer recall, citations, abstention, TTFT end to end"
    )
    answers.add_argument("--questions", type=Path, required=True, help="questions JSONL")
    answers.add_argument("--passages", type=Path, help="the corpus the questions are about")
    answers.add_argument("--index", type=Path, help="an index of --passages (else built)")
    answers.add_argument("--url", help="ask a running service instead of the pipeline in-process")
    answers.add_argument("--sglang-url", help="in-process: SGLang (default: ANSWER_SGLANG_URL)")
    answers.add_argument(
        "--reranker", help="in-process: a cross-encoder, or 'none' (default: the service's)"
    )
    answers.add_argument("--embedder", default=DEFAULT_EMBEDDER)
    answers.add_argument(
        "--part",
        choices=PARTS,
        help="only the questions of this part of the committed split (eval/splits/squad.json)",
    )
    answers.add_argument("--limit", type=int, help="only the first N questions")
    answers.add_argument("--sample", type=int, help="a seeded random N of the questions")
    answers.add_argument("--seed", type=int, default=0)
    answers.add_argument("--ttft-budget-ms", type=int, default=3000)
    answers.add_argument("--top-k", type=int, default=5, help="passages per answer")
    answers.add_argument(
        "--answer-mode",
        choices=MODES,
        help="quote, focused, passages or auto (default: the service's, ANSWER_MODE)",
    )
    answers.add_argument("--concurrency", type=int, default=1, help="questions in flight")
    answers.add_argument("--experiment", action="append", default=[], help="in-process: KEY=VALUE")
    answers.add_argument("--request-timeout-s", type=float, default=120.0)
    answers.add_argument(
        "--remove-gold",
        action="store_true",
        help="index --passages without the questions' gold passages (abstention is right)",
    )
    answers.add_argument("--out", type=Path, required=True)
    answers.set_defaults(run=_answers)

    calibrate_cmd = commands.add_parser(
        "calibrate-citations", help="measure the citation and abstention thresholds on SQuAD"
    )
    calibrate_cmd.add_argument("--questions", type=Path, required=True, help="questions JSONL")
    calibrate_cmd.add_argument("--corpus", type=Path, required=True, help="their passages JSONL")
    calibrate_cmd.add_argument("--index", type=Path, help="an index of --corpus (else built)")
    calibrate_cmd.add_argument("--embedder", default=DEFAULT_EMBEDDER)
    calibrate_cmd.add_argument("--sample", type=int, help="a seeded random N of the questions")
    calibrate_cmd.add_argument("--limit", type=int, help="only the first N questions")
    calibrate_cmd.add_argument("--seed", type=int, default=0)
    calibrate_cmd.add_argument("--top-k", type=int, default=5, help="passages per answer")
    calibrate_cmd.add_argument("--max-false-abstention", type=float, default=0.05)
    calibrate_cmd.add_argument("--out", type=Path, required=True)
    calibrate_cmd.set_defaults(run=_calibrate)
    add_load_command(commands)
    add_report_command(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    measured_at()  # the code loaded now is what is measured
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    logging.getLogger("faiss.loader").setLevel(logging.WARNING)
    try:
        code: int = asyncio.run(args.run(args))
    except (RetrievalError, ServiceError, OSError, httpx.HTTPError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return code


if __name__ == "__main__":
    raise SystemExit(main())
