"""A retriever: one opened index with its embedder, its search modes, an optional reranker and
the bounded thread pool their blocking work runs on. A request takes one retriever at its start
and uses it to its end, so an index swapped in meanwhile never mixes into an answer.

Its stages (`retrieval/stages.py`) are what the service's answers run, each through the
service's runner; `retrieve()` is the one entry point for everything else that wants the
passages of a query (the retrieve API, the warm-up's calibration, the eval tools): it embeds
where the mode needs a vector (or where asked) and searches, each stage run by the caller's
`run` (directly, or the service's runner).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from budget import Deadline
from budget.stage import StageRun, run_stage
from retrieval.embedder import Embedder, Vectors
from retrieval.errors import RetrievalError
from retrieval.index.ann import SearchDepth
from retrieval.index.loaded import LoadedIndex
from retrieval.index.vector_search import RowSet
from retrieval.passage import Passage, ScoredPassage
from retrieval.pool import StagePool
from retrieval.rerank.base import Reranker
from retrieval.search.base import SearchConfig, SearchRequest
from retrieval.search.filters import FilterTable, PassageFilter, allowed_lookup
from retrieval.search.modes import build_searchers
from retrieval.sentences.reader import Reader, ReadMix
from retrieval.sentences.scorer import ScorerWeights, SentenceScorer
from retrieval.sentences.span import ShortFinder
from retrieval.stages import (
    EmbedStage,
    ReadStage,
    RerankStage,
    SearchStage,
    SentenceStage,
    ShortAnswerStage,
)


@dataclass(frozen=True, slots=True)
class Found:
    """What `Retriever.retrieve` found, with the query's embedding where it made one."""

    passages: list[ScoredPassage]
    vector: Vectors | None
    embed_ms: float
    search_ms: float


class Retriever:
    def __init__(
        self,
        embedder: Embedder,
        index: LoadedIndex,
        *,
        search: SearchConfig | None = None,
        reranker: Reranker | None = None,
        pool: StagePool | None = None,
        scorer: ScorerWeights | None = None,
        reader: tuple[Reader, ReadMix] | None = None,
        filters: FilterTable | None = None,
        short: ShortFinder | None = None,
    ) -> None:
        self.embedder = embedder
        self.index = index
        self.search_config = search or SearchConfig()
        self.reranker = reranker
        self.scorer_weights = scorer or ScorerWeights.read()
        self._pool = pool or StagePool()
        self._searchers = build_searchers(index, self.search_config)
        # Row masks per collection and tag, for filtered searches (one pass over the passages).
        self.filters = filters or FilterTable(index.passage(row) for row in range(len(index)))
        self.embed = EmbedStage(embedder, self._pool)
        self.rerank = RerankStage(reranker, self._pool) if reranker is not None else None
        self.sentences = SentenceStage(
            SentenceScorer(index.sentences, self.scorer_weights, index.passage), index, self._pool
        )
        # The reader (warmed up) and how its scores join the scorer's; None: the scorer's order.
        self.reader = reader
        self.read = ReadStage(reader[0], reader[1], self._pool) if reader is not None else None
        # The span head (warmed up) that finds a quote's short answer; None: quotes alone.
        self.short = short
        self.short_answer = ShortAnswerStage(short, self._pool) if short is not None else None

    @classmethod
    def open(
        cls,
        directory: Path,
        embedder: Embedder,
        *,
        device: str = "auto",
        index_max_gpu_bytes: int | None = None,
        corpus_checksum: str | None = None,
        search: SearchConfig | None = None,
        scorer: ScorerWeights | None = None,
        reader: tuple[Reader, ReadMix] | None = None,
        short: ShortFinder | None = None,
        max_workers: int = 2,
    ) -> Retriever:
        """An index directory's retriever, checked against `embedder` (and the corpus, when
        given), with the query path warmed once. Blocking."""
        embedder.warm_up()
        index = LoadedIndex.open(
            directory,
            embedder=embedder.name,
            dimension=embedder.dimension,
            corpus_checksum=corpus_checksum,
            device=device,
            max_gpu_bytes=index_max_gpu_bytes,
        )
        index.dense.search(embedder.encode(["warm-up"]), 1)
        return cls(
            embedder,
            index,
            search=search,
            pool=StagePool(max_workers),
            scorer=scorer,
            reader=reader,
            short=short,
        )

    def with_reranker(self, reranker: Reranker | None) -> Retriever:
        """The same index, embedder and pool with another reranker (requests under way keep
        the retriever they started with)."""
        return Retriever(
            self.embedder,
            self.index,
            search=self.search_config,
            reranker=reranker,
            pool=self._pool,
            scorer=self.scorer_weights,
            reader=self.reader,
            filters=self.filters,
            short=self.short,
        )

    def modes(self) -> tuple[str, ...]:
        """The search modes this index can serve."""
        return tuple(self._searchers)

    def serving_mode(self, wanted: str) -> str:
        """`wanted` where this index serves it, else dense search (every index has vectors)."""
        return wanted if wanted in self._searchers else "dense"

    def allowed(self, passage_filter: PassageFilter | None) -> RowSet | None:
        """The rows `passage_filter` allows (None: all of them)."""
        return self.filters.rows(passage_filter)

    def passage_by_id(
        self, passage_id: str, passage_filter: PassageFilter | None = None
    ) -> Passage | None:
        """The passage with this id, if the index holds it and the filter allows it."""
        return allowed_lookup(self.index.passage_by_id, passage_filter)(passage_id)

    def search_stage(self, mode: str) -> SearchStage:
        searcher = self._searchers.get(mode)
        if searcher is None:
            raise RetrievalError(f"the index offers no {mode!r} search; it offers {self.modes()}")
        return SearchStage(searcher, self._pool, len(self.index))

    async def retrieve(
        self,
        query: str,
        k: int,
        deadline: Deadline,
        *,
        mode: str,
        depth: SearchDepth | None = None,
        vector: Vectors | None = None,
        embed: bool = False,
        run: StageRun = run_stage,
        passage_filter: PassageFilter | None = None,
    ) -> Found:
        """The top `k` passages for `query` in `mode`. `vector`: the query's embedding where
        the caller has it; `embed`: embed the query though the mode needs no vector (a caller
        that scores sentences with it); `passage_filter`: the top `k` of the passages it
        allows."""
        search = self.search_stage(mode)
        embed_ms = 0.0
        if vector is None and (embed or search.searcher.needs_vector):
            embedded = await run(self.embed, query, deadline)
            vector, embed_ms = embedded.value, embedded.elapsed_ms
        request = SearchRequest(query, vector, k, depth, self.allowed(passage_filter))
        found = await run(search, request, deadline)
        return Found(found.value, vector, embed_ms, found.elapsed_ms)

    def close(self) -> None:
        self._pool.close()
