"""The retrieval part of an answer: the query's embedding (or the cached one), the search in
the configured mode, the rerank the plan asked for, the sentences of what was found, and (once
a form that quotes them is chosen) their reading, each a stage run by the `StageRunner` under its slice, each returning the next plan. Embedding and search cannot be cut short and still give passages: they may run
to the end of the TTFT budget (at least the floor); a rerank that would overrun is cut to
retrieval order."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from answer_service.errors import ServiceError, StageTimeoutError
from answer_service.pipeline.events import AnswerRequest, Queries
from answer_service.pipeline.planning import RequestPlanning
from answer_service.pipeline.ports import EmbeddingStore
from answer_service.pipeline.stage_runner import StageRunner
from budget import Deadline
from budget.request_plan import RequestPlan
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
    # The searched query's embedding.
    vector: Vectors | None
    # The sentences of the first top_k passages, most likely to answer first (after the
    # reader, where it read), and the scorer's own ranking (what abstention and the form
    # choice read: they were learned on it).
    sentences: list[ScoredSentence] = field(default_factory=list)
    first_pass: list[ScoredSentence] = field(default_factory=list)
    # A follow-up's sentences scored for its searched query too (empty for a question alone):
    # its own words may say too little to show the evidence the carried words do.
    searched_pass: list[ScoredSentence] = field(default_factory=list)


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
        request: AnswerRequest,
        queries: Queries,
        plan: RequestPlan,
        deadline: Deadline,
        hard: Deadline,
        *,
        rerank: bool = True,
        on_passages: Callable[[list[ScoredPassage], RequestPlan], Awaitable[None]] | None = None,
    ) -> tuple[Retrieved, RequestPlan]:
        """What retrieval found for `request`, and the plan after it: embed, search and rerank
        take `queries.searched`, the sentences `queries.read` (the reader comes later, where
        the answer's form uses it: `read`). `on_passages` is told the passages and the plan as
        soon as the passages are final (after the rerank), and awaited before the sentences
        are scored (a prompt sent ahead reaches SGLang first). `deadline`: the
        first token's; `hard`: the point past which the request is given up on."""
        run = self._runner.run
        plan = plan.retrieving(request.top_k)
        slice_ms = max(deadline.remaining_ms(), self._config.floor_ms)
        retrieval = hard.slice_ms(slice_ms)
        search = retriever.search_stage(retriever.serving_mode(self._config.mode))
        try:
            vector = None
            if search.searcher.needs_vector:
                embedded, plan = await run(
                    self._embed_stage(retriever),
                    queries.searched,
                    retrieval,
                    plan,
                    attributes={
                        "gen_ai.operation.name": "embeddings",
                        "gen_ai.request.model": retriever.embedder.name,
                    },
                )
                vector = embedded.value
            found, plan = await run(
                search,
                SearchRequest(
                    queries.searched,
                    vector,
                    plan.knobs.retrieve_k,
                    self._config.depth,
                    retriever.allowed(request.passage_filter),
                ),
                retrieval,
                plan,
                attributes={
                    "retrieval.index.type": retriever.index.manifest.index_type,
                    "retrieval.index.device": retriever.index.dense.device,
                    **_depth_attributes(self._config.depth),
                },
            )
            passages = found.value
            if rerank:
                passages, plan = await self._rerank(
                    retriever, request, queries.searched, plan, passages, vector, deadline, hard
                )
            if on_passages is not None:
                await on_passages(passages, plan)
            if vector is None:  # the mode needed none; the sentence scorer does
                embedded, plan = await run(
                    self._embed_stage(retriever), queries.searched, retrieval, plan
                )
                vector = embedded.value
            read_vector = vector
            if queries.split:  # the scorer's cosines are to the words it reads
                embedded, plan = await run(
                    self._embed_stage(retriever), queries.read, retrieval, plan
                )
                read_vector = embedded.value
            sentences, plan = await run(
                retriever.sentences,
                SentenceRequest(queries.read, read_vector, passages[: request.top_k]),
                retrieval,
                plan,
            )
            first_pass = sentences.value
            searched_pass: list[ScoredSentence] = []
            if queries.split:
                scored, plan = await run(
                    retriever.sentences,
                    SentenceRequest(queries.searched, vector, passages[: request.top_k]),
                    retrieval,
                    plan,
                )
                searched_pass = scored.value
        except RetrievalTimeoutError as exc:
            raise StageTimeoutError(str(exc)) from exc
        except RetrievalError as exc:
            raise ServiceError(f"retrieval failed: {exc}") from exc
        return Retrieved(passages, vector, first_pass, first_pass, searched_pass), plan

    async def read(
        self,
        retriever: Retriever,
        query: str,
        retrieved: Retrieved,
        plan: RequestPlan,
        deadline: Deadline,
        hard: Deadline,
    ) -> tuple[Retrieved, RequestPlan]:
        """The reader's order of the sentences, for an answer made of them (a quote, focused
        excerpts): run only once such a form is chosen, so an answer over whole passages or an
        abstention never waits for it."""
        if retriever.read is None:
            return retrieved, plan
        try:
            # Reading is worth its time only inside the first token's budget (retrieval's
            # slice has a floor, so that sources come back even when the budget is spent).
            reread, plan = await self._runner.run(
                retriever.read,
                ReadRequest(query, retrieved.first_pass),
                hard.slice_ms(deadline.remaining_ms()),
                plan,
            )
        except RetrievalTimeoutError as exc:
            raise StageTimeoutError(str(exc)) from exc
        except RetrievalError as exc:
            raise ServiceError(f"retrieval failed: {exc}") from exc
        return dataclasses.replace(retrieved, sentences=reread.value), plan

    def _embed_stage(self, retriever: Retriever) -> EmbedStage | CachedEmbedStage:
        if self._embeddings is None:
            return retriever.embed
        return CachedEmbedStage(retriever.embed, self._embeddings)

    async def _rerank(
        self,
        retriever: Retriever,
        request: AnswerRequest,
        searched: str,
        plan: RequestPlan,
        candidates: list[ScoredPassage],
        vector: Vectors | None,
        deadline: Deadline,
        hard: Deadline,
    ) -> tuple[list[ScoredPassage], RequestPlan]:
        # Passages retrieval hands on: top_k (the sources) or the plan's plus its slack.
        wanted = max(request.top_k, plan.knobs.passages + self._config.slack)
        stage = retriever.rerank
        if stage is not None:
            plan = plan.before_rerank(self._planning.planner.available_ms(deadline.remaining_ms()))
        depth = plan.knobs.rerank_depth
        if stage is None or depth == 0:
            return candidates[:wanted], plan
        reranked, plan = await self._runner.run(
            stage,
            RerankRequest(searched, candidates[:depth], wanted, vector),
            hard.slice_ms(plan.slice_ms("rerank")),
            plan,
        )
        return reranked.value, plan


def _depth_attributes(depth: SearchDepth | None) -> dict[str, int]:
    if depth is None:
        return {}
    attributes = {"retrieval.nprobe": depth.nprobe, "retrieval.ef_search": depth.ef_search}
    return {key: value for key, value in attributes.items() if value is not None}
