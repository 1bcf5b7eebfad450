"""The retrieval part of an answer: the query's embedding (or the cached one), the search in
the configured mode, then the rerank the plan asked for, each a stage run by the `StageRunner`
under its slice. Embedding and search cannot be cut short and still give passages: they may run
to the end of the TTFT budget (at least the floor); a rerank that would overrun is cut to
retrieval order."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from answer_service.errors import ServiceError, StageTimeoutError
from answer_service.pipeline.events import StageTimings
from answer_service.pipeline.planning import RequestPlanning
from answer_service.pipeline.ports import EmbeddingStore
from answer_service.pipeline.prepared import PreparedAnswer
from answer_service.pipeline.stage_runner import StageRunner
from budget import Deadline
from budget.stage import StageResult
from retrieval.embedder import Vectors
from retrieval.errors import RetrievalError, RetrievalTimeoutError
from retrieval.index.ann import SearchDepth
from retrieval.passage import ScoredPassage
from retrieval.rerank.base import RerankRequest
from retrieval.retriever import Retriever
from retrieval.search.base import SearchRequest
from retrieval.sentences.scorer import ScoredSentence
from retrieval.stages import EmbedStage, ReadRequest, SentenceRequest


@dataclass(frozen=True, slots=True)
class RetrievalConfig:
    floor_ms: int
    mode: str
    depth: SearchDepth | None
    # Passages beyond the plan's handed on for the cache-aware layout's slack.
    slack: int


@dataclass(frozen=True, slots=True)
class Retrieved:
    passages: list[ScoredPassage]
    # The query's embedding.
    vector: Vectors | None
    timings: StageTimings
    degraded: tuple[str, ...] = ()
    # The sentences of the first top_k passages, most likely to answer first (after the
    # reader, where it read), and the scorer's own ranking (what abstention and the form
    # choice read: they were learned on it).
    sentences: list[ScoredSentence] = field(default_factory=list)
    first_pass: list[ScoredSentence] = field(default_factory=list)


class CachedEmbedStage:
    """The embed stage behind the query-embedding cache: a hit costs a lookup and teaches the
    planner nothing (work None); a miss embeds and stores the vector."""

    name = "embed"

    def __init__(self, inner: EmbedStage, store: EmbeddingStore) -> None:
        self._inner = inner
        self._store = store

    async def run(self, request: str, deadline: Deadline) -> StageResult[Vectors]:
        started_s = time.perf_counter()
        cached = await self._store.get(request)
        if cached is not None:
            elapsed_ms = (time.perf_counter() - started_s) * 1000.0
            return StageResult(cached, elapsed_ms, attributes={"embedding.cache_hit": True})
        result = await self._inner.run(request, deadline)
        self._store.put(request, result.value)
        attributes = {**result.attributes, "embedding.cache_hit": False}
        return StageResult(result.value, result.elapsed_ms, result.work, attributes=attributes)


class RetrievalSteps:
    def __init__(
        self,
        runner: StageRunner,
        planning: RequestPlanning,
        config: RetrievalConfig,
        embeddings: EmbeddingStore | None = None,
    ) -> None:
        self._runner = runner
        self._planning = planning
        self._config = config
        self._embeddings = embeddings

    async def run(
        self,
        retriever: Retriever,
        answer: PreparedAnswer,
        hard: Deadline,
        *,
        rerank: bool = True,
        read: bool = True,
    ) -> Retrieved:
        request = answer.request
        # The sources list the best top_k even when the prompt gets fewer: k costs little here.
        answer.plan = answer.plan.with_knobs(
            retrieve_k=max(answer.plan.knobs.retrieve_k, request.top_k)
        )
        slice_ms = max(answer.deadline.remaining_ms(), self._config.floor_ms)
        deadline = hard.slice_ms(slice_ms)
        search = retriever.search_stage(retriever.serving_mode(self._config.mode))
        try:
            vector = None
            embed_ms = 0.0
            if search.searcher.needs_vector:
                embedded = await self._runner.run(
                    self._embed_stage(retriever),
                    request.query,
                    deadline,
                    answer,
                    attributes={
                        "gen_ai.operation.name": "embeddings",
                        "gen_ai.request.model": retriever.embedder.name,
                    },
                )
                vector, embed_ms = embedded.value, embedded.elapsed_ms
            k = answer.plan.knobs.retrieve_k
            found = await self._runner.run(
                search,
                SearchRequest(request.query, vector, k, self._config.depth),
                deadline,
                answer,
                attributes={
                    "retrieval.index.type": retriever.index.manifest.index_type,
                    "retrieval.index.device": retriever.index.dense.device,
                    **_depth_attributes(self._config.depth),
                },
            )
            passages, rerank_ms = found.value, 0.0
            if rerank:
                passages, rerank_ms = await self._rerank(retriever, answer, passages, vector, hard)
            if vector is None:  # the mode needed none; the sentence scorer does
                vector = (
                    await self._runner.run(
                        self._embed_stage(retriever), request.query, deadline, answer
                    )
                ).value
            sentences = await self._runner.run(
                retriever.sentences,
                SentenceRequest(request.query, vector, passages[: request.top_k]),
                deadline,
                answer,
            )
            first_pass = ranked = sentences.value
            read_ms = 0.0
            if read and retriever.read is not None:
                # Reading is worth its time only inside the first token's budget (retrieval's
                # slice has a floor, so that sources come back even when the budget is spent).
                reread = await self._runner.run(
                    retriever.read,
                    ReadRequest(request.query, first_pass),
                    hard.slice_ms(answer.deadline.remaining_ms()),
                    answer,
                )
                ranked, read_ms = reread.value, reread.elapsed_ms
        except RetrievalTimeoutError as exc:
            raise StageTimeoutError(str(exc)) from exc
        except RetrievalError as exc:
            raise ServiceError(f"retrieval failed: {exc}") from exc
        timings = StageTimings(
            embed_ms=embed_ms,
            search_ms=found.elapsed_ms,
            rerank_ms=rerank_ms,
            sentences_ms=sentences.elapsed_ms,
            read_ms=read_ms,
        )
        degraded = tuple(cut.reason for cut in answer.plan.cuts if cut.stage in ("rerank", "read"))
        return Retrieved(passages, vector, timings, degraded, ranked, first_pass)

    def _embed_stage(self, retriever: Retriever) -> EmbedStage | CachedEmbedStage:
        if self._embeddings is None:
            return retriever.embed
        return CachedEmbedStage(retriever.embed, self._embeddings)

    def _wanted(self, answer: PreparedAnswer) -> int:
        """Passages retrieval hands on: top_k (the sources) or the plan's plus its slack."""
        return max(answer.request.top_k, answer.plan.knobs.passages + self._config.slack)

    async def _rerank(
        self,
        retriever: Retriever,
        answer: PreparedAnswer,
        candidates: list[ScoredPassage],
        vector: Vectors | None,
        hard: Deadline,
    ) -> tuple[list[ScoredPassage], float]:
        wanted = self._wanted(answer)
        depth = answer.plan.knobs.rerank_depth
        stage = retriever.rerank
        if stage is None or depth == 0:
            return candidates[:wanted], 0.0
        predicted = answer.plan.plan.predicted_ms
        rest_ms = predicted.rerank + predicted.prompt + predicted.first_token
        available_ms = self._planning.planner.available_ms(answer.deadline.remaining_ms())
        if answer.plan.planner and available_ms < rest_ms:
            reason = "retrieval overran its slice: no time left to rerank"
            answer.plan = answer.plan.cut("rerank", reason, 0)
            return candidates[:wanted], 0.0
        reranked = await self._runner.run(
            stage,
            RerankRequest(answer.request.query, candidates[:depth], wanted, vector),
            hard.slice_ms(answer.plan.slice_ms("rerank")),
            answer,
        )
        return reranked.value, reranked.elapsed_ms


def _depth_attributes(depth: SearchDepth | None) -> dict[str, int]:
    if depth is None:
        return {}
    attributes = {"retrieval.nprobe": depth.nprobe, "retrieval.ef_search": depth.ef_search}
    return {key: value for key, value in attributes.items() if value is not None}
