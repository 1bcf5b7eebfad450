"""Quality curves on a tiny corpus through the real index build and retrieval stage (real faiss
and BM25), with the hash embedder and a word-overlap reranker standing in for the models."""

from __future__ import annotations

import itertools
import json

import pytest

from eval.calibrate.quality_curves import curves, measure
from eval.lib.questions import Question
from retrieval.index.builder import build_index
from retrieval.retriever import Retriever
from tests.fakes.hash_embedder import HashEmbedder
from tests.fakes.word_overlap_reranker import WordOverlapReranker

pytestmark = pytest.mark.integration

DOCUMENTS = {
    "volcano": "Mount Etna is an active volcano on the east coast of Sicily in Italy.",
    "river": "The Danube river flows through Vienna, Budapest and Belgrade to the Black Sea.",
    "bridge": "The Golden Gate bridge spans the strait between San Francisco and Marin.",
    "castle": "Edinburgh castle stands on Castle Rock above the old town of Edinburgh.",
    "desert": "The Atacama desert in Chile is among the driest places on Earth.",
    "glacier": "The Aletsch glacier is the largest glacier of the Alps, in Switzerland.",
}
QUESTIONS = [
    Question(
        "q-volcano", "Which active volcano is on the east coast of Sicily?", ("Etna",), "volcano"
    ),
    Question("q-river", "Which river flows through Vienna and Budapest?", ("Danube",), "river"),
    # Shares its words with the bridge passage; the gold passage is the castle's.
    Question(
        "q-misled", "Which bridge spans the strait to San Francisco?", ("Castle Rock",), "castle"
    ),
]


@pytest.fixture(scope="module")
def retriever(tmp_path_factory: pytest.TempPathFactory) -> Retriever:
    tmp = tmp_path_factory.mktemp("quality-curves")
    corpus = tmp / "corpus.jsonl"
    corpus.write_text(
        "".join(json.dumps({"_id": i, "title": "", "text": t}) + "\n" for i, t in DOCUMENTS.items())
    )
    embedder = HashEmbedder()
    build_index(corpus, tmp / "index", embedder, progress=False)
    return Retriever.open(tmp / "index", embedder).with_reranker(WordOverlapReranker())


async def test_curves_rise_with_n_and_a_first_gold_counts_at_one(retriever: Retriever) -> None:
    records = await measure(retriever, QUESTIONS, [0, 2, 6], candidates=6, progress=False)
    ranks = {r.question_id: r.by_depth for r in records}
    assert ranks["q-volcano"][0].gold_rank == 1
    assert ranks["q-volcano"][0].answer_rank == 1
    assert ranks["q-misled"][0].gold_rank not in (None, 1)

    by_depth = curves(records, [0, 2, 6], max_n=6)
    for curve in by_depth.values():
        for values in (curve.gold_in_top_n, curve.answer_in_top_n):
            assert len(values) == 6
            assert all(a <= b for a, b in itertools.pairwise(values))
            assert values[-1] == 1.0  # every gold passage is among the 6 candidates
        assert curve.gold_in_top_n[0] >= 1 / 3  # q-volcano's gold passage comes first
        assert curve.gold_in_top_n[0] < 1.0  # q-misled's does not
    assert by_depth[0].rerank_ms == {"mean": 0.0, "p50": 0.0, "p95": 0.0}
    assert by_depth[6].rerank_ms["mean"] > 0.0


async def test_only_questions_whose_gold_comes_first_count_at_one(retriever: Retriever) -> None:
    records = await measure(retriever, QUESTIONS[:1], [0], candidates=6, progress=False)
    assert curves(records, [0], max_n=3)[0].gold_in_top_n == [1.0, 1.0, 1.0]


async def test_passages_below_the_depth_keep_their_hybrid_order(retriever: Retriever) -> None:
    records = await measure(retriever, QUESTIONS, [0, 1], candidates=6, progress=False)
    for record in records:
        hybrid, reranked = record.by_depth[0], record.by_depth[1]
        # One reranked passage is the hybrid first passage, so the order does not change.
        assert (reranked.gold_rank, reranked.answer_rank) == (hybrid.gold_rank, hybrid.answer_rank)


async def test_depths_beyond_the_candidates_are_refused(retriever: Retriever) -> None:
    with pytest.raises(ValueError, match="rerank depths"):
        await measure(retriever, QUESTIONS, [0, 10], candidates=6, progress=False)


def test_an_empty_sample_gives_flat_zero_curves() -> None:
    assert curves([], [0], max_n=2)[0].gold_in_top_n == [0.0, 0.0]
