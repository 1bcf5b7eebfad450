"""`answer-eval retrieval`: rank every query with each retrieval mode, then score the runs.

Rankings are at document level (a document ranks where its best passage does) and come either
from the retrieval stage in-process or from a running service's `POST /v1/retrieve`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import httpx
from tqdm import tqdm

from budget import Deadline
from eval.lib.checkpoint import RunCheckpoint
from retrieval.judgments import Query
from retrieval.relevance import score_run
from retrieval.retriever import Retriever

_PER_QUERY_BUDGET_MS = 60_000


class RankingSource(Protocol):
    async def modes(self) -> tuple[str, ...]: ...

    async def rank(self, query: str, mode: str, depth: int) -> list[str]: ...


class InProcessRanking:
    def __init__(self, retriever: Retriever) -> None:
        self._retriever = retriever

    async def modes(self) -> tuple[str, ...]:
        return self._retriever.modes()

    async def rank(self, query: str, mode: str, depth: int) -> list[str]:
        deadline = Deadline.after_ms(_PER_QUERY_BUDGET_MS)
        found = await self._retriever.retrieve(query, depth, deadline, mode=mode)
        return list(dict.fromkeys(p.passage.doc_id for p in found.passages))


class HttpRanking:
    """A running service: `GET /v1/retrieve/modes` and `POST /v1/retrieve`, one at a time."""

    def __init__(self, http: httpx.AsyncClient, url: str) -> None:
        self._http = http
        self._url = url.rstrip("/")

    async def modes(self) -> tuple[str, ...]:
        response = await self._http.get(f"{self._url}/v1/retrieve/modes")
        response.raise_for_status()
        return tuple(response.json()["modes"])

    async def rank(self, query: str, mode: str, depth: int) -> list[str]:
        response = await self._http.post(
            f"{self._url}/v1/retrieve", json={"query": query, "top_k": depth, "mode": mode}
        )
        response.raise_for_status()
        passages = response.json()["passages"]
        return list(dict.fromkeys(p["doc_id"] for p in passages))


@dataclass(frozen=True, slots=True)
class RetrievalResult:
    metrics: dict[str, dict[str, float]]
    queries: int
    judged: int


async def evaluate_retrieval(
    source: RankingSource,
    queries: Sequence[Query],
    qrels: dict[str, dict[str, int]],
    checkpoint: RunCheckpoint,
    *,
    depth: int = 100,
    progress: bool = True,
) -> RetrievalResult:
    modes = await source.modes()
    judged = [q for q in queries if any(g > 0 for g in qrels.get(q.query_id, {}).values())]
    todo = [
        (mode, q) for mode in modes for q in judged if f"{mode}/{q.query_id}" not in checkpoint.done
    ]
    with tqdm(
        total=len(modes) * len(judged),
        initial=len(modes) * len(judged) - len(todo),
        unit="query",
        desc="retrieval",
        disable=not progress,
    ) as bar:
        for mode, query in todo:
            checkpoint.record(
                f"{mode}/{query.query_id}", await source.rank(query.text, mode, depth)
            )
            bar.update(1)
    metrics = {}
    for mode in modes:
        rankings = {q.query_id: checkpoint.done[f"{mode}/{q.query_id}"] for q in judged}
        metrics[mode] = score_run(rankings, {q.query_id: qrels[q.query_id] for q in judged})
    return RetrievalResult(metrics, len(queries), len(judged))
