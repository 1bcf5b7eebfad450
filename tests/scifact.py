"""A deterministic SciFact subset for retrieval tests: the first N train claims that have
qrels, every document relevant to one of them, then the first M other documents.

Built from the fixture in tests/fixtures/scifact/ (150 claims, their relevant documents and the
first 1,350 others), which gives the same subset as the whole data set for N <= 150, M <= 1,350."""

from __future__ import annotations

import csv
import json
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from retrieval.corpus import Document, read_corpus
from tests.support import FIXTURES, open_text

SCIFACT = FIXTURES / "scifact"
CORPUS = SCIFACT / "corpus.jsonl.gz"
QUERIES = SCIFACT / "queries.train.jsonl"
QRELS = SCIFACT / "qrels" / "train.tsv"


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
    with open_text(path) as lines:
        for line in lines:
            record = json.loads(line)
            if record["_id"] in qrels:
                queries[record["_id"]] = record["text"]
                if len(queries) == count:
                    break
    return queries


def load_subset(query_count: int, other_documents: int) -> Subset:
    all_qrels = _read_qrels(QRELS)
    queries = _first_queries(QUERIES, all_qrels, query_count)
    qrels = {query_id: all_qrels[query_id] for query_id in queries}
    relevant = set().union(*qrels.values())
    relevant_to_any = set().union(*all_qrels.values())
    documents: list[Document] = []
    others = spare = 0
    for document in read_corpus(CORPUS):
        spare += document.doc_id not in relevant_to_any
        if document.doc_id in relevant:
            documents.append(document)
        elif others < other_documents:
            documents.append(document)
            others += 1
    # Past the fixture's claims or its unjudged documents the subset would differ from the
    # whole data set's: derive a larger fixture instead (tests/fixtures/derive.py).
    if len(queries) < query_count or spare < other_documents:
        raise ValueError(
            f"load_subset({query_count}, {other_documents}) is larger than the fixture "
            f"({len(all_qrels)} claims, {spare} other documents)"
        )
    return Subset(documents, queries, qrels)
