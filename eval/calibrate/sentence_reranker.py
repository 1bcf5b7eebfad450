"""The sentence scorer as a reranker, on SciFact: how passages reordered by their best sentences
rank the relevant abstracts, against hybrid order, and how often a quote comes from one.

    python -m eval.calibrate.sentence_reranker --out eval/results/sentence-reranker.json \\
        [--mix retrieval/rerank/sentence_mix.json] [--depth 50]

Reads ../shared/data/scifact. The corpus is indexed as the service indexes it; each train claim
of the committed split (eval/splits/scifact.json) is retrieved (hybrid, top `--depth`), its
candidates' sentences scored by the shipped scorer (trained on SQuAD, never on SciFact), and
each passage given `best x its best sentence + second x its second + rank / (1 + its place)`.
The mix is chosen on the scorer-training claims by nDCG@10 and measured on the evaluation
claims, whose relevant abstracts no training claim shares. It writes the mix the service loads
(`--mix`).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import logging
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from budget import Deadline
from eval.commands.main import index_of
from eval.lib.data import SCIFACT_DIR, Part, scifact_claims, shared
from eval.lib.results import write_result
from retrieval.embedder import EmbedderConfig, SentenceTransformerEmbedder
from retrieval.judgments import read_qrels, read_queries
from retrieval.passage import ScoredPassage
from retrieval.relevance import binary_qrels, doc_ranking, score_rankings
from retrieval.rerank.sentence import PassageMix, passage_scores
from retrieval.retriever import Retriever
from retrieval.sentences.quote import read_quote_config, select_quote
from retrieval.sentences.scorer import (
    Candidate,
    ScoredSentence,
    ScorerWeights,
    SentenceModel,
    candidates,
    feature_matrix,
)

MIX = Path(__file__).resolve().parents[2] / "retrieval" / "rerank" / "sentence_mix.json"


@dataclass(frozen=True, slots=True)
class Claim:
    claim_id: str
    # The retrieved passages in hybrid order, their sentences and the scorer's scores.
    passages: list[ScoredPassage]
    found: list[Candidate]
    scores: npt.NDArray[np.float64]


async def claims_of(
    retriever: Retriever,
    texts: dict[str, str],
    ids: Sequence[str],
    depth: int,
    model: SentenceModel,
) -> list[Claim]:
    store = retriever.index.sentences
    out = []
    for claim_id in ids:
        deadline = Deadline.after_ms(60_000)
        retrieved = await retriever.retrieve(
            texts[claim_id], depth, deadline, mode="hybrid", embed=True
        )
        hits, vector = retrieved.passages, retrieved.vector
        assert vector is not None
        rows = [(retriever.index.row_of(h.passage.passage_id), h.passage) for h in hits]
        found = candidates(store, rows, retriever.index.passage)
        features = feature_matrix(texts[claim_id], vector, found, store)
        scores = model.scores(features) if found else np.zeros(0)
        out.append(Claim(claim_id, hits, found, scores))
    return out


def ndcg(
    claims: Sequence[Claim],
    qrels: dict[str, set[str]],
    mix: PassageMix | None,
) -> float:
    rankings = {}
    for claim in claims:
        passages = claim.passages
        if mix is not None:
            mixed = np.asarray(passage_scores(claim.found, claim.scores, len(passages), mix))
            passages = [passages[i] for i in sorted(range(len(passages)), key=lambda i: -mixed[i])]
        rankings[claim.claim_id] = doc_ranking(passages)
    judged = {c.claim_id: qrels[c.claim_id] for c in claims}
    return round(score_rankings(rankings, binary_qrels(judged)).ndcg, 4)


def quotes_from_relevant(claims: Sequence[Claim], qrels: dict[str, set[str]], top_k: int) -> float:
    """The share of quotes (of claims that get one) taken from a relevant abstract."""
    config = read_quote_config()
    hits, quoted = 0, 0
    for claim in claims:
        top = [c for c in claim.found if c.rank < top_k]
        order = np.argsort(-claim.scores[: len(top)], kind="stable")
        ranked = [ScoredSentence(top[i], 1.0) for i in order]
        quote = select_quote(ranked, config)
        if quote:
            quoted += 1
            hits += quote[0].passage.doc_id in qrels[claim.claim_id]
    return round(hits / quoted, 4) if quoted else 0.0


@dataclass(frozen=True, slots=True)
class SciFactClaims:
    """The train claims of some parts of the split, retrieved, with their relevant abstracts
    (by claim id)."""

    qrels: dict[str, set[str]]
    parts: dict[Part, list[Claim]]


async def retrieve_claims(parts: Sequence[Part], depth: int) -> SciFactClaims:
    """Index SciFact as the service does (cached), retrieve each judged claim of `parts` (hybrid,
    top `depth`) and score its passages' sentences by the shipped scorer."""
    corpus = shared(SCIFACT_DIR / "corpus.jsonl")
    texts = {q.query_id: q.text for q in read_queries(shared(SCIFACT_DIR / "queries.train.jsonl"))}
    qrels_all = read_qrels(shared(SCIFACT_DIR / "qrels" / "train.tsv"))
    qrels = {k: {d for d, grade in v.items() if grade > 0} for k, v in qrels_all.items()}
    embedder = SentenceTransformerEmbedder(EmbedderConfig())
    index = await asyncio.to_thread(index_of, corpus, None, embedder)
    retriever = await asyncio.to_thread(Retriever.open, index, embedder)
    model = SentenceModel(ScorerWeights.read())
    retrieved: dict[Part, list[Claim]] = {}
    try:
        for part in parts:
            ids = sorted((c for c in scifact_claims(part) if c in qrels), key=int)
            retrieved[part] = await claims_of(retriever, texts, ids, depth, model)
    finally:
        retriever.close()
    return SciFactClaims(qrels, retrieved)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    retrieved = await retrieve_claims(("scorer_training", "evaluation"), args.depth)
    qrels, parts = retrieved.qrels, retrieved.parts
    grid = [
        PassageMix(1.0, second, rank)
        for second, rank in itertools.product((0.0, 0.25, 0.5), (0.0, 0.5, 1.0, 2.0, 4.0, 8.0))
    ]
    train, test = parts["scorer_training"], parts["evaluation"]
    best = max(grid, key=lambda mix: ndcg(train, qrels, mix))
    return {
        "mix": best,
        "metrics": {
            "training": {
                "claims": len(train),
                "ndcg@10_hybrid": ndcg(train, qrels, None),
                "ndcg@10_sentence": ndcg(train, qrels, best),
            },
            "evaluation": {
                "claims": len(test),
                "ndcg@10_hybrid": ndcg(test, qrels, None),
                "ndcg@10_sentence": ndcg(test, qrels, best),
                "ndcg@10_best_sentence_only": ndcg(test, qrels, PassageMix(1.0, 0.0, 0.0)),
                "quotes_from_relevant_abstract": quotes_from_relevant(test, qrels, 5),
            },
            "mix": asdict(best),
        },
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m eval.calibrate.sentence_reranker")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--mix", type=Path, default=MIX, help="the file the service loads")
    parser.add_argument("--depth", type=int, default=50, help="candidates reranked per claim")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    result = asyncio.run(run(args))
    mix = {
        "mix": asdict(result["mix"]),
        "measured_by": "python -m eval.calibrate.sentence_reranker",
    }
    args.mix.write_text(json.dumps(mix, indent=1) + "\n", encoding="utf-8")
    write_result(
        args.out,
        "calibrate-sentence-reranker",
        {"depth": args.depth, "split": "eval/splits/scifact.json"},
        {"corpus": "scifact", "claims": "train claims with qrels, by part"},
        result["metrics"],
    )
    print(json.dumps(result["metrics"], indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
