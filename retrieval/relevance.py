"""Ranking quality against relevance judgments: nDCG@k and MRR@k through `ir-measures`
(pytrec_eval underneath), so the numbers are the ones trec_eval gives.

A run is given as ranked document ids per query, not as scores: only the order counts, and
ir-measures receives strictly decreasing scores so no tie can reorder it. The mean is taken
over every judged query (one with at least one relevant document); a judged query missing
from the run scores 0 (trec_eval's `-c`), and run queries without judgments are ignored.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import ir_measures
from ir_measures import Measure

from retrieval.passage import ScoredPassage

Rankings = Mapping[str, Sequence[str]]
"""Query id to document ids, best first."""

Qrels = Mapping[str, Mapping[str, int]]
"""Query id to {document id: graded relevance}; relevance > 0 is relevant."""


@dataclass(frozen=True, slots=True)
class RelevanceScores:
    ndcg: float
    mrr: float
    queries: int
    k: int = 10


def doc_ranking(passages: Iterable[ScoredPassage]) -> list[str]:
    """The documents of ranked passages, each at the rank of its best passage."""
    return list(dict.fromkeys(scored.passage.doc_id for scored in passages))


def binary_qrels(relevant: Mapping[str, Iterable[str]]) -> dict[str, dict[str, int]]:
    """{query id: relevant doc ids} as graded qrels with grade 1."""
    return {query_id: dict.fromkeys(doc_ids, 1) for query_id, doc_ids in relevant.items()}


def _rank_scores(ranked: Sequence[str]) -> dict[str, float]:
    """Strictly decreasing scores in rank order; a repeated id keeps its first rank."""
    unique = list(dict.fromkeys(ranked))
    return {doc_id: float(len(unique) - rank) for rank, doc_id in enumerate(unique)}


RETRIEVAL_MEASURES: dict[str, Measure] = {
    "ndcg@10": ir_measures.nDCG @ 10,
    "recall@10": ir_measures.R @ 10,
    "recall@100": ir_measures.R @ 100,
    "mrr@10": ir_measures.RR @ 10,
}


def score_run(
    rankings: Rankings, qrels: Qrels, measures: Mapping[str, Measure] = RETRIEVAL_MEASURES
) -> dict[str, float]:
    """Each named measure's mean over the judged queries (0 where a query is missing)."""
    judged = {
        query_id: dict(grades)
        for query_id, grades in qrels.items()
        if any(grade > 0 for grade in grades.values())
    }
    if not judged:
        return dict.fromkeys(measures, 0.0)
    run = {
        query_id: _rank_scores(ranked)
        for query_id, ranked in rankings.items()
        if query_id in judged and ranked
    }
    names = {measure: name for name, measure in measures.items()}
    per_query = {name: dict.fromkeys(judged, 0.0) for name in measures}
    for metric in ir_measures.iter_calc(list(measures.values()), judged, run):
        per_query[names[metric.measure]][metric.query_id] = float(metric.value)
    return {name: statistics.fmean(values.values()) for name, values in per_query.items()}


def score_rankings(rankings: Rankings, qrels: Qrels, k: int = 10) -> RelevanceScores:
    """Mean nDCG@k and MRR@k (RR@k in ir-measures' terms) over the judged queries."""
    judged = sum(any(grade > 0 for grade in grades.values()) for grades in qrels.values())
    scores = score_run(rankings, qrels, {"ndcg": ir_measures.nDCG @ k, "mrr": ir_measures.RR @ k})
    return RelevanceScores(scores["ndcg"], scores["mrr"], judged, k)
