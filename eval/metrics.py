"""Ranking metrics through ir-measures (pytrec_eval underneath): the numbers trec_eval gives.

Runs are ranked document ids per query; ir-measures gets strictly decreasing scores so no tie
can reorder them. Means are over the judged queries (at least one relevant document); a
judged query missing from the run scores 0.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence

import ir_measures
from ir_measures import Measure

RETRIEVAL_MEASURES = {
    "ndcg@10": ir_measures.nDCG @ 10,
    "recall@10": ir_measures.R @ 10,
    "recall@100": ir_measures.R @ 100,
    "mrr@10": ir_measures.RR @ 10,
}


def score_run(
    rankings: Mapping[str, Sequence[str]],
    qrels: Mapping[str, Mapping[str, int]],
    measures: Mapping[str, Measure] = RETRIEVAL_MEASURES,
) -> dict[str, float]:
    judged = {q: dict(g) for q, g in qrels.items() if any(v > 0 for v in g.values())}
    if not judged:
        return dict.fromkeys(measures, 0.0)
    run = {
        query_id: {doc: float(len(ranked) - rank) for rank, doc in enumerate(dict.fromkeys(ranked))}
        for query_id, ranked in rankings.items()
        if query_id in judged and ranked
    }
    names = {measure: name for name, measure in measures.items()}
    per_query: dict[str, dict[str, float]] = {name: dict.fromkeys(judged, 0.0) for name in measures}
    for metric in ir_measures.iter_calc(list(measures.values()), judged, run):
        per_query[names[metric.measure]][metric.query_id] = float(metric.value)
    return {name: statistics.fmean(values.values()) for name, values in per_query.items()}
