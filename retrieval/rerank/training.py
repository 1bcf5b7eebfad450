"""Training a reranker on relevance judgments: one or more (index, judgments) sources.

No cross-encoder can be downloaded everywhere, so one is trained from the packaged MiniLM
encoder, in one of two ways on the same mined examples:

    full     a fresh one-logit head and every weight fine-tuned with sentence-transformers'
             `CrossEncoderTrainer` and `BinaryCrossEntropyLoss` on (query, passage, label)
             pairs, saved as an ordinary `CrossEncoder` folder that `CrossEncoderReranker`
             loads by path
    builtin  low-rank adapters and a head (builtin_training.py), saved as the adapter file the
             builtin reranker ships (rerank/builtin.py); resumable

Positives are passages of relevant documents (those holding an answer, where the query says
what answers it); hard negatives are the best-ranked passages of other documents that hold no
answer, both mined with the project's hybrid retriever over the source's index.

Splits, by query id, never by position: `held_out_fraction` of the queries (chosen by a hash
of the id, so a query stays on its side however the file is ordered or capped) are neither
trained on nor used to pick the checkpoint; they only measure the result, at document level,
before (hybrid order) and after reranking. A `dev_fraction` of the training queries picks the
checkpoint (full training) or the rank prior (builtin).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from budget import Deadline
from retrieval.embedder import (
    EmbedderConfig,
    SentenceTransformerEmbedder,
    passage_embedding_text,
    pick_device,
    pick_dtype,
    resolve_model_path,
)
from retrieval.errors import RetrievalError
from retrieval.index.faiss_index import FaissIndex, read_manifest
from retrieval.judgments import read_qrels, read_queries
from retrieval.passage import Passage, ScoredPassage
from retrieval.relevance import RelevanceScores, binary_qrels, doc_ranking, score_rankings
from retrieval.rerank.base import RerankerConfig, RerankRequest
from retrieval.rerank.builtin import ADAPTER_FILE, BuiltinReranker
from retrieval.rerank.builtin_training import choose_rank_prior, fit_builtin
from retrieval.rerank.cross_encoder import CrossEncoderReranker
from retrieval.rerank.training_data import (
    Candidates,
    Judgment,
    MinedExample,
    Source,
    TrainingConfig,
)
from retrieval.retriever import Retriever

logger = logging.getLogger(__name__)

REPORT_FILE = "training_report.json"
_SEARCH_TIMEOUT_MS = 60_000.0


@dataclass(frozen=True, slots=True)
class JudgmentSplit:
    train: tuple[Judgment, ...]
    dev: tuple[Judgment, ...]
    held_out: tuple[Judgment, ...]


@dataclass(frozen=True, slots=True)
class SourceReport:
    index_dir: str
    train_queries: int
    held_out_queries: int
    before: RelevanceScores
    after: RelevanceScores


@dataclass(frozen=True, slots=True)
class TrainingReport:
    """Over all sources (pooled), and each source's held-out measure in `sources`."""

    model_dir: str
    kind: str
    train_queries: int
    dev_queries: int
    held_out_queries: int
    train_pairs: int
    candidates: int
    train_dtype: str
    rerank_dtype: str
    train_s: float
    total_s: float
    before: RelevanceScores
    after: RelevanceScores
    rerank_ms_median: float
    train_query_ids: tuple[str, ...]
    held_out_query_ids: tuple[str, ...]
    sources: tuple[SourceReport, ...]
    # Builtin: the development queries' nDCG@10 by rank prior (the best is shipped).
    dev_ndcg_by_rank_prior: dict[str, float]
    config: TrainingConfig

    def to_json(self) -> str:
        # Paths (the adapter a run started from) as their text.
        return json.dumps(asdict(self), indent=2, default=str)


def load_judgments(queries: Path, qrels: Path) -> list[Judgment]:
    """BEIR layout (see `retrieval.judgments`). Queries with no document of positive score are
    left out; file order is kept."""
    grades = read_qrels(qrels)
    judgments = []
    for query in read_queries(queries):
        relevant = frozenset(
            doc for doc, grade in grades.get(query.query_id, {}).items() if grade > 0
        )
        if relevant:
            judgments.append(Judgment(query.query_id, query.text, relevant, query.answers))
    return judgments


