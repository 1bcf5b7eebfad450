"""The answer pipeline: plan → embed → search → rerank → prompt → generate, each stage a span
with a deadline slice from the plan.

`prepare()` does everything that can still fail with a plain HTTP error (the plan and its
admission, retrieval, a generation slot, the prompt, and opening the SGLang stream up to its
response headers); `events()` then yields `plan`, `sources`, the `token` deltas and `done` (or
`error` then `done`). A stage that overruns its slice is cut (rerank → retrieval order, fewer
passages) and the rest re-planned with the time left (answer_service/pipeline/planning.py). No FastAPI
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

from answer_service.errors import (
    InvalidRequestError,
    OverloadedError,
    RoutedWorkerLostError,
    ServiceError,
    StageTimeoutError,
    UpstreamUnavailableError,
)
from answer_service.pipeline.admission import Slot, SlotQueueFullError
from answer_service.pipeline.attribution import (
    ABSTAIN_BELOW,
    ABSTENTION,
    SUPPORT_THRESHOLD,
    Attributor,
    Citation,
    SentenceSplitter,
    evidence,
)
from answer_service.pipeline.events import (
    AnswerRequest,
    CitationEvent,
    DoneEvent,
    ErrorEvent,
    PipelineEvent,
    PlanEvent,
    Retrieved,
    SourcesEvent,
    StageTimings,
    TokenEvent,
)
from answer_service.pipeline.planning import FleetRate, PlanningConfig, RequestPlanning
from answer_service.pipeline.prepared import Generation, PreparedAnswer
from answer_service.pipeline.retrieval_stage import RetrievalConfig, RetrievalStage
from answer_service.pipeline.values import (
    end_refused,
    error_event,
    generate_attributes,
    laid_out_prompt,
    numbered_sources,
    open_stream,
    ranked_sources,
)
from answer_service.runtime.caches import AnswerCache, EmbeddingCache
from answer_service.runtime.metrics import ServiceMetrics
from budget import CacheEstimator, Deadline
from budget.planner import Knobs, PromptOption
from generation.errors import GenerationError
from generation.prefix_order import PromptLayout
from generation.prefix_routing import PrefixRouter, RoutingPolicy
from generation.prompt_layout import ChatTemplate, Prompt
from generation.sglang_client import (
    SamplingParams,
    SGLangClient,
    StreamTimeouts,
)
from retrieval.index.ann import SearchDepth
from retrieval.passage import ScoredPassage
from retrieval.retriever import RetrievalMode, Retriever

logger = logging.getLogger(__name__)

# How long a worker that refused a connection is passed over.
_WORKER_DOWN_S = 5.0

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
    cache_adopt: int = 0
    # Answer sentences cite the prompt passages covering this share of their terms; a question
    # whose best source covers less than `abstain_below` of its terms gets "I do not know".
    citation_threshold: float = SUPPORT_THRESHOLD
    max_citation_sources: int = 2
    abstain_below: float = ABSTAIN_BELOW
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
        *,
        answer_cache: AnswerCache | None = None,
        embeddings: EmbeddingCache | None = None,
        fleet: FleetRate | None = None,
    ) -> None:
        self._retriever = retriever
        self._template = template
        self._workers = {client.base_url: client for client in workers}
        self._tracer = tracer
        self._config = config
        # Per worker: the passage sequences sent there, and how much of them it kept.
        self.router = PrefixRouter(list(self._workers), policy=config.routing)
        self.cache = CacheEstimator()
        self.planning = RequestPlanning(config.planning, list(self._workers), fleet)
        self._retrieval = RetrievalStage(
            retriever,
            tracer,
            RetrievalConfig(
                config.retrieval_floor_ms,
                config.retrieval_mode,
                config.search_depth,
                config.prompt_layout,
                config.cache_slack,
            ),
            self.planning,
            embeddings,
        )
        self.metrics = metrics or ServiceMetrics()
        # Complete answers are cached only where decoding is greedy (the same every time).
        self.answer_cache = answer_cache if config.temperature == 0.0 else None

    def swap_retriever(self, retriever: Retriever, answer_cache: AnswerCache | None) -> None:
        """Answer from another index from the next request on; requests under way finish on
        the one they started with. The answer cache changes with it (its fingerprint holds
        the index)."""
        self._retriever = retriever
        self._retrieval.retriever = retriever
        self.answer_cache = answer_cache if self._config.temperature == 0.0 else None

    def hard_deadline(self, deadline: Deadline) -> Deadline:
        """The point past which the first token is given up on: budget x timeout factor (at
        least the retrieval floor)."""
        budget_s = max(
            (deadline.expires_at_s - deadline.started_at_s) * self._config.ttft_timeout_factor,
            # Retrieval may always use its floor: a sources-only answer to a tiny budget
            # still gets its sources.
            self._config.retrieval_floor_ms / 1000.0,
        )
        return Deadline(deadline.started_at_s, deadline.started_at_s + budget_s, deadline.clock)

    async def prepare(self, request: AnswerRequest, deadline: Deadline) -> PreparedAnswer:
        root = self._tracer.start_span(
            "answer",
            attributes={
                "answer.ttft_budget_ms": request.ttft_budget_ms,
                "answer.top_k": request.top_k,
                "answer.tier": request.tier,
                **({"answer.key_id": request.key_id} if request.key_id else {}),
                "answer.query_chars": len(request.query),
                **({"answer.query": request.query} if self._config.record_content else {}),
            },
        )
        try:
            # Exceptions are recorded below, once: use_span would record them again.
            with trace.use_span(root, False, record_exception=False, set_status_on_exception=False):
                return await self._prepare(request, deadline, root)
        except BaseException as exc:
            code = exc.code if isinstance(exc, ServiceError) else "cancelled"
            self.metrics.refused(
                trace_id=format(root.get_span_context().trace_id, "032x"),
                tier=request.tier,
                code=code,
                budget_ms=request.ttft_budget_ms,
            )
            end_refused(root, exc)
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
        cache_key = None
        if self.answer_cache is not None:  # ahead of retrieval, and of refusing for load
            cache_key = self.answer_cache.key(request.query, request.top_k)
            hit = await self.answer_cache.get(cache_key)
            root.set_attribute("answer.cache_hit", hit is not None)
            if hit is not None:
                return PreparedAnswer(
                    request, deadline, hit.sources, root, StageTimings(), tracker, planning,
                    cached=hit, metrics=self.metrics,
                )  # fmt: skip
        # Refused (or sources only) when admission says no plan makes the budget
        # (RequestPlanning.start).
        sources_only = tracker.planner and not tracker.admitted
        if sources_only and not request.allow_sources_only:
            if tracker.idle_floor_ms > request.ttft_budget_ms:  # no load would make it fit
                raise InvalidRequestError(
                    f"`ttft_budget_ms` is {request.ttft_budget_ms}; even an idle worker takes "
                    f"about {tracker.idle_floor_ms:.0f} ms to a first token here: ask for more "
                    "or allow a sources-only answer"
                )
            predicted = tracker.plan.predicted_ms.total
            raise OverloadedError(
                f"no plan can make the {request.ttft_budget_ms} ms budget now (the smallest "
                f"is predicted to take {predicted:.0f} ms); retry later or allow a sources-only "
                "answer",
                retry_after_s=planning.retry_after_s(),
            )
        if sources_only:  # the sources a full answer would have had, no rerank, no prompt
            tracker.knobs = Knobs(0, request.top_k, request.top_k)
        retrieved = await self._retrieval.run(request, deadline, hard, tracker)
        strength = evidence(
            request.query,
            [
                f"{sp.passage.title}\n{sp.passage.text}"
                for sp in retrieved.passages[: request.top_k]
            ],
        )
        root.set_attribute("answer.evidence", strength)
        abstain = not sources_only and strength < self._config.abstain_below
        prepared = PreparedAnswer(
            request=request,
            deadline=deadline,
            sources=ranked_sources(retrieved.passages, request.top_k, self._config.snippet_chars)
            if sources_only or abstain
            else (),
            root=root,
            timings=retrieved.timings,
            tracker=tracker,
            planning=planning,
            cache=self.cache,
            metrics=self.metrics,
            degraded=retrieved.degraded,
            cache_key=cache_key,
        )
        if sources_only:
            tracker.cut("passages", "no plan makes the budget: sources only", 0)
            prepared.outcome = "sources_only"
            return prepared
        if abstain:  # the service says it does not know; the model is not asked
            prepared.outcome = "abstained"
            return prepared
        ids = [sp.passage.passage_id for sp in retrieved.passages]
        for attempt in range(2):  # a worker that is gone: once more, on another
            worker = self.router.choose(ids, foreign=self._config.cache_adopt)
            try:
                await self._generate(prepared, hard, retrieved, worker)
                return prepared
            except UpstreamUnavailableError as exc:
                self.router.release(worker)
                # sgl-router passes a worker it lost over from now on: ask it again. A worker
                # of our own that is unreachable is passed over here for a while.
                routed = isinstance(exc, RoutedWorkerLostError)
                if not routed:
                    self.router.mark_down(worker, _WORKER_DOWN_S)
                if attempt == 1 or all(map(self.router.is_down, self._workers)):
                    raise
                logger.warning("sglang worker lost, asking again routed=%s url=%s", routed, worker)
            except BaseException:
                self.router.release(worker)
                raise
        raise AssertionError("unreachable")

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
        except SlotQueueFullError as exc:
            raise OverloadedError(
                f"{exc}; retry later", retry_after_s=self.planning.retry_after_s()
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
                config = self._config
                stream = await open_stream(
                    self._workers[worker],
                    prompt.text,
                    SamplingParams(config.max_new_tokens, config.temperature),
                    StreamTimeouts(
                        hard, config.sglang_connect_timeout_s, config.next_token_timeout_s
                    ),
                )
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
            retrieved.passages,
            prompt,
            request.top_k,
            self._config.snippet_chars,
            self._retriever.index.passage_by_id,
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

        # Read on the loop: the gate's state changes there, and `choose` runs in a thread.
        prefill_ahead = self.planning.gate.prefilling_tokens(worker, slot)

        def choose() -> tuple[PromptOption, float]:
            return self.planning.planner.passages_that_fit(
                prepared.deadline.remaining_ms(), options(), prefill_ahead, worker
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
        config = self._config
        return laid_out_prompt(
            question,
            scored,
            self._template,
            self.router.tree(worker),
            limit=limit,
            max_prompt_tokens=config.max_prompt_tokens,
            layout=config.prompt_layout,
            slack=config.cache_slack,
            adopt=config.cache_adopt,
            find=self._retriever.index.passage_by_id,
        )

    async def events(self, prepared: PreparedAnswer) -> AsyncIterator[PipelineEvent]:
        """`plan`, `sources`, then token deltas, then `done`; a failure mid-stream adds
        `error`. Each finished answer sentence is followed by its `citation`. A sources-only
        answer has no tokens; an abstention one, the service's own."""
        yield PlanEvent(prepared.plan)
        yield SourcesEvent(prepared.sources)
        if prepared.outcome == "abstained":
            prepared.first_token()
            yield TokenEvent(ABSTENTION)
        if (cached := prepared.cached) is not None:
            prepared.first_token()
            yield TokenEvent(cached.text)
            for citation in cached.citations:
                yield CitationEvent(citation)
        parts: list[str] = []
        citations: list[Citation] = []
        error: ErrorEvent | None = None
        generation = prepared.generation
        generate_started_s = time.perf_counter()
        try:
            if generation is not None:
                attributor = Attributor(
                    [(p.number, f"{p.title}\n{p.text}") for p in generation.prompt.passages],
                    threshold=self._config.citation_threshold,
                    max_sources=self._config.max_citation_sources,
                )
                splitter = SentenceSplitter()
                async for delta in generation.stream:
                    if prepared.ttft_ms is None:
                        prepared.first_token()
                    parts.append(delta.text)
                    yield TokenEvent(delta.text)
                    for sentence in splitter.feed(delta.text):
                        citations.append(attributor.cite(sentence))
                        yield CitationEvent(citations[-1])
                for sentence in splitter.finish():
                    citations.append(attributor.cite(sentence))
                    yield CitationEvent(citations[-1])
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
        stats = prepared.stats()
        cacheable = prepared.cacheable(stats, "".join(parts), citations) if not error else None
        if self.answer_cache is not None and prepared.cache_key and cacheable is not None:
            self.answer_cache.put(prepared.cache_key, cacheable)
        yield DoneEvent(stats)
