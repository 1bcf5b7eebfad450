"""The retrieval stage of an answer: embed → search → rerank, each a span with its deadline
slice from the plan; a rerank that would overrun is cut to retrieval order."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

from opentelemetry.trace import Tracer

from answer_service.errors import ServiceError, StageTimeoutError
from answer_service.pipeline.events import AnswerRequest, Retrieved, StageTimings
from answer_service.pipeline.planning import PlanTracker, RequestPlanning, query_tokens
from answer_service.pipeline.values import depth_attributes
from answer_service.runtime.caches import EmbeddingCache
from budget import Deadline
from generation.prefix_order import PromptLayout
from retrieval.embedder import Vectors
from retrieval.errors import RetrievalError, RetrievalTimeoutError
from retrieval.index.ann import SearchDepth
from retrieval.passage import ScoredPassage
from retrieval.retriever import Reranked, RetrievalMode, Retriever, Timed


@dataclass(frozen=True, slots=True)
class RetrievalConfig:
    retrieval_floor_ms: int
    retrieval_mode: RetrievalMode
    search_depth: SearchDepth | None
    prompt_layout: PromptLayout
    cache_slack: int


class RetrievalStage:
    def __init__(
        self,
        retriever: Retriever,
        tracer: Tracer,
        config: RetrievalConfig,
        planning: RequestPlanning,
        embeddings: EmbeddingCache | None = None,
    ) -> None:
        self.retriever = retriever
        self.embeddings = embeddings
        self._tracer = tracer
        self._config = config
        self.planning = planning

    async def run(
        self, request: AnswerRequest, deadline: Deadline, hard: Deadline, tracker: PlanTracker
    ) -> Retrieved:
        # The sources list the best top_k even when the prompt gets fewer: k costs little here.
        tracker.knobs = knobs = dataclasses.replace(
            tracker.knobs, retrieve_k=max(tracker.knobs.retrieve_k, request.top_k)
        )
        # One index for the whole request, even if another is swapped in meanwhile.
        retriever = self.retriever
        mode = self._mode(retriever)
        # Embedding and search cannot be cut short and still give passages: they may run to
        # the end of the TTFT budget (at least the floor); what they overrun of their slice
        # comes out of the stages after them when those are re-planned.
        slice_ms = max(deadline.remaining_ms(), self._config.retrieval_floor_ms)
        retrieval_deadline = hard.slice_ms(slice_ms)
        try:
            vector = (
                await self._embed(retriever, request, retrieval_deadline)
                if mode != "lexical"
                else None
            )
            with self._tracer.start_as_current_span(
                "search",
                attributes={
                    "retrieval.mode": mode,
                    "retrieval.k": knobs.retrieve_k,
                    "retrieval.index.passages": len(retriever.index),
                    "retrieval.index.type": retriever.index.manifest.index_type,
                    "retrieval.index.device": retriever.index.device,
                    **depth_attributes(self._config.search_depth),
                    "answer.stage.budget_ms": retrieval_deadline.remaining_ms(),
                },
            ) as span:
                found = await retriever.search(
                    request.query,
                    vector.value if vector else None,
                    knobs.retrieve_k,
                    retrieval_deadline,
                    depth=self._config.search_depth,
                    mode=mode,
                )
                span.set_attribute("retrieval.results", len(found.value))
                span.set_attribute("answer.stage.elapsed_ms", found.elapsed_ms)
            embed_ms = vector.elapsed_ms if vector else 0.0
            self.planning.observe("search", knobs.retrieve_k, found.elapsed_ms)
            tracker.spent(embed=embed_ms, search=found.elapsed_ms)
            reranked = await self._rerank(retriever, request, found.value, deadline, hard, tracker)
        except RetrievalTimeoutError as exc:
            raise StageTimeoutError(str(exc)) from exc
        except RetrievalError as exc:
            raise ServiceError(f"retrieval failed: {exc}") from exc
        timings = StageTimings(embed_ms=embed_ms, search_ms=found.elapsed_ms)
        timings = dataclasses.replace(timings, rerank_ms=reranked.elapsed_ms)
        degraded = () if reranked.degraded is None else (reranked.degraded,)
        return Retrieved(reranked.passages, timings, degraded)

    def _mode(self, retriever: Retriever) -> RetrievalMode:
        """The configured mode where the index supports it, else dense."""
        modes = retriever.modes()
        return self._config.retrieval_mode if self._config.retrieval_mode in modes else "dense"

    async def _embed(
        self, retriever: Retriever, request: AnswerRequest, deadline: Deadline
    ) -> Timed[Vectors]:
        with self._tracer.start_as_current_span(
            "embed",
            attributes={
                "gen_ai.operation.name": "embeddings",
                "gen_ai.request.model": retriever.embedder.name,
                "answer.stage.budget_ms": deadline.remaining_ms(),
            },
        ) as span:
            started_s = time.perf_counter()
            cached = await self.embeddings.get(request.query) if self.embeddings else None
            span.set_attribute("embedding.cache_hit", cached is not None)
            if cached is not None:
                vector = Timed(cached, (time.perf_counter() - started_s) * 1000.0)
            else:
                vector = await retriever.embed_query(request.query, deadline)
                if self.embeddings is not None:
                    self.embeddings.put(request.query, vector.value)
                # The embed model learns what the embedder costs, not what a cache hit does.
                self.planning.observe("embed", query_tokens(request.query), vector.elapsed_ms)
            span.set_attribute("answer.stage.elapsed_ms", vector.elapsed_ms)
        return vector

    def _wanted(self, request: AnswerRequest, tracker: PlanTracker) -> int:
        """Passages retrieval hands on: top_k (the sources) or the plan's plus its slack."""
        slack = self._config.cache_slack if self._config.prompt_layout == "cache_aware" else 0
        return max(request.top_k, tracker.knobs.passages + slack)

    async def _rerank(
        self,
        retriever: Retriever,
        request: AnswerRequest,
        candidates: list[ScoredPassage],
        deadline: Deadline,
        hard: Deadline,
        tracker: PlanTracker,
    ) -> Reranked:
        reranker = retriever.reranker
        wanted = self._wanted(request, tracker)
        depth = tracker.knobs.rerank_depth
        if reranker is None or depth == 0:
            return Reranked(candidates[:wanted], 0.0)
        predicted = tracker.plan.predicted_ms
        rest_ms = predicted.rerank + predicted.prompt + predicted.first_token
        if (
            tracker.planner
            and self.planning.planner.available_ms(deadline.remaining_ms()) < rest_ms
        ):
            tracker.cut("rerank", "retrieval overran its slice: no time left to rerank", 0)
            return Reranked(candidates[:wanted], 0.0, "rerank skipped: retrieval overran")
        with self._tracer.start_as_current_span(
            "rerank",
            attributes={
                "answer.stage.budget_ms": tracker.slice_ms("rerank"),
                "rerank.model": reranker.name,
                "rerank.candidates": min(depth, len(candidates)),
                "rerank.top_n": wanted,
            },
        ) as span:
            reranked = await retriever.rerank(
                request.query, candidates[:depth], wanted, hard.slice_ms(tracker.slice_ms("rerank"))
            )
            span.set_attribute("answer.stage.elapsed_ms", reranked.elapsed_ms)
            if reranked.degraded is not None:
                span.set_attribute("answer.degraded", reranked.degraded)
        self.planning.observe("rerank", min(depth, len(candidates)), reranked.elapsed_ms)
        tracker.spent(rerank=reranked.elapsed_ms)
        if reranked.degraded is not None:
            tracker.cut("rerank", reranked.degraded, 0)
        return reranked
