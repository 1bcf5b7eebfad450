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
import math
import shutil
from pathlib import Path
from typing import Any

import pytest

from answer_service.cli.reranker import add_reranker_commands
from retrieval.embedder import EmbedderConfig, SentenceTransformerEmbedder
from retrieval.index.builder import build_index
from retrieval.passage import Passage, ScoredPassage
from retrieval.rerank.base import RerankerConfig, RerankRequest
from retrieval.rerank.builtin import ADAPTER_FILE, BuiltinReranker
from retrieval.rerank.builtin_training import RANK_PRIORS, choose_rank_prior
from retrieval.rerank.cross_encoder import CrossEncoderReranker
from retrieval.rerank.training import REPORT_FILE
from retrieval.rerank.training_data import Judgment
from retrieval.sentences.reader_adapter import read_adapter
from tests.scifact import Subset, load_subset

READER_ADAPTER = Path(__file__).resolve().parents[2] / "retrieval" / "sentences" / "reader.npz"

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
def source(subset: Subset, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """The subset indexed, and the `reranker train` options that name it with its judgments."""
    tmp = tmp_path_factory.mktemp("reranker-training")
    corpus, queries, qrels = _write_beir(subset, tmp)
    build_index(
        corpus, tmp / "index", SentenceTransformerEmbedder(EmbedderConfig()), progress=False
    )
    return tmp, ["--index", str(tmp / "index"), "--queries", str(queries), "--qrels", str(qrels)]


def _train(*options: str) -> None:
    parser = argparse.ArgumentParser()
    add_reranker_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["reranker", "train", *options])
    assert args.run(args) == 0


@pytest.fixture(scope="module")
def trained(source: tuple[Path, list[str]]) -> tuple[Path, Any]:
    tmp, index = source
    budget = ["--epochs", "1", "--max-train-queries", "10", "--candidates", "8"]
    _train(*index, *budget, "--negatives", "3", "--max-tokens", "128")
    model_dir = tmp / "index" / "reranker"
    return model_dir, json.loads((model_dir / REPORT_FILE).read_text())


def _ranks_three_of_four(reranker: BuiltinReranker | CrossEncoderReranker) -> None:
    candidates = [
        ScoredPassage(Passage(f"d{i}#0", f"d{i}", 0, f"T{i}", f"text {i}", 0, 6), 0.0)
        for i in range(4)
    ]
    top = reranker.rerank(RerankRequest("a claim", candidates, 3))
    assert len(top) == 3
    assert [p.score for p in top] == sorted((p.score for p in top), reverse=True)


def test_saved_model_loads_and_reranks(trained: tuple[Path, Any]) -> None:
    model_dir, _ = trained
    reranker = CrossEncoderReranker(str(model_dir), RerankerConfig(max_tokens=128))
    reranker.warm_up()
    _ranks_three_of_four(reranker)


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
def builtin_runs(source: tuple[Path, list[str]]) -> tuple[Path, Any, Any]:
    """`--builtin` twice into one folder, starting from the sentence reader's adapter: the second
    run finds the first's finished checkpoint."""
    tmp, index = source
    budget = ["--max-train-queries", "8", "--candidates", "6", "--negatives", "3"]
    budget += ["--start-from", str(READER_ADAPTER)]
    out = tmp / "builtin"
    reports = []
    for _ in range(2):
        _train("--builtin", *index, *budget, "--out", str(out))
        reports.append(json.loads((out / REPORT_FILE).read_text()))
    return out, reports[0], reports[1]


def test_builtin_training_writes_an_adapter_the_builtin_reranker_serves(
    builtin_runs: tuple[Path, Any, Any],
) -> None:
    out, report, _ = builtin_runs
    assert report["kind"] == "builtin"
    assert report["config"]["start_from"] == str(READER_ADAPTER)
    assert report["train_pairs"] > report["train_queries"] > 0
    [measured] = report["sources"]
    assert measured["held_out_queries"] == report["held_out_queries"] > 0
    reranker = BuiltinReranker(RerankerConfig(), adapter=out / ADAPTER_FILE)
    reranker.warm_up()
    _ranks_three_of_four(reranker)


def test_builtin_training_resumes_from_its_checkpoint(builtin_runs: tuple[Path, Any, Any]) -> None:
    """The second run trains no step again: its training time is the first's, carried over."""
    _, first, second = builtin_runs
    assert second["train_s"] == pytest.approx(first["train_s"], abs=1.0)
    assert second["train_query_ids"] == first["train_query_ids"]


def test_the_rank_prior_is_chosen_on_development_queries_and_kept_in_the_adapter(
    builtin_runs: tuple[Path, Any, Any], tmp_path: Path
) -> None:
    """The relevant candidate retrieved first but scored last by the model: a strong enough
    prior puts it first, and the smallest such prior is written into the metadata."""
    out, report, _ = builtin_runs
    assert set(report["dev_ndcg_by_rank_prior"]) <= {str(p) for p in RANK_PRIORS}
    adapter = tmp_path / ADAPTER_FILE
    shutil.copyfile(out / ADAPTER_FILE, adapter)
    texts = [
        ScoredPassage(Passage(f"d{i}#0", f"d{i}", 0, "T", f"text {i}", 0, 3), 0.0) for i in range(6)
    ]
    reranker = BuiltinReranker(RerankerConfig(), adapter=adapter)
    reranker.warm_up()
    logits = reranker.logits("a claim", texts)
    # The one the model likes least is retrieved first and is the relevant one: only the
    # prior can put it first.
    found = sorted(texts, key=lambda s: float(logits[texts.index(s)]))
    judgment = Judgment("q", "a claim", frozenset({found[0].passage.doc_id}))
    assert float(logits.max() - logits.min()) < max(RANK_PRIORS) * math.log(2)
    table = choose_rank_prior(adapter, [([judgment], {"q": found})])
    assert table[max(RANK_PRIORS)] == pytest.approx(1.0)
    meta, _ = read_adapter(adapter)
    assert meta.rank_prior == min(p for p in RANK_PRIORS if table[p] == table[max(RANK_PRIORS)])
    assert meta.rank_prior > 0.0
