"""The sentence reader taught to read claims against passages, on SciFact: does a pair model
learned on the corpus's own training claims lift the reranker towards its goal?

    python -m eval.calibrate.passage_reader --out eval/results/passage-reader.json \\
        [--epochs 2] [--train-depth 8] [--max-tokens 192] [--device auto]

Reads ../shared/data/scifact. Each train claim of the committed split (eval/splits/scifact.json)
is retrieved as `eval.calibrate.sentence_reranker` retrieves it (hybrid, top 50, the shipped
scorer's sentences). The shipped reader's adapter (learned on SQuAD sentences) is trained further
on the scorer-training claims, each claim's first `--train-depth` passages a softmax group whose
target is its relevant abstracts' passages (`eval.calibrate.sentence_reader.train`, on the CPU in
fp32 where no GPU is: about half an hour on two cores). It then reads the first `READ_PASSAGES`
passages of the planner-training and evaluation claims; as in `sentence_reranker --reader`, a
passage it did not read takes the claim's lowest logit. The sentence mix and the reader's
weight beside it are chosen on the planner-training claims, which it never trained on, and
measured on the evaluation claims. A measurement: nothing here is shipped.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np

from eval.calibrate.sentence_reader import Group, TrainConfig, score, train
from eval.calibrate.sentence_reranker import (
    READ_PASSAGES,
    Claim,
    ndcg,
    reader_metrics,
    retrieve_claims,
)
from eval.lib.results import write_result
from eval.lib.splits import PARTS
from retrieval.embedder import passage_embedding_text, pick_device, resolve_model_path
from retrieval.sentences.reader import ReaderMeta, read_adapter

logger = logging.getLogger(__name__)

DEPTH = 50


def groups_of(
    claims: Sequence[Claim],
    texts: dict[str, str],
    qrels: dict[str, set[str]],
    part: str,
    depth: int,
) -> list[Group]:
    """Each claim's first `depth` passages as a reader group, labelled by relevance."""
    out = []
    for claim in claims:
        passages = [p.passage for p in claim.passages[:depth]]
        out.append(
            Group(
                claim.claim_id,
                part,
                claim.claim_id,
                texts[claim.claim_id],
                tuple(range(len(passages))),
                tuple(passage_embedding_text(p) for p in passages),
                tuple(p.title for p in passages),
                np.asarray([float(p.doc_id in qrels[claim.claim_id]) for p in passages]),
                np.zeros(len(passages)),
            )
        )
    return out


def with_reads(claims: Sequence[Claim], groups: Sequence[Group], read: Any) -> list[Claim]:
    """The reader's logit per passage (the claim's lowest past the passages it read)."""
    out = []
    for claim, group in zip(claims, groups, strict=True):
        logits = read.get(group.question_id, {})
        values = np.asarray([logits.get(text, np.nan) for text in group.texts])
        floor = float(np.nanmin(values)) if len(values) and not np.isnan(values).all() else 0.0
        full = np.full(len(claim.passages), floor)
        full[: len(values)] = np.where(np.isnan(values), floor, values)
        out.append(replace(claim, read=full))
    return out


async def run(args: argparse.Namespace) -> dict[str, Any]:
    retrieved = await retrieve_claims(PARTS, DEPTH)
    texts, qrels, parts = retrieved.texts, retrieved.qrels, retrieved.parts
    meta, start = read_adapter()
    config = TrainConfig(
        "claims",
        rank=meta.rank,
        alpha=meta.alpha,
        epochs=args.epochs,
        depth=args.train_depth,
        batch_questions=4,
        max_tokens=args.max_tokens,
    )
    device = pick_device(args.device)
    base = resolve_model_path(ReaderMeta().base)
    training = groups_of(parts["scorer_training"], texts, qrels, "scorer_training", config.depth)
    started = time.perf_counter()
    reader, tokenizer = await asyncio.to_thread(train, training, config, base, device, start)
    train_s = time.perf_counter() - started
    measured: dict[str, list[Claim]] = {}
    for part in ("planner_training", "evaluation"):
        groups = groups_of(parts[part], texts, qrels, part, READ_PASSAGES)
        read = await asyncio.to_thread(score, reader, tokenizer, groups, config, device)
        measured[part] = with_reads(parts[part], groups, read)
    chosen, test = measured["planner_training"], measured["evaluation"]
    return {
        "device": device,
        "train_config": asdict(config),
        "train_s": round(train_s, 1),
        "training_claims": len(training),
        "trained_groups": sum(bool(g.labels.any()) for g in training),
        "evaluation_hybrid": {"ndcg@10": ndcg(test, qrels, None), "claims": len(test)},
        # Mix and weight chosen on the planner-training claims, measured on the evaluation ones.
        "passage_reader": reader_metrics(
            chosen, test, qrels, {"passages": READ_PASSAGES, "whole_passages": True}
        ),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m eval.calibrate.passage_reader")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--train-depth", type=int, default=8, help="passages per training claim")
    parser.add_argument("--max-tokens", type=int, default=192)
    parser.add_argument("--device", default="auto")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    metrics = asyncio.run(run(args))
    write_result(
        args.out,
        "calibrate-passage-reader",
        {
            "epochs": args.epochs,
            "train_depth": args.train_depth,
            "max_tokens": args.max_tokens,
            "split": "eval/splits/scifact.json",
            "start": "retrieval/sentences/reader.npz",
        },
        {"corpus": "scifact", "claims": "train claims with qrels, by part"},
        metrics,
    )
    logger.info("passage reader: %s", metrics)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
