"""BM25 on a SciFact subset: a floor on recall@10 that a broken tokenizer or index would miss.

Subset (deterministic): the first 150 train claims, in file order, that have qrels; every
document relevant to one of them (117); then the first 1,350 other documents in corpus order.
Measured with `BM25Config()`: recall@10 = 0.865 (nDCG@10 0.760); without stemming 0.845. The
floor sits 0.05 below: a tokenizer or index that is broken scores far lower.
"""

from __future__ import annotations

import csv
import json
import statistics
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import pytest

from retrieval.bm25_index import BM25Config, BM25Index
from retrieval.corpus import Document, read_corpus
from tests.support import SHARED_DATA

pytestmark = pytest.mark.integration

SCIFACT = SHARED_DATA / "scifact"
QUERY_COUNT = 150
OTHER_DOCUMENTS = 1350
RECALL_AT_10_FLOOR = 0.815


@dataclass(frozen=True, slots=True)
class Subset:
    documents: list[Document]
    queries: dict[str, str]
    qrels: dict[str, set[str]]


def _read_qrels(path: Path) -> dict[str, set[str]]:
    qrels: dict[str, set[str]] = defaultdict(set)
    with path.open(encoding="utf-8", newline="") as rows:
        for row in csv.DictReader(rows, delimiter="\t"):
            if int(row["score"]) > 0:
                qrels[row["query-id"]].add(row["corpus-id"])
    return qrels


def _first_queries(path: Path, qrels: dict[str, set[str]], count: int) -> dict[str, str]:
    queries: dict[str, str] = {}
    with path.open(encoding="utf-8") as lines:
        for line in lines:
            record = json.loads(line)
            if record["_id"] in qrels:
                queries[record["_id"]] = record["text"]
                if len(queries) == count:
                    break
    return queries


@pytest.fixture(scope="module")
def subset() -> Subset:
    all_qrels = _read_qrels(SCIFACT / "qrels" / "train.tsv")
    queries = _first_queries(SCIFACT / "queries.train.jsonl", all_qrels, QUERY_COUNT)
    qrels = {query_id: all_qrels[query_id] for query_id in queries}
    relevant = set().union(*qrels.values())
    documents: list[Document] = []
    others = 0
    for document in read_corpus(SCIFACT / "corpus.jsonl"):
        if document.doc_id in relevant:
            documents.append(document)
        elif others < OTHER_DOCUMENTS:
            documents.append(document)
            others += 1
    return Subset(documents, queries, qrels)


def recall_at(index: BM25Index, subset: Subset, k: int) -> float:
    doc_ids = [document.doc_id for document in subset.documents]
    recalls = []
    for query_id, text in subset.queries.items():
        found = {doc_ids[row] for row, _ in index.search(text, k)}
        relevant = subset.qrels[query_id]
        recalls.append(len(found & relevant) / len(relevant))
    return statistics.fmean(recalls)


def test_bm25_recall_at_10_on_scifact_subset(subset: Subset, tmp_path: Path) -> None:
    assert len(subset.queries) == QUERY_COUNT
    assert all(
        any(document.doc_id in relevant for document in subset.documents)
        for relevant in subset.qrels.values()
    )
    texts = [f"{document.title}\n{document.text}" for document in subset.documents]
    BM25Index.build(texts, BM25Config()).save(tmp_path)
    index = BM25Index.load(tmp_path, passage_count=len(texts))
    recall = recall_at(index, subset, 10)
    assert recall >= RECALL_AT_10_FLOOR, f"BM25 recall@10 {recall:.3f} on the SciFact subset"
