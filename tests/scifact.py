"""A deterministic SciFact subset for retrieval tests: the first N train claims that have
qrels, every document relevant to one of them, then the first M other documents."""

from __future__ import annotations

import csv
import json
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from retrieval.corpus import Document, read_corpus
from tests.support import SHARED_DATA

SCIFACT = SHARED_DATA / "scifact"


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


def load_subset(query_count: int, other_documents: int) -> Subset:
    all_qrels = _read_qrels(SCIFACT / "qrels" / "train.tsv")
    queries = _first_queries(SCIFACT / "queries.train.jsonl", all_qrels, query_count)
    qrels = {query_id: all_qrels[query_id] for query_id in queries}
    relevant = set().union(*qrels.values())
    documents: list[Document] = []
    others = 0
    for document in read_corpus(SCIFACT / "corpus.jsonl"):
        if document.doc_id in relevant:
            documents.append(document)
        elif others < other_documents:
            documents.append(document)
            others += 1
    return Subset(documents, queries, qrels)
