"""The answer pipeline: embed → search → prompt → generate, each stage a span with a deadline.

`prepare()` does everything that can still fail with a plain HTTP error (retrieval, the prompt,
and opening the SGLang stream up to its response headers); `events()` then yields `sources`,
the `token` deltas and `done` (or `error` then `done`). No FastAPI here: `eval/` runs the same
pipeline in-process.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

from opentelemetry import trace
from opentelemetry.trace import Span, Status, StatusCode, Tracer

from answer_service.errors import (
    InvalidRequestError,
    ServiceError,
    StageTimeoutError,
    UpstreamError,
    UpstreamUnavailableError,
)
from answer_service.events import (
    AnswerRequest,
    AnswerStats,
    DoneEvent,
    ErrorEvent,
    PipelineEvent,
    Retrieved,
    Source,
    SourcesEvent,
    StageTimings,
    TokenEvent,
)
from answer_service.pipeline_values import (
    depth_attributes,
    end_generate_span,
    error_event,
    numbered_sources,
)
from budget import CacheEstimator, Deadline
from generation.errors import (
    GenerationError,
    PromptTooLongError,
    SGLangRequestError,
    SGLangUnavailableError,
)
from generation.prefix_order import PrefixTree, PromptLayout
from generation.prefix_routing import PrefixRouter, RoutingPolicy
from generation.prompt_layout import ChatTemplate, ContextPassage, Prompt, build_prompt
from generation.sglang_client import (
    GenerationStream,
    SamplingParams,
    SGLangClient,
    StreamTimeouts,
)
from retrieval.ann import SearchDepth
from retrieval.embedder import Vectors
from retrieval.errors import RetrievalError, RetrievalTimeoutError
from retrieval.passage import ScoredPassage
from retrieval.retriever import Reranked, RetrievalMode, Retriever, Timed

logger = logging.getLogger(__name__)

__all__ = [
    "AnswerPipeline",
    "PipelineConfig",
    "PreparedAnswer",
]


@dataclass(frozen=True, slots=True)
class PipelineConfig:
    served_model: str
    max_prompt_tokens: int = 1800
    max_new_tokens: int = 160
    temperature: float = 0.0
    retrieval_share: float = 0.3
    retrieval_floor_ms: int = 250
    ttft_timeout_factor: float = 4.0
    next_token_timeout_s: float = 20.0
    sglang_connect_timeout_s: float = 2.0
    snippet_chars: int = 300
    record_content: bool = False
    search_depth: SearchDepth | None = None
    rerank_candidates: int = 20
    retrieval_mode: RetrievalMode = "hybrid"
    prompt_layout: PromptLayout = "cache_aware"
    routing: RoutingPolicy = "prefix"
    cache_slack: int = 0


@dataclass(slots=True)
class PreparedAnswer:
    """A request whose sources are known and whose SGLang stream is open.

    Owns the root span, the generate span and the stream: `close_nowait()` releases all three
    without awaiting, so it is safe from any `finally`, even under cancellation.
    """

    request: AnswerRequest
    deadline: Deadline
    sources: tuple[Source, ...]
    prompt: Prompt
    stream: GenerationStream
    root: Span
    generate_span: Span
    timings: StageTimings
    worker: str = ""
    cache: CacheEstimator | None = None
    router: PrefixRouter | None = None
    degraded: tuple[str, ...] = ()
    outcome: str = "ok"
    ttft_ms: float | None = None
    _closed: bool = field(default=False)

    @property
    def trace_id(self) -> str:
        return format(self.root.get_span_context().trace_id, "032x")

    def stats(self) -> AnswerStats:
        result = self.stream.result
        return AnswerStats(
            trace_id=self.trace_id,
            outcome=self.outcome,
            ttft_ms=self.ttft_ms,
            ttft_budget_ms=self.request.ttft_budget_ms,
            within_budget=self.ttft_ms is not None and self.ttft_ms <= self.request.ttft_budget_ms,
            stages=self.timings,
            prompt_tokens=result.prompt_tokens if result else 0,
            cached_tokens=result.cached_tokens if result else 0,
            completion_tokens=result.completion_tokens if result else 0,
            finish_reason=result.finish_reason if result else self.outcome,
            passages_in_prompt=len(self.prompt.passages),
            passages_dropped=self.prompt.dropped_passages,
            degraded=self.degraded,
            prompt_layout=self.prompt.layout,
            expected_cached_tokens=self.prompt.expected_cached_tokens,
            worker=self.worker,
        )

    def close_nowait(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.stream.close_nowait()
        end_generate_span(self.generate_span, self.stream.result)
        if self.router is not None:
            self.router.release(self.worker)
        stats = self.stats()
        if self.cache is not None and self.stream.result is not None:
            self.cache.observe(
                self.worker, stats.prompt_tokens, stats.expected_cached_tokens, stats.cached_tokens
            )
        self.root.set_attributes(
            {
                "answer.outcome": stats.outcome,
                "answer.within_budget": stats.within_budget,
                "answer.ttft_ms": stats.ttft_ms if stats.ttft_ms is not None else -1.0,
                "answer.degraded": stats.degraded,
            }
        )
        if stats.outcome not in ("ok", "cancelled"):
            self.root.set_status(Status(StatusCode.ERROR, stats.outcome))
        self.root.end()


class AnswerPipeline:
    def __init__(
        self,
        retriever: Retriever,
        template: ChatTemplate,
        workers: Sequence[SGLangClient],
        tracer: Tracer,
        config: PipelineConfig,
    ) -> None:
        self._retriever = retriever
        self._template = template
        self._workers = {client.base_url: client for client in workers}
        self._tracer = tracer
        self._config = config
        # Per worker: the passage sequences sent there, and how much of them it kept.
        self.router = PrefixRouter(list(self._workers), policy=config.routing)
        self.cache = CacheEstimator()

    def hard_deadline(self, deadline: Deadline) -> Deadline:
        """The point past which the first token is given up on: budget x timeout factor."""
        budget_s = (
            deadline.expires_at_s - deadline.started_at_s
        ) * self._config.ttft_timeout_factor
        return Deadline(deadline.started_at_s, deadline.started_at_s + budget_s, deadline.clock)

    async def prepare(self, request: AnswerRequest, deadline: Deadline) -> PreparedAnswer:
        root = self._tracer.start_span(
            "answer",
            attributes={
                "answer.ttft_budget_ms": request.ttft_budget_ms,
                "answer.top_k": request.top_k,
                "answer.query_chars": len(request.query),
                **({"answer.query": request.query} if self._config.record_content else {}),
            },
        )
        try:
            with trace.use_span(root, end_on_exit=False):
                return await self._prepare(request, deadline, root)
        except BaseException as exc:
            root.record_exception(exc)
            root.set_attribute("answer.outcome", type(exc).__name__)
            root.set_status(Status(StatusCode.ERROR, str(exc)[:200]))
            root.end()
            raise

    async def _prepare(
        self, request: AnswerRequest, deadline: Deadline, root: Span
    ) -> PreparedAnswer:
        hard = self.hard_deadline(deadline)
        retrieval_ms = max(
            request.ttft_budget_ms * self._config.retrieval_share, self._config.retrieval_floor_ms
        )
        retrieval_deadline = hard.slice_ms(retrieval_ms)
        retrieved = await self._retrieve(request, retrieval_deadline)
        scored = retrieved.passages
        worker = self.router.choose([sp.passage.passage_id for sp in scored])
        try:
            return await self._generate(request, deadline, hard, root, retrieved, worker)
        except BaseException:
            self.router.release(worker)
            raise

    async def _generate(
        self,
        request: AnswerRequest,
        deadline: Deadline,
        hard: Deadline,
        root: Span,
        retrieved: Retrieved,
        worker: str,
    ) -> PreparedAnswer:
        scored = retrieved.passages
        started_s = time.perf_counter()
        prompt = await self._build_prompt(
            request.query, scored, request.top_k, self.router.tree(worker)
        )
        sources = numbered_sources(scored, prompt, request.top_k, self._config.snippet_chars)
        prompt_ms = (time.perf_counter() - started_s) * 1000.0
        generate_span = self._tracer.start_span(
            "generate",
            attributes={
                "gen_ai.operation.name": "text_completion",
                "gen_ai.system": "sglang",
                "gen_ai.request.model": self._config.served_model,
                "gen_ai.request.max_tokens": self._config.max_new_tokens,
                "gen_ai.request.temperature": self._config.temperature,
                "answer.stage.budget_ms": deadline.remaining_ms(),
                "answer.prompt.passages": len(prompt.passages),
                "answer.prompt.tokens_estimate": prompt.prompt_tokens,
                "answer.prompt.layout": prompt.layout,
                "answer.prompt.expected_cached_tokens": prompt.expected_cached_tokens,
                "answer.prompt.expected_uncached_tokens": self.cache.expected_uncached(
                    worker, prompt.prompt_tokens, prompt.expected_cached_tokens
                ),
                "sglang.worker": worker,
            },
        )
        try:
            stream = await self._open_stream(self._workers[worker], prompt, hard)
        except BaseException as exc:
            generate_span.record_exception(exc)
            generate_span.set_status(Status(StatusCode.ERROR, str(exc)[:200]))
            generate_span.end()
            raise
        generate_span.set_attribute("gen_ai.response.id", stream.rid)
        return PreparedAnswer(
            request=request,
            deadline=deadline,
            sources=sources,
            prompt=prompt,
            stream=stream,
            root=root,
            generate_span=generate_span,
            timings=dataclasses.replace(retrieved.timings, prompt_ms=prompt_ms),
            worker=worker,
            cache=self.cache,
            router=self.router,
            degraded=retrieved.degraded,
        )

    async def _retrieve(self, request: AnswerRequest, deadline: Deadline) -> Retrieved:
        reranker = self._retriever.reranker
        wanted = self._candidates(request)
        k = wanted if reranker is None else max(wanted, self._config.rerank_candidates)
        mode = self._mode()
        try:
            vector = await self._embed(request, deadline) if mode != "lexical" else None
            with self._tracer.start_as_current_span(
                "search",
                attributes={
                    "retrieval.mode": mode,
                    "retrieval.k": k,
                    "retrieval.index.passages": len(self._retriever.index),
                    "retrieval.index.type": self._retriever.index.manifest.index_type,
                    "retrieval.index.device": self._retriever.index.device,
                    **depth_attributes(self._config.search_depth),
                    "answer.stage.budget_ms": deadline.remaining_ms(),
                },
            ) as span:
                found = await self._retriever.search(
                    request.query,
                    vector.value if vector else None,
                    k,
                    deadline,
                    depth=self._config.search_depth,
                    mode=mode,
                )
                span.set_attribute("retrieval.results", len(found.value))
                span.set_attribute("answer.stage.elapsed_ms", found.elapsed_ms)
            reranked = await self._rerank(request, found.value, deadline)
        except RetrievalTimeoutError as exc:
            raise StageTimeoutError(str(exc)) from exc
        except RetrievalError as exc:
            raise ServiceError(f"retrieval failed: {exc}") from exc
        timings = StageTimings(
            embed_ms=vector.elapsed_ms if vector else 0.0,
            search_ms=found.elapsed_ms,
            rerank_ms=reranked.elapsed_ms,
        )
        degraded = () if reranked.degraded is None else (reranked.degraded,)
        return Retrieved(reranked.passages, timings, degraded)

    def _mode(self) -> RetrievalMode:
        """The configured mode where the index supports it, else dense."""
        modes = self._retriever.modes()
        return self._config.retrieval_mode if self._config.retrieval_mode in modes else "dense"

    async def _embed(self, request: AnswerRequest, deadline: Deadline) -> Timed[Vectors]:
        with self._tracer.start_as_current_span(
            "embed",
            attributes={
                "gen_ai.operation.name": "embeddings",
                "gen_ai.request.model": self._retriever.embedder.name,
                "answer.stage.budget_ms": deadline.remaining_ms(),
            },
        ) as span:
            vector = await self._retriever.embed_query(request.query, deadline)
            span.set_attribute("answer.stage.elapsed_ms", vector.elapsed_ms)
        return vector

    def _candidates(self, request: AnswerRequest) -> int:
        """Passages retrieval hands on: `top_k`, plus the cache slack of the layout."""
        slack = self._config.cache_slack if self._config.prompt_layout == "cache_aware" else 0
        return request.top_k + slack

    async def _rerank(
        self, request: AnswerRequest, candidates: list[ScoredPassage], deadline: Deadline
    ) -> Reranked:
        reranker = self._retriever.reranker
        wanted = self._candidates(request)
        if reranker is None:
            return Reranked(candidates[:wanted], 0.0)
        with self._tracer.start_as_current_span(
            "rerank",
            attributes={
                "answer.stage.budget_ms": deadline.remaining_ms(),
                "rerank.model": reranker.name,
                "rerank.candidates": len(candidates),
                "rerank.top_n": wanted,
            },
        ) as span:
            reranked = await self._retriever.rerank(request.query, candidates, wanted, deadline)
            span.set_attribute("answer.stage.elapsed_ms", reranked.elapsed_ms)
            if reranked.degraded is not None:
                span.set_attribute("answer.degraded", reranked.degraded)
        return reranked

    async def _build_prompt(
        self, question: str, scored: list[ScoredPassage], top_k: int, tree: PrefixTree
    ) -> Prompt:
        passages = [
            ContextPassage(n, sp.passage.passage_id, sp.passage.title, sp.passage.text)
            for n, sp in enumerate(scored, start=1)
        ]
        try:
            return await asyncio.to_thread(
                build_prompt,
                question,
                passages,
                self._template,
                max_prompt_tokens=self._config.max_prompt_tokens,
                layout=self._config.prompt_layout,
                tree=tree,
                limit=top_k,
                slack=self._config.cache_slack,
            )
        except GenerationError as exc:
            raise InvalidRequestError(str(exc)) from exc

    async def _open_stream(
        self, sglang: SGLangClient, prompt: Prompt, hard: Deadline
    ) -> GenerationStream:
        params = SamplingParams(
            max_new_tokens=self._config.max_new_tokens, temperature=self._config.temperature
        )
        timeouts = StreamTimeouts(
            first_token=hard,
            connect_s=self._config.sglang_connect_timeout_s,
            next_token_s=self._config.next_token_timeout_s,
        )
        try:
            return await sglang.open_stream(prompt.text, params, timeouts)
        except SGLangUnavailableError as exc:
            raise UpstreamUnavailableError(str(exc), retry_after_s=5) from exc
        except PromptTooLongError as exc:
            raise InvalidRequestError(f"the prompt does not fit the model: {exc}") from exc
        except SGLangRequestError as exc:
            raise UpstreamError(str(exc)) from exc

    async def events(self, prepared: PreparedAnswer) -> AsyncIterator[PipelineEvent]:
        """`sources`, then token deltas, then `done`; a failure mid-stream adds `error`."""
        yield SourcesEvent(prepared.sources)
        error: ErrorEvent | None = None
        generate_started_s = time.perf_counter()
        try:
            async for delta in prepared.stream:
                if prepared.ttft_ms is None:
                    prepared.ttft_ms = prepared.deadline.elapsed_ms()
                    prepared.generate_span.add_event(
                        "first_token", {"answer.ttft_ms": prepared.ttft_ms}
                    )
                yield TokenEvent(delta.text)
        except GenerationError as exc:
            error = error_event(exc)
            prepared.outcome = "error"
            prepared.generate_span.record_exception(exc)
            prepared.generate_span.set_status(Status(StatusCode.ERROR, error.message[:200]))
            logger.warning("generation failed trace_id=%s code=%s", prepared.trace_id, error.code)
        except BaseException:
            prepared.outcome = "cancelled"
            raise
        finally:
            prepared.timings = dataclasses.replace(
                prepared.timings, generate_ms=(time.perf_counter() - generate_started_s) * 1000.0
            )
            prepared.close_nowait()
        if error is not None:
            yield error
        yield DoneEvent(prepared.stats())
