"""The nDCG/MRR wrapper against values computed by hand (binary relevance, log2 discounts)."""

from __future__ import annotations

import math

import pytest

from retrieval.passage import Passage, ScoredPassage
from retrieval.relevance import binary_qrels, doc_ranking, score_rankings


def test_matches_hand_computed_ndcg_and_mrr() -> None:
    # q1: relevant at ranks 2 and 3 -> DCG 1/log2(3) + 1/log2(4), ideal 1 + 1/log2(3); RR 1/2.
    # q2: nothing relevant retrieved; q3: judged but absent from the run -> both score 0.
    # q4: not judged -> ignored.
    scores = score_rankings(
        {"q1": ["d2", "d1", "d3"], "q2": ["d5"], "q4": ["d1"]},
        binary_qrels({"q1": {"d1", "d3"}, "q2": {"d4"}, "q3": {"d9"}}),
    )
    q1_ndcg = (1 / math.log2(3) + 1 / math.log2(4)) / (1 + 1 / math.log2(3))
    assert q1_ndcg == pytest.approx(0.693426, abs=1e-6)
    assert scores.queries == 3
    assert scores.ndcg == pytest.approx(q1_ndcg / 3)
    assert scores.mrr == pytest.approx(0.5 / 3)


def test_perfect_ranking_scores_one() -> None:
    scores = score_rankings({"q": ["a", "b", "c"]}, binary_qrels({"q": {"a", "b"}}))
    assert scores.ndcg == pytest.approx(1.0)
    assert scores.mrr == pytest.approx(1.0)


def test_cut_off_at_k_and_repeated_ids_keep_their_first_rank() -> None:
    ranking = [f"n{i}" for i in range(10)] + ["rel"]
    late = score_rankings({"q": ranking}, binary_qrels({"q": {"rel"}}))
    assert (late.ndcg, late.mrr) == (0.0, 0.0)
    repeated = score_rankings({"q": ["x", "x", "rel"]}, binary_qrels({"q": {"rel"}}))
    assert repeated.mrr == pytest.approx(0.5)
    assert repeated.ndcg == pytest.approx(1 / math.log2(3))


def test_graded_relevance_and_no_judged_queries() -> None:
    # grades 2 at rank 2 and 1 at rank 1: DCG 1 + 2/log2(3), ideal 2 + 1/log2(3).
    graded = score_rankings({"q": ["a", "b"]}, {"q": {"a": 1, "b": 2}})
    assert graded.ndcg == pytest.approx((1 + 2 / math.log2(3)) / (2 + 1 / math.log2(3)))
    empty = score_rankings({"q": ["a"]}, {"q": {"a": 0}})
    assert (empty.queries, empty.ndcg, empty.mrr) == (0, 0.0, 0.0)


def test_doc_ranking_keeps_each_document_at_its_best_passage() -> None:
    def scored(passage_id: str) -> ScoredPassage:
        doc_id, position = passage_id.split("#")
        return ScoredPassage(Passage(passage_id, doc_id, int(position), "", "", 0, 0), 0.0)

    ranked = [scored(p) for p in ("b#1", "a#0", "b#0", "c#2", "a#1")]
    assert doc_ranking(ranked) == ["b", "a", "c"]