def hash_fraction(key: str) -> float:
    """A stable number in [0, 1) for `key`, the same on every machine and run."""
    digest = hashlib.sha256(key.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def split_judgments(judgments: Sequence[Judgment], config: TrainingConfig) -> JudgmentSplit:
    """Held out by hash of the query id; the caps take the first queries of each side in an
    order hashed from their ids (so a cap spreads over a file sorted by topic)."""
    held_out = [j for j in judgments if hash_fraction(j.query_id) < config.held_out_fraction]
    rest = [j for j in judgments if hash_fraction(j.query_id) >= config.held_out_fraction]
    if config.max_train_queries is not None:
        rest = _first(rest, config.max_train_queries)
    if config.max_held_out_queries is not None:
        held_out = _first(held_out, config.max_held_out_queries)
    dev = [j for j in rest if hash_fraction(f"dev:{j.query_id}") < config.dev_fraction]
    train = [j for j in rest if hash_fraction(f"dev:{j.query_id}") >= config.dev_fraction]
    return JudgmentSplit(tuple(train), tuple(dev), tuple(held_out))


def _first(judgments: Sequence[Judgment], count: int) -> list[Judgment]:
    """The first `count` in hashed order, kept in file order."""
    kept = set(
        sorted(
            range(len(judgments)), key=lambda i: hash_fraction(f"order:{judgments[i].query_id}")
        )[:count]
    )
    return [j for i, j in enumerate(judgments) if i in kept]


def holds_answer(text: str, answers: Sequence[str]) -> bool:
    folded = text.casefold()
    return any(answer.casefold() in folded for answer in answers)


def mine_examples(
    judgments: Sequence[Judgment],
    candidates: Candidates,
    first_passages: Mapping[str, Passage],
    negatives_per_query: int,
) -> list[MinedExample]:
    """Positives: retrieved passages of relevant documents, or else each relevant document's
    first passage (where the judgment has answers, those holding one, if any does). Hard
    negatives: the best-ranked passage of each of the first `negatives_per_query` retrieved
    documents that are not relevant and hold no answer."""
    examples = []
    for judgment in judgments:
        retrieved = candidates.get(judgment.query_id, ())
        relevant, answers = judgment.relevant_doc_ids, judgment.answers
        positives = [s.passage for s in retrieved if s.passage.doc_id in relevant]
        if not positives:
            positives = [first_passages[d] for d in sorted(relevant) if d in first_passages]
        answering = [p for p in positives if holds_answer(p.text, answers)]
        positives = answering or positives
        negatives: dict[str, Passage] = {}
        for scored in retrieved:
            passage = scored.passage
            if (
                passage.doc_id not in relevant
                and len(negatives) < negatives_per_query
                and not holds_answer(passage.text, answers)
            ):
                negatives.setdefault(passage.doc_id, passage)
        if positives:
            examples.append(
                MinedExample(
                    judgment.query,
                    tuple(passage_embedding_text(p) for p in positives),
                    tuple(passage_embedding_text(p) for p in negatives.values()),
                )
            )
    return examples


def open_retriever(index_dir: Path) -> Retriever:
    """The index with its own embedder, as the service would open it."""
    manifest = read_manifest(index_dir)
    return Retriever.open(
        index_dir, SentenceTransformerEmbedder(EmbedderConfig(model=manifest.embedder))
    )


def retrieve_candidates(
    retriever: Retriever, judgments: Sequence[Judgment], k: int
) -> dict[str, list[ScoredPassage]]:
    """The top `k` passages per query: hybrid where the index has BM25, else dense."""
    return asyncio.run(_retrieve_all(retriever, judgments, k))


async def _retrieve_all(
    retriever: Retriever, judgments: Sequence[Judgment], k: int
) -> dict[str, list[ScoredPassage]]:
    mode = retriever.serving_mode("hybrid")
    found = {}
    for judgment in judgments:
        deadline = Deadline.after_ms(_SEARCH_TIMEOUT_MS)
        found[judgment.query_id] = (
            await retriever.retrieve(judgment.query, k, deadline, mode=mode)
        ).passages
    return found


def first_passages(index: FaissIndex) -> dict[str, Passage]:
    """Each document's first passage (position 0)."""
    firsts: dict[str, Passage] = {}
    for row in range(len(index)):
        passage = index.passage(row)
        firsts.setdefault(passage.doc_id, passage)
    return firsts


def _pairs(examples: Sequence[MinedExample]) -> dict[str, list[Any]]:
    columns: dict[str, list[Any]] = {"query": [], "passage": [], "label": []}
    for example in examples:
        for texts, label in ((example.positives, 1.0), (example.negatives, 0.0)):
            for text in texts:
                columns["query"].append(example.query)
                columns["passage"].append(text)
                columns["label"].append(label)
    return columns


def _dev_samples(
    judgments: Sequence[Judgment], candidates: Candidates
) -> list[dict[str, list[str] | str]]:
    """For `CrossEncoderRerankingEvaluator`: retrieved passages in order, relevant ones marked."""
    samples: list[dict[str, list[str] | str]] = []
    for judgment in judgments:
        passages = [s.passage for s in candidates.get(judgment.query_id, ())]
        documents = [passage_embedding_text(p) for p in passages]
        positive = [
            passage_embedding_text(p) for p in passages if p.doc_id in judgment.relevant_doc_ids
        ]
        if positive:
            samples.append({"query": judgment.query, "positive": positive, "documents": documents})
    return samples


def _fit(
    examples: Sequence[MinedExample],
    dev_samples: list[dict[str, list[str] | str]],
    config: TrainingConfig,
    device: str,
    out_dir: Path,
) -> None:
    """Train with sentence-transformers' trainer and save the picked model to `out_dir`."""
    import torch
    from datasets import Dataset  # type: ignore[import-untyped]
    from sentence_transformers.cross_encoder import (
        CrossEncoder,
        CrossEncoderTrainer,
        CrossEncoderTrainingArguments,
    )
    from sentence_transformers.cross_encoder.evaluation import CrossEncoderRerankingEvaluator
    from sentence_transformers.cross_encoder.losses import BinaryCrossEntropyLoss
    from transformers import set_seed

    set_seed(config.seed)  # the fresh head's initial weights
    dtype = pick_dtype(config.dtype, device)
    model = CrossEncoder(
        resolve_model_path(config.base_model),
        num_labels=1,
        max_length=config.max_tokens,
        device=device,
    )
    pairs = Dataset.from_dict(_pairs(examples))
    positives = sum(len(e.positives) for e in examples)
    negatives = sum(len(e.negatives) for e in examples)
    # Weighting positives by the class ratio keeps the loss from favouring "never relevant".
    loss = BinaryCrossEntropyLoss(
        model, pos_weight=torch.tensor(max(1.0, negatives / max(1, positives)))
    )
    evaluator = (
        CrossEncoderRerankingEvaluator(
            dev_samples, at_k=10, always_rerank_positives=False, name="dev", write_csv=False
        )
        if dev_samples
        else None
    )
    with tempfile.TemporaryDirectory(prefix="reranker-checkpoints-") as checkpoints:
        args = _training_arguments(
            CrossEncoderTrainingArguments, config, dtype, device, checkpoints, evaluator
        )
        trainer = CrossEncoderTrainer(
            model=model, args=args, train_dataset=pairs, loss=loss, evaluator=evaluator
        )
        trainer.train()
        # The trainer's model: with a dev set, the checkpoint that scored best on it.
        _save_atomically(trainer.model, out_dir)


def _training_arguments(
    arguments_class: Any,
    config: TrainingConfig,
    dtype: str,
    device: str,
    output_dir: str,
    evaluator: Any,
) -> Any:
    per_epoch = "epoch" if evaluator is not None else "no"
    return arguments_class(
        output_dir=output_dir,
        num_train_epochs=config.epochs,
        per_device_train_batch_size=config.batch_size,
        learning_rate=config.learning_rate,
        warmup_steps=config.warmup_fraction,
        bf16=dtype == "bfloat16",
        use_cpu=device == "cpu",
        seed=config.seed,
        eval_strategy=per_epoch,
        save_strategy=per_epoch,
        save_total_limit=1,
        load_best_model_at_end=evaluator is not None,
        # The evaluator's metrics, prefixed with its name ("dev") and then by the trainer.
        metric_for_best_model="eval_dev_ndcg@10" if evaluator is not None else None,
        logging_steps=20,
        report_to="none",
        dataloader_num_workers=0,
    )


def _save_atomically(model: Any, out_dir: Path) -> None:
    staging = out_dir.with_name(f".{out_dir.name}.building-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    staging.parent.mkdir(parents=True, exist_ok=True)
    model.save(str(staging))
    if out_dir.exists():
        shutil.rmtree(out_dir)
    staging.rename(out_dir)


def _rerank_all(
    model_dir: Path, config: TrainingConfig, judgments: Sequence[Judgment], candidates: Candidates
) -> tuple[dict[str, list[str]], list[float]]:
    """Doc rankings after reranking each query's candidates, and each call's latency in ms."""
    # As the service will run it: its default passage length and dtype.
    reranker: BuiltinReranker | CrossEncoderReranker
    if config.builtin:
        reranker = BuiltinReranker(RerankerConfig(), adapter=model_dir / ADAPTER_FILE)
    else:
        reranker = CrossEncoderReranker(str(model_dir), RerankerConfig(model=str(model_dir)))
    reranker.warm_up()
    rankings, latencies_ms = {}, []
    for judgment in judgments:
        retrieved = candidates.get(judgment.query_id, [])
        started_s = time.perf_counter()
        reranked = reranker.rerank(RerankRequest(judgment.query, retrieved, len(retrieved)))
        latencies_ms.append((time.perf_counter() - started_s) * 1000.0)
        rankings[judgment.query_id] = doc_ranking(reranked)
    return rankings, latencies_ms


@dataclass(frozen=True, slots=True)
class _Mined:
    source: Source
    split: JudgmentSplit
    candidates: dict[str, list[ScoredPassage]]
    examples: list[MinedExample]


def _mine(source: Source, config: TrainingConfig) -> _Mined:
    split = split_judgments(source.judgments, config)
    if not split.train or not split.held_out:
        raise RetrievalError(
            f"{source.index_dir}: need training and held-out queries, got {len(split.train)} "
            f"and {len(split.held_out)} from {len(source.judgments)} judgments"
        )
    retriever = open_retriever(source.index_dir)
    try:
        candidates = retrieve_candidates(
            retriever, split.train + split.dev + split.held_out, config.candidates
        )
        firsts = first_passages(retriever.index.dense)
    finally:
        retriever.close()
    examples = mine_examples(split.train, candidates, firsts, config.negatives_per_query)
    logger.info(
        "reranker examples mined index=%s train=%d examples=%d",
        source.index_dir,
        len(split.train),
        len(examples),
    )
    return _Mined(source, split, candidates, examples)


def train_reranker(
    sources: Sequence[Source], config: TrainingConfig, out_dir: Path
) -> TrainingReport:
    """Mine each source, train on all of them, save to `out_dir`, and measure on each source's
    held-out queries."""
    started_s = time.monotonic()
    mined = [_mine(source, config) for source in sources]
    examples = [e for m in mined for e in m.examples]
    device = pick_device("auto")
    train_started_s = time.monotonic()
    rank_priors: dict[float, float] = {}
    if config.builtin:
        train_s = fit_builtin(examples, config, out_dir)
        rank_priors = choose_rank_prior(
            out_dir / ADAPTER_FILE, [(m.split.dev, m.candidates) for m in mined]
        )
    else:
        dev = [s for m in mined for s in _dev_samples(m.split.dev, m.candidates)]
        _fit(examples, dev, config, device, out_dir)
        train_s = time.monotonic() - train_started_s
    reports: list[SourceReport] = []
    before: dict[str, list[str]] = {}
    after: dict[str, list[str]] = {}
    qrels: dict[str, dict[str, int]] = {}
    latencies_ms: list[float] = []
    for number, m in enumerate(mined):
        held_out = m.split.held_out
        source_qrels = binary_qrels({j.query_id: j.relevant_doc_ids for j in held_out})
        source_before = {j.query_id: doc_ranking(m.candidates[j.query_id]) for j in held_out}
        source_after, latencies = _rerank_all(out_dir, config, held_out, m.candidates)
        latencies_ms += latencies
        reports.append(
            SourceReport(
                str(m.source.index_dir),
                len(m.split.train),
                len(held_out),
                score_rankings(source_before, source_qrels),
                score_rankings(source_after, source_qrels),
            )
        )
        # Pooled under ids that cannot collide across sources.
        for pooled, rankings in ((before, source_before), (after, source_after)):
            pooled.update({f"{number}:{q}": r for q, r in rankings.items()})
        qrels.update({f"{number}:{q}": r for q, r in source_qrels.items()})
    report = TrainingReport(
        model_dir=str(out_dir),
        kind="builtin" if config.builtin else "full",
        train_queries=sum(len(m.split.train) for m in mined),
        dev_queries=sum(len(m.split.dev) for m in mined),
        held_out_queries=sum(len(m.split.held_out) for m in mined),
        train_pairs=sum(len(e.positives) + len(e.negatives) for e in examples),
        candidates=config.candidates,
        train_dtype="float32" if config.builtin else pick_dtype(config.dtype, device),
        rerank_dtype=pick_dtype(
            RerankerConfig().dtype,
            device,
            "onnx" if config.builtin and device == "cpu" else "torch",
        ),
        train_s=train_s,
        total_s=time.monotonic() - started_s,
        before=score_rankings(before, qrels),
        after=score_rankings(after, qrels),
        rerank_ms_median=statistics.median(latencies_ms),
        train_query_ids=tuple(j.query_id for m in mined for j in m.split.train),
        held_out_query_ids=tuple(j.query_id for m in mined for j in m.split.held_out),
        sources=tuple(reports),
        dev_ndcg_by_rank_prior={str(k): round(v, 4) for k, v in rank_priors.items()},
        config=config,
    )
    logger.info(
        "reranker trained dir=%s train_queries=%d held_out=%d ndcg_before=%.4f ndcg_after=%.4f",
        out_dir,
        report.train_queries,
        report.held_out_queries,
        report.before.ndcg,
        report.after.ndcg,
    )
    return report
