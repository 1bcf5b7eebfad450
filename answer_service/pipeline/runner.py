"""The answer pipeline: plan → embed → search → rerank → prompt → generate, each stage run by
one `StageRunner` under its slice of the request's deadline.

`prepare()` does everything that can still fail with a plain HTTP error (the answer cache, the
plan and its admission, retrieval, a generation slot, the prompt, and opening the SGLang stream
up to its response headers); `events()` then streams `plan`, `sources`, the answer and `done`
(answer_stream.py). A plan may end without the model: a cached answer, sources only, or an
abstention when the evidence is weak. A stage that overruns its slice is cut (rerank → retrieval
order, fewer passages) and generation re-planned with the time left. No FastAPI here: `eval/`
runs the same pipeline in-process.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

from opentelemetry import trace
from opentelemetry.trace import Span, Tracer

from answer_service.errors import (
    InvalidRequestError,
    OverloadedError,
    RoutedWorkerLostError,
    ServiceError,
    UpstreamUnavailableError,
)
from answer_service.pipeline.answer_stream import CitationConfig, answer_events
from answer_service.pipeline.attribution import ABSTAIN_BELOW, evidence
from answer_service.pipeline.events import AnswerRequest, PipelineEvent
from answer_service.pipeline.generation import GenerationConfig, GenerationSteps
from answer_service.pipeline.planning import FleetRate, PlanningConfig, RequestPlanning
from answer_service.pipeline.ports import AnswerListener, AnswerStore, EmbeddingStore
from answer_service.pipeline.prepared import PreparedAnswer
from answer_service.pipeline.retrieval import RetrievalConfig, RetrievalSteps, Retrieved
from answer_service.pipeline.stage_runner import StageRunner
from answer_service.pipeline.values import (
    end_refused,
    numbered_sources,
    passage_lookup,
    ranked_sources,
)
from budget import CacheEstimator, Deadline
from generation.client import GenerationClient
from generation.prefix_routing import PrefixRouter, RoutingPolicy
from generation.prompt_layout import ChatTemplate
from generation.stages import PromptConfig, PromptStage
from retrieval.retriever import Retriever

logger = logging.getLogger(__name__)

# How long a worker that refused a connection is passed over.
_WORKER_DOWN_S = 5.0

__all__ = ["AnswerPipeline", "PipelineConfig", "PreparedAnswer"]


@dataclass(frozen=True, slots=True)
class PipelineConfig:
    """What the pipeline is told, as the small configs of its parts (built from the settings in
    one place: answer_service/runtime/configs.py)."""

    generation: GenerationConfig
    retrieval: RetrievalConfig
    prompt: PromptConfig = field(default_factory=PromptConfig)
    citations: CitationConfig = field(default_factory=CitationConfig)
    planning: PlanningConfig = field(default_factory=PlanningConfig)
    routing: RoutingPolicy = "prefix"
    # A first token later than budget x factor is given up on; the budget itself is the target.
    ttft_timeout_factor: float = 4.0
    snippet_chars: int = 300
    # A question whose best source covers less than this share of its terms gets "I do not
    # know" without the model.
    abstain_below: float = ABSTAIN_BELOW
    record_content: bool = False


class _NoListener:
    def answered(self, *_: object) -> None:
        return None

    def refused(self, **_: object) -> None:
        return None


class AnswerPipeline:
    def __init__(
        self,
        retriever: Retriever,
        template: ChatTemplate,
        workers: Sequence[GenerationClient],
        tracer: Tracer,
        config: PipelineConfig,
        listener: AnswerListener | None = None,
        *,
        answer_cache: AnswerStore | None = None,
        embeddings: EmbeddingStore | None = None,
        fleet: FleetRate | None = None,
    ) -> None:
        self._retriever = retriever
        self._workers = {client.base_url: client for client in workers}
        self._tracer = tracer
        self._config = config
        self.listener: AnswerListener = listener or _NoListener()
        # Per worker: the passage sequences sent there, and how much of them it kept.
        self.router = PrefixRouter(list(self._workers), policy=config.routing)
        self.cache = CacheEstimator()
        self.planning = RequestPlanning(config.planning, list(self._workers), fleet)
        runner = StageRunner(tracer, self.planning)
        self._retrieval = RetrievalSteps(runner, self.planning, config.retrieval, embeddings)
        self._generation = GenerationSteps(
            runner,
            self.planning,
            self._workers,
            self.router,
            PromptStage(template, config.prompt),
            self.cache,
            config.generation,
        )
        # Complete answers are cached only where decoding is greedy (the same every time).
        self.answer_cache = answer_cache if config.generation.temperature == 0.0 else None

    @property
    def retriever(self) -> Retriever:
        return self._retriever

    def swap_retriever(self, retriever: Retriever, answer_cache: AnswerStore | None) -> None:
        """Answer from another retriever (another index, or a reranker attached) from the next
        request on; requests under way finish on the one they started with. The answer cache
        changes with it (its fingerprint holds the index)."""
        self._retriever = retriever
        if self._config.generation.temperature == 0.0:
            self.answer_cache = answer_cache

    def hard_deadline(self, deadline: Deadline) -> Deadline:
        """The point past which the first token is given up on: budget x timeout factor (at
        least the retrieval floor)."""
        budget_s = max(
            (deadline.expires_at_s - deadline.started_at_s) * self._config.ttft_timeout_factor,
            # Retrieval may always use its floor: a sources-only answer to a tiny budget
            # still gets its sources.
            self._config.retrieval.floor_ms / 1000.0,
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
            self.listener.refused(
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
        retriever = self._retriever  # one index for the whole request
        cache_key, hit = None, None
        if self.answer_cache is not None:  # ahead of retrieval, and of refusing for load
            cache_key = self.answer_cache.key(request.query, request.top_k, "passages")
            hit = await self.answer_cache.get(cache_key)
            root.set_attribute("answer.cache_hit", hit is not None)
        answer = PreparedAnswer(
            request,
            deadline,
            root,
            self.planning.start(
                request.query,
                request.top_k,
                deadline.remaining_ms(),
                request.ttft_budget_ms,
                request.tier,
                reranker=retriever.rerank is not None,
                cache=self.cache,
                # A cached answer costs the workers nothing: it is not a load on them.
                arrival=hit is None,
            ),
            self.planning,
            self.listener,
            cache=self.cache,
            cache_key=cache_key,
        )
        if hit is not None:
            answer.cached, answer.sources = hit, hit.sources
            return answer
        plan = answer.plan
        # Refused (or sources only) when admission says no plan makes the budget.
        sources_only = plan.planner and not plan.admitted
        if sources_only and not request.allow_sources_only:
            if plan.idle_floor_ms > request.ttft_budget_ms:  # no load would make it fit
                raise InvalidRequestError(
                    f"`ttft_budget_ms` is {request.ttft_budget_ms}; even an idle worker takes "
                    f"about {plan.idle_floor_ms:.0f} ms to a first token here: ask for more "
                    "or allow a sources-only answer"
                )
            predicted = plan.plan.predicted_ms.total
            raise OverloadedError(
                f"no plan can make the {request.ttft_budget_ms} ms budget now (the smallest "
                f"is predicted to take {predicted:.0f} ms); retry later or allow a sources-only "
                "answer",
                retry_after_s=self.planning.retry_after_s(),
            )
        if sources_only:  # the sources a full answer would have had, no rerank, no prompt
            answer.plan = plan.with_knobs(
                rerank_depth=0, passages=request.top_k, retrieve_k=request.top_k
            )
        hard = self.hard_deadline(deadline)
        retrieved = await self._retrieval.run(retriever, answer, hard, rerank=not sources_only)
        answer.timings, answer.degraded = retrieved.timings, retrieved.degraded
        strength = evidence(
            request.query,
            [
                f"{sp.passage.title}\n{sp.passage.text}"
                for sp in retrieved.passages[: request.top_k]
            ],
        )
        root.set_attribute("answer.evidence", strength)
        if sources_only or strength < self._config.abstain_below:
            answer.sources = ranked_sources(
                retrieved.passages, request.top_k, self._config.snippet_chars
            )
            if sources_only:
                answer.plan = answer.plan.cut(
                    "passages", "no plan makes the budget: sources only", 0
                )
                answer.outcome = "sources_only"
            else:  # the service says it does not know; the model is not asked
                answer.outcome = "abstained"
            return answer
        await self._generate(answer, retriever, retrieved, hard)
        return answer

    async def _generate(
        self, answer: PreparedAnswer, retriever: Retriever, retrieved: Retrieved, hard: Deadline
    ) -> None:
        ids = [sp.passage.passage_id for sp in retrieved.passages]
        lookup = passage_lookup(retriever.index.passage_by_id)
        for attempt in range(2):  # a worker that is gone: once more, on another
            worker = self.router.choose(ids, foreign=self._config.prompt.adopt)
            try:
                answer.generation = await self._generation.open(
                    answer, hard, retrieved.passages, worker, lookup
                )
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
                continue
            except BaseException:
                self.router.release(worker)
                raise
            answer.sources = numbered_sources(
                retrieved.passages,
                answer.generation.prompt,
                self._config.snippet_chars,
                retriever.index.passage_by_id,
            )
            return
        raise AssertionError("unreachable")

    def events(self, prepared: PreparedAnswer) -> AsyncIterator[PipelineEvent]:
        """`plan`, `sources`, then token deltas (each finished sentence followed by its
        `citation`), then `done`; a failure mid-stream adds `error`."""
        return answer_events(prepared, self._config.citations, self.answer_cache)
