"""`answer-service reranker train` end to end on a small SciFact subset: the real MiniLM index,
hard negatives mined by the hybrid retriever, sentence-transformers' trainer (and, with
`--builtin`, the adapters' own loop) for a tiny budget.

Mechanics only (a handful of queries, one epoch): the saved folder loads as a reranker, the
held-out queries are disjoint from the training ones, and the report measures both orders.
Quality is measured on the full SciFact train set, not here.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from answer_service.cli.reranker import add_reranker_commands
from retrieval.embedder import EmbedderConfig, SentenceTransformerEmbedder
from retrieval.index.builder import build_index
from retrieval.passage import Passage, ScoredPassage
from retrieval.rerank.base import RerankerConfig, RerankRequest
from retrieval.rerank.builtin import ADAPTER_FILE, BuiltinReranker
from retrieval.rerank.cross_encoder import CrossEncoderReranker
from retrieval.rerank.training import REPORT_FILE
from tests.scifact import Subset, load_subset

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def subset() -> Subset:
    return load_subset(30, 60)


def _write_beir(subset: Subset, directory: Path) -> tuple[Path, Path, Path]:
    corpus, queries, qrels = (
        directory / "corpus.jsonl",
        directory / "queries.jsonl",
        directory / "qrels.tsv",
    )
    with corpus.open("w") as out:
        for d in subset.documents:
            out.write(json.dumps({"_id": d.doc_id, "title": d.title, "text": d.text}) + "\n")
    with queries.open("w") as out:
        for query_id, text in subset.queries.items():
            out.write(json.dumps({"_id": query_id, "text": text}) + "\n")
    with qrels.open("w") as out:
        out.write("query-id\tcorpus-id\tscore\n")
        for query_id, doc_ids in subset.qrels.items():
            out.writelines(f"{query_id}\t{doc_id}\t1\n" for doc_id in sorted(doc_ids))
    return corpus, queries, qrels


@pytest.fixture(scope="module")
def trained(subset: Subset, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    tmp = tmp_path_factory.mktemp("reranker-training")
    corpus, queries, qrels = _write_beir(subset, tmp)
    build_index(
        corpus, tmp / "index", SentenceTransformerEmbedder(EmbedderConfig()), progress=False
    )
    parser = argparse.ArgumentParser()
    add_reranker_commands(parser.add_subparsers(dest="command", required=True))
    index = ["--index", str(tmp / "index"), "--queries", str(queries), "--qrels", str(qrels)]
    budget = ["--epochs", "1", "--max-train-queries", "10", "--candidates", "8"]
    args = parser.parse_args(
        ["reranker", "train", *index, *budget, "--negatives", "3", "--max-tokens", "128"]
    )
    assert args.run(args) == 0
    model_dir = tmp / "index" / "reranker"
    return model_dir, json.loads((model_dir / REPORT_FILE).read_text())


def test_saved_model_loads_and_reranks(trained: tuple[Path, Any]) -> None:
    model_dir, _ = trained
    reranker = CrossEncoderReranker(str(model_dir), RerankerConfig(max_tokens=128))
    reranker.warm_up()
    candidates = [
        ScoredPassage(Passage(f"d{i}#0", f"d{i}", 0, f"T{i}", f"text {i}", 0, 6), 0.0)
        for i in range(4)
    ]
    top = reranker.rerank(RerankRequest("a claim", candidates, 3))
    assert len(top) == 3
    assert [p.score for p in top] == sorted((p.score for p in top), reverse=True)


def test_held_out_queries_are_never_trained_on(trained: tuple[Path, Any], subset: Subset) -> None:
    _, report = trained
    train, held_out = set(report["train_query_ids"]), set(report["held_out_query_ids"])
    assert train
    assert held_out
    assert not train & held_out
    assert train | held_out <= set(subset.queries)
    assert report["train_queries"] == len(train) <= 10
    assert report["held_out_queries"] == len(held_out)


def test_report_measures_retrieval_order_and_reranked_order(trained: tuple[Path, Any]) -> None:
    _, report = trained
    for side in ("before", "after"):
        scores = report[side]
        assert scores["queries"] == report["held_out_queries"]
        assert 0.0 <= scores["ndcg"] <= 1.0
        assert 0.0 <= scores["mrr"] <= 1.0
    assert report["before"]["ndcg"] > 0.0, "the hybrid retriever finds relevant documents"
    assert report["train_pairs"] > report["train_queries"]
    assert report["rerank_ms_median"] > 0.0


@pytest.fixture(scope="module")
def builtin_runs(subset: Subset, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any, Any]:
    """`--builtin` twice into one folder: the second run finds the first's finished checkpoint."""
    tmp = tmp_path_factory.mktemp("builtin-reranker-training")
    corpus, queries, qrels = _write_beir(subset, tmp)
    build_index(
        corpus, tmp / "index", SentenceTransformerEmbedder(EmbedderConfig()), progress=False
    )
    parser = argparse.ArgumentParser()
    add_reranker_commands(parser.add_subparsers(dest="command", required=True))
    index = ["--index", str(tmp / "index"), "--queries", str(queries), "--qrels", str(qrels)]
    budget = ["--max-train-queries", "8", "--candidates", "6", "--negatives", "3"]
    out = tmp / "builtin"
    reports = []
    for _ in range(2):
        args = parser.parse_args(
            ["reranker", "train", "--builtin", *index, *budget, "--out", str(out)]
        )
        assert args.run(args) == 0
        reports.append(json.loads((out / REPORT_FILE).read_text()))
    return out, reports[0], reports[1]


def test_builtin_training_writes_an_adapter_the_builtin_reranker_serves(
    builtin_runs: tuple[Path, Any, Any],
) -> None:
    out, report, _ = builtin_runs
    assert report["kind"] == "builtin"
    assert report["train_pairs"] > report["train_queries"] > 0
    [source] = report["sources"]
    assert source["held_out_queries"] == report["held_out_queries"] > 0
    reranker = BuiltinReranker(RerankerConfig(), adapter=out / ADAPTER_FILE)
    reranker.warm_up()
    candidates = [
        ScoredPassage(Passage(f"d{i}#0", f"d{i}", 0, f"T{i}", f"text {i}", 0, 6), 0.0)
        for i in range(4)
    ]
    top = reranker.rerank(RerankRequest("a claim", candidates, 3))
    assert len(top) == 3
    assert [p.score for p in top] == sorted((p.score for p in top), reverse=True)


def test_builtin_training_resumes_from_its_checkpoint(builtin_runs: tuple[Path, Any, Any]) -> None:
    """The second run trains no step again: its training time is the first's, carried over."""
    _, first, second = builtin_runs
    assert second["train_s"] == pytest.approx(first["train_s"], abs=1.0)
    assert second["train_query_ids"] == first["train_query_ids"]
