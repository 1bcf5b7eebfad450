"""The `Reranker` contract (retrieval/rerank/base.py), for a cross-encoder of the real shape
and cost (untrained head: mechanics, not quality), the shipped builtin reranker and the fake."""

from __future__ import annotations

from pathlib import Path

import pytest

from retrieval.passage import Passage, ScoredPassage
from retrieval.rerank.base import Reranker, RerankerConfig, RerankRequest
from retrieval.rerank.factory import build_reranker
from tests.fakes.word_overlap_reranker import WordOverlapReranker


def _candidates(count: int) -> list[ScoredPassage]:
    return [
        ScoredPassage(
            Passage(f"d{i}#0", f"d{i}", 0, f"Title {i}", f"passage {i} about topic {i % 3}", 0, 9),
            1.0 - i / 100,
        )
        for i in range(count)
    ]


@pytest.fixture(scope="module", params=["cross_encoder", "builtin", "word_overlap"])
def reranker(request: pytest.FixtureRequest, fresh_cross_encoder: Path) -> Reranker:
    made: Reranker
    if request.param == "cross_encoder":
        made = build_reranker(RerankerConfig(model=str(fresh_cross_encoder), device="cpu"))
    elif request.param == "builtin":
        made = build_reranker(RerankerConfig(model="builtin", device="cpu"))
    else:
        made = WordOverlapReranker()
    made.warm_up()
    return made


def test_top_n_of_the_candidates_best_first(reranker: Reranker) -> None:
    candidates = _candidates(8)
    top = reranker.rerank(RerankRequest("topic 1 passage", candidates, 3))
    assert len(top) == 3
    assert {p.passage.passage_id for p in top} <= {c.passage.passage_id for c in candidates}
    assert len({p.passage.passage_id for p in top}) == 3
    scores = [p.score for p in top]
    assert scores == sorted(scores, reverse=True)


def test_the_same_request_gets_the_same_order(reranker: Reranker) -> None:
    request = RerankRequest("topic 2", _candidates(6), 6)
    first = [p.passage.passage_id for p in reranker.rerank(request)]
    assert [p.passage.passage_id for p in reranker.rerank(request)] == first


def test_no_candidates_no_passages(reranker: Reranker) -> None:
    assert reranker.rerank(RerankRequest("anything", [], 5)) == []


def test_top_n_beyond_the_candidates_gives_them_all(reranker: Reranker) -> None:
    assert len(reranker.rerank(RerankRequest("topic", _candidates(2), 10))) == 2
