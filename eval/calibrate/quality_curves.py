"""Quality curves: what each retrieval choice buys, as the request planner values it.

For a seeded sample of questions (the same sample `answer-eval answers --sample N --seed S`
draws), the top `--candidates` passages in hybrid order (the service default), then the same
list with its first d passages reranked by the cross-encoder, for each rerank depth d (the
passages below d keep their hybrid order after the reranked ones). Per depth (0: no rerank):

- `gold_in_top_n[n - 1]`: share of questions whose gold passage is among the first n passages;
- `answer_in_top_n[n - 1]`: share of questions where a gold answer string (SQuAD
  normalisation, whole tokens) occurs in the text of one of the first n passages;
- `rerank_ms`: the rerank call's latency in this run (mean, p50, p95; 0 at depth 0).

Where the reranker cannot be loaded (no model hub) only depth 0 is measured, and the result's
`config.reranker_status` says why.

    python -m eval.calibrate.quality_curves --out eval/results/quality-curves.json \
        [--part planner_training] [--sample N --seed S] [--reranker builtin]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import statistics
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from tqdm import tqdm

from budget import Deadline
from eval.commands.main import index_of
from eval.lib.data import PARTS, SQUAD_DIR, Part, squad_part_of
from eval.lib.latency_stats import percentiles
from eval.lib.metrics import answer_recall
from eval.lib.questions import Question, read_questions, sample
from eval.lib.results import write_result
from retrieval.corpus import corpus_checksum
from retrieval.embedder import (
    DEFAULT_EMBEDDER,
    EmbedderConfig,
    SentenceTransformerEmbedder,
    pick_device,
    pick_dtype,
)
from retrieval.errors import RetrievalError
from retrieval.passage import ScoredPassage
from retrieval.rerank.base import DEFAULT_RERANKER, RerankerConfig, RerankRequest
from retrieval.rerank.factory import load_reranker
from retrieval.retriever import Retriever

logger = logging.getLogger(__name__)

# Generous: a curve measures the stages at their own pace, never a degraded order.
_STEP_BUDGET_MS = 120_000


@dataclass(frozen=True, slots=True)
class OrderRanks:
    """Where, in one order of a question's passages, the gold passage and the first passage
    holding a gold answer stand (1-based; None when not among the candidates)."""

    gold_rank: int | None
    answer_rank: int | None
    rerank_ms: float = 0.0


@dataclass(frozen=True, slots=True)
class QuestionRanks:
    question_id: str
    by_depth: dict[int, OrderRanks]


@dataclass(frozen=True, slots=True)
class DepthCurve:
    gold_in_top_n: list[float]
    answer_in_top_n: list[float]
    rerank_ms: dict[str, float]


def order_ranks(
    passages: Sequence[ScoredPassage], question: Question, rerank_ms: float = 0.0
) -> OrderRanks:
    gold = next(
        (n for n, p in enumerate(passages, 1) if p.passage.doc_id == question.gold_passage_id),
        None,
    )
    answer = next(
        (n for n, p in enumerate(passages, 1) if answer_recall(p.passage.text, question.answers)),
        None,
    )
    return OrderRanks(gold, answer, rerank_ms)


def share_within(ranks: Sequence[int | None], max_n: int) -> list[float]:
    """For n = 1..max_n, the share of `ranks` that are at most n (None never is)."""
    if not ranks:
        return [0.0] * max_n
    return [
        round(sum(r is not None and r <= n for r in ranks) / len(ranks), 4)
        for n in range(1, max_n + 1)
    ]


def curves(
    records: Sequence[QuestionRanks], depths: Sequence[int], max_n: int
) -> dict[int, DepthCurve]:
    result = {}
    for depth in depths:
        ranks = [r.by_depth[depth] for r in records]
        latencies = [r.rerank_ms for r in ranks]
        result[depth] = DepthCurve(
            gold_in_top_n=share_within([r.gold_rank for r in ranks], max_n),
            answer_in_top_n=share_within([r.answer_rank for r in ranks], max_n),
            rerank_ms={
                "mean": round(statistics.fmean(latencies), 3) if latencies else 0.0,
                **percentiles(latencies, (50, 95)),
            },
        )
    return result


async def rank_question(
    retriever: Retriever, question: Question, depths: Sequence[int], candidates: int
) -> QuestionRanks:
    """The question's hybrid top `candidates`, and its order after reranking each depth."""
    text = question.question
    found = await retriever.retrieve(
        text, candidates, Deadline.after_ms(_STEP_BUDGET_MS), mode="hybrid"
    )
    hybrid = found.passages
    by_depth = {}
    for depth in depths:
        if depth == 0:
            by_depth[0] = order_ranks(hybrid, question)
            continue
        assert retriever.rerank is not None
        reranked = await retriever.rerank.run(
            RerankRequest(text, hybrid[:depth], depth), Deadline.after_ms(_STEP_BUDGET_MS)
        )
        if reranked.cut is not None:
            raise RetrievalError(f"rerank at depth {depth} degraded: {reranked.cut.reason}")
        order = reranked.value + hybrid[depth:]
        by_depth[depth] = order_ranks(order, question, reranked.elapsed_ms)
    return QuestionRanks(question.question_id, by_depth)


