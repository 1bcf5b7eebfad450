"""The answer pipeline: plan → embed → search → rerank → prompt → generate, each stage a span
with a deadline slice from the plan.

`prepare()` does everything that can still fail with a plain HTTP error (the plan and its
admission, retrieval, a generation slot, the prompt, and opening the SGLang stream up to its
response headers); `events()` then yields `plan`, `sources`, the `token` deltas and `done` (or
`error` then `done`). A stage that overruns its slice is cut (rerank → retrieval order, fewer
passages) and the rest re-planned with the time left (answer_service/planning.py). No FastAPI
here: `eval/` runs the same pipeline in-process.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field

from opentelemetry import trace
from opentelemetry.trace import Span, Status, StatusCode, Tracer

from answer_service.admission import Slot
from answer_service.errors import (
    InvalidRequestError,
    OverloadedError,
    ServiceError,
    StageTimeoutError,
    UpstreamError,
    UpstreamUnavailableError,
)
from answer_service.events import (
    AnswerRequest,
    DoneEvent,
    ErrorEvent,
    PipelineEvent,
    PlanEvent,
    Retrieved,
    SourcesEvent,
    StageTimings,
    TokenEvent,
)
from answer_service.metrics import ServiceMetrics
from answer_service.pipeline_values import (
    depth_attributes,
    error_event,
    generate_attributes,
    numbered_sources,
    ranked_sources,
)
from answer_service.planning import PlanningConfig, PlanTracker, RequestPlanning, query_tokens
from answer_service.prepared import Generation, PreparedAnswer
from budget import CacheEstimator, Deadline
from budget.planner import Knobs, PromptOption
from generation.errors import (
    GenerationError,
    PromptTooLongError,
    SGLangRequestError,
    SGLangUnavailableError,
)
from generation.prefix_order import PromptLayout
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

__all__ = ["AnswerPipeline", "PipelineConfig", "PreparedAnswer"]


@dataclass(frozen=True, slots=True)
class PipelineConfig:
    served_model: str
    max_prompt_tokens: int = 1800
    max_new_tokens: int = 160
    temperature: float = 0.0
    retrieval_floor_ms: int = 250
    ttft_timeout_factor: float = 4.0
    next_token_timeout_s: float = 20.0
    sglang_connect_timeout_s: float = 2.0
    snippet_chars: int = 300
    record_content: bool = False
    search_depth: SearchDepth | None = None
    retrieval_mode: RetrievalMode = "hybrid"
    prompt_layout: PromptLayout = "cache_aware"
    routing: RoutingPolicy = "prefix"
    cache_slack: int = 0
    planning: PlanningConfig = field(default_factory=PlanningConfig)


class AnswerPipeline:
    def __init__(
        self,
        retriever: Retriever,
        template: ChatTemplate,
        workers: Sequence[SGLangClient],
        tracer: Tracer,
        config: PipelineConfig,
        metrics: ServiceMetrics | None = None,
    ) -> None:
        self._retriever = retriever
        self._template = template
        self._workers = {client.base_url: client for client in workers}
        self._tracer = tracer
        self._config = config
        # Per worker: the passage sequences sent there, and how much of them it kept.
        self.router = PrefixRouter(list(self._workers), policy=config.routing)
        self.cache = CacheEstimator()
        self.planning = RequestPlanning(config.planning, list(self._workers))
        self.metrics = metrics or ServiceMetrics()

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
                "answer.tier": request.tier,
                "answer.query_chars": len(request.query),
                **({"answer.query": request.query} if self._config.record_content else {}),
            },
        )
        try:
            with trace.use_span(root, end_on_exit=False):
                return await self._prepare(request, deadline, root)
        except BaseException as exc:
            code = exc.code if isinstance(exc, ServiceError) else "cancelled"
            self.metrics.refused(request.tier, code)
            root.record_exception(exc)
            root.set_attribute("answer.outcome", type(exc).__name__)
            root.set_status(Status(StatusCode.ERROR, str(exc)[:200]))
            root.end()
            raise

    async def _prepare(
        self, request: AnswerRequest, deadline: Deadline, root: Span
    ) -> PreparedAnswer:
        hard = self.hard_deadline(deadline)
        planning = self.planning
        tracker = planning.start(
            request.query,
            request.top_k,
            deadline.remaining_ms(),
            request.ttft_budget_ms,
            request.tier,
            reranker=self._retriever.reranker is not None,
            cache=self.cache,
        )
        # Refused (or sources only) when even the smallest plan's typical time misses the
        # budget; one that only misses it with the safety margins is tried.
        sources_only = tracker.planner and not tracker.plan.likely
        if sources_only and not request.allow_sources_only:
            predicted = tracker.plan.predicted_ms.total
            raise OverloadedError(
                f"no plan can make the {request.ttft_budget_ms} ms budget now (the smallest "
                f"is predicted to take {predicted:.0f} ms); retry later or allow a sources-only "
                "answer",
                retry_after_s=planning.retry_after_s(),
            )
        if sources_only:  # the sources a full answer would have had, no rerank, no prompt
            tracker.knobs = Knobs(0, request.top_k, request.top_k)
        retrieved = await self._retrieve(request, deadline, hard, tracker)
        prepared = PreparedAnswer(
            request=request,
            deadline=deadline,
            sources=ranked_sources(retrieved.passages, request.top_k, self._config.snippet_chars)
            if sources_only
            else (),
            root=root,
            timings=retrieved.timings,
            tracker=tracker,
            planning=planning,
            cache=self.cache,
            metrics=self.metrics,
            degraded=retrieved.degraded,
        )
        if sources_only:
            tracker.cut("passages", "no plan makes the budget: sources only", 0)
            prepared.outcome = "sources_only"
            return prepared
        worker = self.router.choose([sp.passage.passage_id for sp in retrieved.passages])
        try:
            await self._generate(prepared, hard, retrieved, worker)
        except BaseException:
            self.router.release(worker)
            raise
        return prepared

    async def _generate(
        self, prepared: PreparedAnswer, hard: Deadline, retrieved: Retrieved, worker: str
    ) -> None:
        request, tracker = prepared.request, prepared.tracker
        gate = self.planning.gate
        try:
            async with asyncio.timeout(hard.remaining_s()):
                slot = await gate.acquire(worker, request.tier, tracker.plan.uncached_tokens)
        except TimeoutError as exc:
            raise StageTimeoutError(
                "no generation slot came free before the request's deadline"
            ) from exc
        tracker.queue_wait_ms, tracker.worker = slot.waited_ms, worker
        try:
            started_s = time.perf_counter()
            prompt, option = await self._fit_prompt(prepared, retrieved.passages, worker, slot)
            prompt_ms = (time.perf_counter() - started_s) * 1000.0
            self.planning.observe("prompt", option.passages, prompt_ms)
            tracker.spent(prompt=prompt_ms)
            slot.owe(option.uncached_tokens)
            prefill_tokens = gate.prefilling_tokens(worker, slot) + option.uncached_tokens
            span = self._generate_span(prepared.deadline, prompt, worker, option)
            try:
                stream = await self._open_stream(self._workers[worker], prompt, hard)
            except BaseException as exc:
                span.record_exception(exc)
                span.set_status(Status(StatusCode.ERROR, str(exc)[:200]))
                span.end()
                raise
        except BaseException:
            slot.release()
            raise
        span.set_attribute("gen_ai.response.id", stream.rid)
        prepared.sources = numbered_sources(
            retrieved.passages, prompt, request.top_k, self._config.snippet_chars
        )
        prepared.timings = dataclasses.replace(prepared.timings, prompt_ms=prompt_ms)
        prepared.generation = Generation(
            prompt, stream, span, worker, self.router, slot, prefill_tokens
        )

    def _generate_span(
        self, deadline: Deadline, prompt: Prompt, worker: str, option: PromptOption
    ) -> Span:
        config = self._config
        return self._tracer.start_span(
            "generate",
            attributes=generate_attributes(
                config.served_model, config.max_new_tokens, config.temperature, prompt
            )
            | {
                "answer.stage.budget_ms": deadline.remaining_ms(),
                "answer.prompt.expected_uncached_tokens": option.uncached_tokens,
                "sglang.worker": worker,
            },
        )

    async def _retrieve(
        self, request: AnswerRequest, deadline: Deadline, hard: Deadline, tracker: PlanTracker
    ) -> Retrieved:
        # The sources list the best top_k even when the prompt gets fewer: k costs little here.
        tracker.knobs = knobs = dataclasses.replace(
            tracker.knobs, retrieve_k=max(tracker.knobs.retrieve_k, request.top_k)
        )
        mode = self._mode()
        # Embedding and search cannot be cut short and still give passages: they may run to
        # the end of the TTFT budget (at least the floor); what they overrun of their slice
        # comes out of the stages after them when those are re-planned.
        slice_ms = max(deadline.remaining_ms(), self._config.retrieval_floor_ms)
        retrieval_deadline = hard.slice_ms(slice_ms)
        try:
            vector = await self._embed(request, retrieval_deadline) if mode != "lexical" else None
            with self._tracer.start_as_current_span(
                "search",
                attributes={
                    "retrieval.mode": mode,
                    "retrieval.k": knobs.retrieve_k,
                    "retrieval.index.passages": len(self._retriever.index),
                    "retrieval.index.type": self._retriever.index.manifest.index_type,
                    "retrieval.index.device": self._retriever.index.device,
                    **depth_attributes(self._config.search_depth),
                    "answer.stage.budget_ms": retrieval_deadline.remaining_ms(),
                },
            ) as span:
                found = await self._retriever.search(
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
            self.planning.observe("embed", query_tokens(request.query), embed_ms)
            self.planning.observe("search", knobs.retrieve_k, found.elapsed_ms)
            tracker.spent(embed=embed_ms, search=found.elapsed_ms)
            reranked = await self._rerank(request, found.value, deadline, hard, tracker)
        except RetrievalTimeoutError as exc:
            raise StageTimeoutError(str(exc)) from exc
        except RetrievalError as exc:
            raise ServiceError(f"retrieval failed: {exc}") from exc
        timings = StageTimings(embed_ms=embed_ms, search_ms=found.elapsed_ms)
        timings = dataclasses.replace(timings, rerank_ms=reranked.elapsed_ms)
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

    def _wanted(self, request: AnswerRequest, tracker: PlanTracker) -> int:
        """Passages retrieval hands on: top_k (the sources) or the plan's plus its slack."""
        slack = self._config.cache_slack if self._config.prompt_layout == "cache_aware" else 0
        return max(request.top_k, tracker.knobs.passages + slack)

    async def _rerank(
        self,
        request: AnswerRequest,
        candidates: list[ScoredPassage],
        deadline: Deadline,
        hard: Deadline,
        tracker: PlanTracker,
    ) -> Reranked:
        reranker = self._retriever.reranker
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
            reranked = await self._retriever.rerank(
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

    async def _fit_prompt(
        self,
        prepared: PreparedAnswer,
        scored: list[ScoredPassage],
        worker: str,
        slot: Slot,
    ) -> tuple[Prompt, PromptOption]:
        """The generation re-plan: the most of the planned passages whose predicted first
        token still fits the time left, given the real prompt, its cached prefix and the
        worker's queue. With the planner off, the planned passages as they are."""
        tracker = prepared.tracker
        tree = self.router.tree(worker)
        prompts: dict[int, Prompt] = {}

        def options() -> Iterator[PromptOption]:
            for n in range(tracker.knobs.passages, 0, -1):
                prompt = self._laid_out(prepared.request.query, scored, n, worker)
                prompts[n] = prompt
                uncached = self.cache.expected_uncached(
                    worker, prompt.prompt_tokens, prompt.expected_cached_tokens
                )
                yield PromptOption(n, prompt.prompt_tokens, uncached)
                if not tracker.planner:
                    return

        def choose() -> tuple[PromptOption, float]:
            return self.planning.planner.passages_that_fit(
                prepared.deadline.remaining_ms(),
                options(),
                self.planning.gate.prefilling_tokens(worker, slot),
                worker,
            )

        try:
            option, predicted_ms = await asyncio.to_thread(choose)
        except GenerationError as exc:
            raise InvalidRequestError(str(exc)) from exc
        n = option.passages
        prompt = prompts[n]
        tree.insert([p.source_id for p in prompt.passages])
        if tracker.planner and n < tracker.knobs.passages:
            reason = (
                f"{tracker.knobs.passages} passages no longer fit the time left; first token "
                f"predicted at {predicted_ms:.0f} ms with {n}"
            )
            tracker.cut("passages", reason, n)
        return prompt, option

    def _laid_out(
        self, question: str, scored: list[ScoredPassage], limit: int, worker: str
    ) -> Prompt:
        passages = [
            ContextPassage(n, sp.passage.passage_id, sp.passage.title, sp.passage.text)
            for n, sp in enumerate(scored, start=1)
        ]
        return build_prompt(
            question,
            passages,
            self._template,
            max_prompt_tokens=self._config.max_prompt_tokens,
            layout=self._config.prompt_layout,
            tree=self.router.tree(worker),
            limit=limit,
            slack=self._config.cache_slack,
            remember=False,
        )

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
        """`plan`, `sources`, then token deltas, then `done`; a failure mid-stream adds
        `error`. A sources-only answer has no tokens."""
        yield PlanEvent(prepared.plan)
        yield SourcesEvent(prepared.sources)
        error: ErrorEvent | None = None
        generation = prepared.generation
        generate_started_s = time.perf_counter()
        try:
            if generation is not None:
                async for delta in generation.stream:
                    if prepared.ttft_ms is None:
                        prepared.first_token()
                    yield TokenEvent(delta.text)
        except GenerationError as exc:
            error = error_event(exc)
            prepared.outcome = "error"
            assert generation is not None
            generation.span.record_exception(exc)
            generation.span.set_status(Status(StatusCode.ERROR, error.message[:200]))
            logger.warning("generation failed trace_id=%s code=%s", prepared.trace_id, error.code)
        except BaseException:
            prepared.outcome = "cancelled"
            raise
        finally:
            if generation is not None:
                prepared.timings = dataclasses.replace(
                    prepared.timings,
                    generate_ms=(time.perf_counter() - generate_started_s) * 1000.0,
                )
            prepared.close_nowait()
        if error is not None:
            yield error
        yield DoneEvent(prepared.stats())
