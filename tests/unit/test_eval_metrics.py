"""The four retrieval measures of `answer-eval retrieval`, against hand-computed cases."""

from __future__ import annotations

import math

import pytest

from retrieval.relevance import score_run

QRELS = {"q1": {"a": 1, "b": 1, "x": 0}, "q2": {"c": 1}, "q3": {"z": 0}}


def test_hand_computed_values() -> None:
    rankings = {"q1": ["a", "x", "b"], "q2": ["d", "e", "c"]}
    scores = score_run(rankings, QRELS)
    # q1: relevant at ranks 1 and 3; q2: relevant at rank 3. q3 has no relevant document.
    dcg_q1 = 1 + 1 / math.log2(4)
    idcg_q1 = 1 + 1 / math.log2(3)
    ndcg_q2 = (1 / math.log2(4)) / 1
    assert scores["ndcg@10"] == pytest.approx((dcg_q1 / idcg_q1 + ndcg_q2) / 2)
    assert scores["mrr@10"] == pytest.approx((1 + 1 / 3) / 2)
    assert scores["recall@10"] == pytest.approx(1.0)
    assert scores["recall@100"] == pytest.approx(1.0)


def test_missing_queries_score_zero_and_cutoffs_apply() -> None:
    rankings = {"q1": [f"n{i}" for i in range(10)] + ["a", "b"]}
    scores = score_run(rankings, QRELS)
    assert scores["recall@10"] == 0.0
    assert scores["recall@100"] == pytest.approx(0.5)  # q1 finds both, q2 is missing
    assert scores["mrr@10"] == 0.0


def test_repeated_documents_keep_their_first_rank() -> None:
    assert score_run({"q2": ["c", "c", "d"]}, {"q2": {"c": 1}})["mrr@10"] == 1.0