async def measure(
    retriever: Retriever,
    questions: Sequence[Question],
    depths: Sequence[int],
    *,
    candidates: int = 30,
    progress: bool = True,
) -> list[QuestionRanks]:
    """Every question's ranks at every depth; a depth above 0 needs `retriever.reranker`."""
    if not depths or any(not 0 <= d <= candidates for d in depths):
        raise ValueError(f"rerank depths {list(depths)} must lie in [0, {candidates}]")
    if any(d > 0 for d in depths) and retriever.reranker is None:
        raise ValueError("rerank depths above 0 need a reranker")
    records = []
    for question in tqdm(questions, unit="question", desc="quality curves", disable=not progress):
        records.append(await rank_question(retriever, question, depths, candidates))
    return records


def sample_questions(path: Path, size: int | None, seed: int, part: Part | None) -> list[Question]:
    """A seeded sample (of `part`'s questions where one is named) drawn as `answer-eval answers`
    draws it, less the questions without a gold passage or answer (which no curve can count)."""
    questions = read_questions(path)
    if part is not None:
        questions = [q for q in questions if squad_part_of(q.gold_passage_id or "") == part]
    drawn = sample(questions, size, seed)
    return [q for q in drawn if q.gold_passage_id and q.answers]


def _open(args: argparse.Namespace) -> tuple[Retriever, str]:
    """The hybrid retriever over `--passages` with the reranker attached where it loads, and
    the reranker's status."""
    embedder = SentenceTransformerEmbedder(EmbedderConfig(model=args.embedder))
    index_dir = index_of(args.passages, args.index, embedder)
    retriever = Retriever.open(index_dir, embedder, corpus_checksum=corpus_checksum(args.passages))
    if "hybrid" not in retriever.modes():
        retriever.close()
        raise RetrievalError(f"the index at {index_dir} has no BM25 index for hybrid retrieval")
    if args.reranker is None:
        return retriever, "disabled (--reranker none)"
    config = RerankerConfig(model=args.reranker, max_tokens=args.reranker_max_tokens)
    retriever = retriever.with_reranker(load_reranker(config))
    if retriever.reranker is None:
        return retriever, f"unavailable: {args.reranker} could not be loaded"
    return retriever, "loaded"


async def _run(args: argparse.Namespace) -> int:
    questions = sample_questions(args.questions, args.sample, args.seed, args.part)
    retriever, reranker_status = await asyncio.to_thread(_open, args)
    depths = [0] + ([d for d in args.depths if d > 0] if retriever.reranker else [])
    if retriever.reranker is None:
        logger.warning("measuring depth 0 only reranker_status=%s", reranker_status)
    try:
        records = await measure(retriever, questions, depths, candidates=args.candidates)
        passage_count = len(retriever.index)
    finally:
        retriever.close()
    by_depth = curves(records, depths, args.max_n)
    config = {
        "command": "quality-curves",
        "passages": corpus_checksum(args.passages),
        "questions": str(args.questions),
        "part": args.part,
        "sample": args.sample,
        "seed": args.seed,
        "retrieval_mode": "hybrid",
        "candidates": args.candidates,
        "rerank_depths": depths,
        "max_n": args.max_n,
        "embedder": args.embedder,
        "reranker": args.reranker,
        "reranker_max_tokens": args.reranker_max_tokens,
        "reranker_status": reranker_status,
        # The embedder and the reranker run in this dtype; it sets the rerank latency.
        "dtype": pick_dtype("auto", pick_device("auto")),
        "cpus": os.cpu_count(),
    }
    metrics = {
        "sample_size": len(records),
        "depths": {str(d): asdict(curve) for d, curve in by_depth.items()},
    }
    write_result(
        args.out,
        "quality-curves",
        config,
        {"sampled_questions": len(questions), "passages": passage_count},
        metrics,
        {"records": [asdict(r) for r in records]},
    )
    _print_table(by_depth, min(args.max_n, 8))
    return 0


def _print_table(by_depth: dict[int, DepthCurve], shown_n: int) -> None:
    header = "depth  curve   " + " ".join(f"n={n:<4}" for n in range(1, shown_n + 1))
    print(header + "  rerank ms (mean)")
    for depth, curve in by_depth.items():
        for name, values in (("gold", curve.gold_in_top_n), ("answer", curve.answer_in_top_n)):
            cells = " ".join(f"{v:.3f} " for v in values[:shown_n])
            print(f"{depth:<6} {name:7} {cells} {curve.rerank_ms['mean']:.1f}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m eval.calibrate.quality_curves", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--passages", type=Path, default=SQUAD_DIR / "passages.jsonl")
    parser.add_argument("--questions", type=Path, default=SQUAD_DIR / "questions.jsonl")
    parser.add_argument("--index", type=Path, help="an index of --passages (else built)")
    parser.add_argument("--embedder", default=DEFAULT_EMBEDDER)
    parser.add_argument(
        "--reranker",
        default=DEFAULT_RERANKER,
        type=lambda value: None if value.lower() in ("", "none") else value,
        help="a cross-encoder hub id or folder, or 'none'",
    )
    parser.add_argument("--reranker-max-tokens", type=int, default=256)
    parser.add_argument("--part", choices=PARTS, help="only this part's questions (a SQuAD split)")
    parser.add_argument("--sample", type=int, default=300, help="a seeded random N questions")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--candidates", type=int, default=30, help="passages retrieved")
    parser.add_argument("--depths", type=int, nargs="+", default=[10, 20, 30])
    parser.add_argument("--max-n", type=int, default=10, help="curves for n = 1..max_n")
    parser.add_argument("--out", type=Path, required=True)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not 1 <= args.max_n <= args.candidates:
        parser.error("--max-n must lie in [1, --candidates]")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    logging.getLogger("faiss.loader").setLevel(logging.WARNING)
    try:
        return asyncio.run(_run(args))
    except (RetrievalError, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
