"""The retrieval stage: embed the query, search dense and lexical indexes and fuse them, then
rerank; each step within a deadline, on a bounded thread pool the stage owns."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, Literal, TypeVar

from budget import Deadline
from retrieval.embedder import Embedder, Vectors
from retrieval.errors import RetrievalError, RetrievalTimeoutError
from retrieval.index.ann import SearchDepth
from retrieval.index.bm25_index import BM25Index
from retrieval.index.faiss_index import FaissIndex
from retrieval.passage import ScoredPassage
from retrieval.rerank.cross_encoder import Reranker
from retrieval.search.fusion import FusionConfig, reciprocal_rank_fusion

T = TypeVar("T")
RetrievalMode = Literal["dense", "lexical", "hybrid"]


@dataclass(frozen=True, slots=True)
class Timed(Generic[T]):
    value: T
    elapsed_ms: float


@dataclass(frozen=True, slots=True)
class Reranked:
    """The passages to use, and why they are not the reranker's order when they are not."""

    passages: list[ScoredPassage]
    elapsed_ms: float
    degraded: str | None = None


class Retriever:
    """Owns a bounded thread pool; blocking model and faiss calls never touch the event loop.

    A call that overruns its deadline raises `RetrievalTimeoutError`; the thread finishes its
    work in the background (a running faiss or torch call cannot be interrupted), which is why
    the pool is bounded: overload queues here instead of multiplying threads.
    """

    def __init__(
        self,
        embedder: Embedder,
        index: FaissIndex,
        *,
        lexical: BM25Index | None = None,
        fusion: FusionConfig | None = None,
        fusion_depth: int = 50,
        reranker: Reranker | None = None,
        max_workers: int = 2,
    ) -> None:
        self.embedder = embedder
        self.index = index
        self.lexical = lexical
        self.fusion = fusion or FusionConfig()
        self.fusion_depth = fusion_depth
        self.reranker = reranker
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="retrieval")

    async def _run(self, stage: str, deadline: Deadline, call: Callable[[], T]) -> Timed[T]:
        started_s = time.perf_counter()
        future = asyncio.get_running_loop().run_in_executor(self._pool, call)
        try:
            value = await asyncio.wait_for(future, timeout=deadline.remaining_s())
        except TimeoutError as exc:
            raise RetrievalTimeoutError(
                f"{stage} did not finish within {deadline.budget_ms:.0f} ms"
            ) from exc
        return Timed(value, (time.perf_counter() - started_s) * 1000.0)

    async def embed_query(self, query: str, deadline: Deadline) -> Timed[Vectors]:
        return await self._run("embed", deadline, lambda: self.embedder.encode([query]))

    @classmethod
    def open(
        cls,
        directory: Path,
        embedder: Embedder,
        *,
        device: str = "auto",
        index_max_gpu_bytes: int | None = None,
        corpus_checksum: str | None = None,
        fusion: FusionConfig | None = None,
        max_workers: int = 2,
    ) -> Retriever:
        """An index directory's faiss index and (when built) BM25 index, checked against
        `embedder` (and the corpus, when given), with the query path warmed once. Blocking."""
        embedder.warm_up()
        index = FaissIndex.load(
            directory,
            embedder=embedder.name,
            dimension=embedder.dimension,
            corpus_checksum=corpus_checksum,
            device=device,
            max_gpu_bytes=index_max_gpu_bytes,
        )
        lexical = None
        if index.manifest.lexical_index == "bm25":
            lexical = BM25Index.load(directory, len(index))
        index.search(embedder.encode(["warm-up"]), 1)
        return cls(embedder, index, lexical=lexical, fusion=fusion, max_workers=max_workers)

    def modes(self) -> tuple[RetrievalMode, ...]:
        return ("dense", "lexical", "hybrid") if self.lexical is not None else ("dense",)

    async def search(
        self,
        query: str,
        vector: Vectors | None,
        k: int,
        deadline: Deadline,
        *,
        depth: SearchDepth | None = None,
        mode: RetrievalMode = "dense",
    ) -> Timed[list[ScoredPassage]]:
        """The top `k` passages by dense score, BM25 score, or their rank fusion."""
        if mode not in self.modes():
            raise RetrievalError(f"retrieval mode {mode!r} needs a lexical index")
        if mode != "lexical" and vector is None:
            raise RetrievalError(f"retrieval mode {mode!r} needs the query vector")
        return await self._run(
            "search", deadline, lambda: self._search(query, vector, k, depth, mode)
        )

    def _search(
        self,
        query: str,
        vector: Vectors | None,
        k: int,
        depth: SearchDepth | None,
        mode: RetrievalMode,
    ) -> list[ScoredPassage]:
        depth_k = k if mode != "hybrid" else max(k, self.fusion_depth)
        dense = self.index.search_rows(vector, depth_k, depth)[0] if vector is not None else []
        lexical = self.lexical.search(query, depth_k) if self.lexical and mode != "dense" else []
        if mode == "dense":
            hits = dense[:k]
        elif mode == "lexical":
            hits = lexical[:k]
        else:
            hits = reciprocal_rank_fusion(
                [[row for row, _ in dense], [row for row, _ in lexical]],
                k=self.fusion.rrf_k,
                weights=self.fusion.weights,
                limit=k,
            )
        return [ScoredPassage(self.index.passage(row), score) for row, score in hits]

    async def rerank(
        self, query: str, candidates: list[ScoredPassage], top_n: int, deadline: Deadline
    ) -> Reranked:
        """Reranked `top_n`; retrieval order (marked degraded) when the deadline runs out."""
        reranker = self.reranker
        if reranker is None:
            return Reranked(candidates[:top_n], 0.0)
        if deadline.expired:
            return Reranked(candidates[:top_n], 0.0, "rerank skipped: deadline already spent")
        started_s = time.perf_counter()
        try:
            timed = await self._run(
                "rerank", deadline, lambda: reranker.rerank(query, candidates, top_n)
            )
        except RetrievalTimeoutError:
            elapsed_ms = (time.perf_counter() - started_s) * 1000.0
            return Reranked(candidates[:top_n], elapsed_ms, "rerank timed out: retrieval order")
        return Reranked(timed.value, timed.elapsed_ms)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
