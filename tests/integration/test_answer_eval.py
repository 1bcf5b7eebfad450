"""`answer-eval retrieval` end to end on a SciFact subset: in-process and against a running
service's /v1/retrieve (ready with the real tiny SGLang behind it), which must agree."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from eval.commands.main import main
from tests.integration.conftest import ServiceFactory
from tests.scifact import QRELS, load_subset

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    subset = load_subset(40, 160)
    tmp = tmp_path_factory.mktemp("eval")
    corpus = tmp / "corpus.jsonl"
    corpus.write_text(
        "".join(
            json.dumps({"_id": d.doc_id, "title": d.title, "text": d.text}) + "\n"
            for d in subset.documents
        )
    )
    queries = tmp / "queries.jsonl"
    queries.write_text(
        "".join(json.dumps({"_id": q, "text": t}) + "\n" for q, t in subset.queries.items())
    )
    return {
        "corpus": corpus,
        "queries": queries,
        "qrels": QRELS,
        "index": tmp / "index",
        "tmp": tmp,
    }


@pytest.mark.sglang
def test_in_process_then_over_http(dataset: dict[str, Path], tiny_service: ServiceFactory) -> None:
    out = dataset["tmp"] / "local.json"
    args = [
        "retrieval",
        "--corpus",
        str(dataset["corpus"]),
        "--queries",
        str(dataset["queries"]),
        "--qrels",
        str(dataset["qrels"]),
        "--index",
        str(dataset["index"]),
    ]
    assert main([*args, "--out", str(out)]) == 0
    local = json.loads(out.read_text())
    assert set(local["metrics"]) == {"dense", "lexical", "hybrid"}
    for metrics in local["metrics"].values():
        assert set(metrics) == {"ndcg@10", "recall@10", "recall@100", "mrr@10"}
        assert 0.5 < metrics["ndcg@10"] <= 1.0
        assert metrics["recall@10"] <= metrics["recall@100"]
    assert local["dataset"]["judged_queries"] == 40
    assert {"timestamp", "versions", "config"} <= set(local)
    assert "ir-measures" in local["versions"]
    assert not out.with_name("local.json.partial.jsonl").exists()

    with tiny_service(index_dir=dataset["index"]) as url:
        assert httpx.get(f"{url}/v1/retrieve/modes").json() == {
            "modes": ["dense", "lexical", "hybrid"]
        }
        bad = httpx.post(f"{url}/v1/retrieve", json={"query": "x", "top_k": 10_000})
        assert bad.status_code == 422
        remote_out = dataset["tmp"] / "remote.json"
        assert main([*args, "--url", url, "--out", str(remote_out)]) == 0
    remote = json.loads(remote_out.read_text())
    for mode, metrics in local["metrics"].items():
        for name, value in metrics.items():
            assert remote["metrics"][mode][name] == pytest.approx(value, abs=1e-6), (mode, name)


def test_an_index_of_another_corpus_is_refused(
    dataset: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    other = dataset["tmp"] / "other.jsonl"
    other.write_text(json.dumps({"_id": "x", "title": "", "text": "other words"}) + "\n")
    code = main(
        [
            "retrieval",
            "--corpus",
            str(other),
            "--queries",
            str(dataset["queries"]),
            "--qrels",
            str(dataset["qrels"]),
            "--index",
            str(dataset["index"]),
            "--out",
            str(dataset["tmp"] / "x.json"),
        ]
    )
    assert code == 2
    assert "built from corpus" in capsys.readouterr().err
