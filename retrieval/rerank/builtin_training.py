"""Learning the builtin reranker's adapter (`answer-service reranker train --builtin`).

The mined examples (training.py: each query's positive passages and its hard negatives) train
low-rank adapters, the layer norms and a one-logit head on the packaged MiniLM, as the sentence
reader is trained (retrieval/sentences/reader_model.py): the layers below `first_layer` stay
frozen, and each query's loss is the cross-entropy of a softmax over its own passages, its
positives sharing the target. It may start from another adapter of the same rank (the sentence
reader's, which already tells a question's answer from its neighbours). The order is seeded and the run checkpoints every hundred steps
in the output folder, so a killed run resumes where it stopped. What ships is the adapter file
(rerank/builtin.py reads it), about a megabyte, with the rank prior that joins the model's
score to the retrieval order, chosen on the development queries (`choose_rank_prior`).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from retrieval.embedder import resolve_model_path
from retrieval.errors import RetrievalError
from retrieval.rerank.base import RerankerConfig
from retrieval.rerank.builtin import ADAPTER_FILE, BuiltinReranker, with_rank_prior
from retrieval.rerank.training_data import Candidates, Judgment, MinedExample, TrainingConfig
from retrieval.sentences.reader_adapter import ReaderMeta, read_adapter, write_adapter

logger = logging.getLogger(__name__)

CHECKPOINT_FILE = "checkpoint.pt"
# Positives a query contributes to a step (a SciFact abstract may have several passages).
_MOST_POSITIVES = 2


def fit_builtin(examples: Sequence[MinedExample], config: TrainingConfig, out_dir: Path) -> float:
    """Train the adapter on `examples` and write it to `out_dir`; the seconds spent training
    (over every sitting of a resumed run)."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    from retrieval.sentences.reader_model import PairModel, add_adapters, train_steps

    torch.manual_seed(config.seed)
    base_dir = resolve_model_path(config.base_model)
    encoder = AutoModel.from_pretrained(base_dir, dtype=torch.float32)
    add_adapters(encoder, config.rank, config.alpha, config.first_layer)
    model, tokenizer = PairModel(encoder), AutoTokenizer.from_pretrained(base_dir)
    if config.start_from is not None:
        meta, arrays = read_adapter(config.start_from)
        if (meta.base, meta.rank) != (config.base_model, config.rank):
            raise RetrievalError(
                f"{config.start_from} adapts {meta.base} at rank {meta.rank}, not "
                f"{config.base_model} at rank {config.rank}"
            )
        model.load_adapter(arrays)
    order = _order(examples, config)
    per_step = max(1, config.batch_size // (1 + config.negatives_per_query))

    def loss_at(step: int) -> Any:
        batch = order[step * per_step : (step + 1) * per_step]
        queries, texts, sizes = [], [], []
        for example in batch:
            passages = [*example.positives[:_MOST_POSITIVES], *example.negatives]
            queries.extend([example.query] * len(passages))
            texts.extend(passages)
            sizes.append((min(len(example.positives), _MOST_POSITIVES), len(passages)))
        encoded = tokenizer(
            queries,
            texts,
            truncation="longest_first",
            max_length=config.max_tokens,
            padding=True,
            return_tensors="pt",
        )
        logits = model(**encoded)
        loss, start = torch.zeros(()), 0
        for positives, n in sizes:
            log_p = torch.log_softmax(logits[start : start + n], dim=0)
            loss = loss - log_p[:positives].mean()
            start += n
        return loss / len(batch)

    out_dir.mkdir(parents=True, exist_ok=True)
    steps = math.ceil(len(order) / per_step)
    _, seconds = train_steps(
        model,
        loss_at,
        steps,
        learning_rate=config.adapter_learning_rate,
        checkpoint=out_dir / CHECKPOINT_FILE,
        clip=1.0,
    )
    meta = ReaderMeta(
        base=config.base_model,
        rank=config.rank,
        alpha=config.alpha,
        # Served at the reranker's passage length, whatever length it was trained at.
        max_tokens=RerankerConfig().max_tokens,
        with_title=False,
    )
    write_adapter(out_dir / ADAPTER_FILE, meta, model.adapter_arrays())
    return seconds


def _order(examples: Sequence[MinedExample], config: TrainingConfig) -> list[MinedExample]:
    """Each epoch's examples (those with a negative) in its own seeded order, one after another."""
    usable = [e for e in examples if e.positives and e.negatives]
    order: list[MinedExample] = []
    for epoch in range(config.epochs):
        shuffled = list(usable)
        random.Random(config.seed + epoch).shuffle(shuffled)
        order.extend(shuffled)
    return order


# The rank priors tried on the development queries (0: the model's order alone).
RANK_PRIORS = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0)


def choose_rank_prior(
    adapter: Path, dev: Sequence[tuple[Sequence[Judgment], Candidates]]
) -> dict[float, float]:
    """Each rank prior's nDCG@10 on the development queries (each source's mean, then the
    mean over sources, so a large source does not outvote a small one); the best is written
    into the adapter's metadata."""
    from retrieval.relevance import binary_qrels, doc_ranking, score_rankings

    reranker = BuiltinReranker(RerankerConfig(), adapter=adapter)
    reranker.warm_up()
    scored = [
        (
            judgments,
            candidates,
            {j.query_id: reranker.logits(j.query, candidates[j.query_id]) for j in judgments},
        )
        for judgments, candidates in dev
        if judgments
    ]
    if not scored:
        return {}
    table = {}
    for prior in RANK_PRIORS:
        by_source = []
        for judgments, candidates, logits in scored:
            rankings = {}
            for j in judgments:
                found = candidates[j.query_id]
                order = np.argsort(-with_rank_prior(logits[j.query_id], prior), kind="stable")
                rankings[j.query_id] = doc_ranking([found[int(i)] for i in order])
            qrels = binary_qrels({j.query_id: j.relevant_doc_ids for j in judgments})
            by_source.append(score_rankings(rankings, qrels).ndcg)
        table[prior] = float(np.mean(by_source))
    best = max(RANK_PRIORS, key=lambda prior: table[prior])
    meta, arrays = read_adapter(adapter)
    write_adapter(adapter, dataclasses.replace(meta, rank_prior=best), arrays)
    logger.info("builtin reranker rank prior chosen=%s ndcg_by_prior=%s", best, table)
    return table
