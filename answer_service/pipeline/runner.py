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

import asyncio
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
from answer_service.pipeline.events import AnswerRequest, PipelineEvent, Source
from answer_service.pipeline.forms import (
    FormConfig,
    FormPolicy,
    focused_excerpts,
    read_form_curves,
)
from answer_service.pipeline.generation import GenerationConfig, GenerationSteps
from answer_service.pipeline.planning import FleetRate, PlanningConfig, RequestPlanning
from answer_service.pipeline.ports import AnswerListener, AnswerStore, EmbeddingStore
from answer_service.pipeline.prepared import PreparedAnswer
from answer_service.pipeline.probe import FloorProbe
from answer_service.pipeline.request_plan import RequestPlan
from answer_service.pipeline.retrieval import RetrievalConfig, RetrievalSteps, Retrieved
from answer_service.pipeline.stage_runner import StageRunner
from answer_service.pipeline.values import (
    context_passages,
    end_refused,
    numbered_sources,
    passage_lookup,
    ranked_sources,
)
from budget import CacheEstimator, Deadline
from budget.forms import FormChoice, FormQuality
from generation.client import GenerationClient
from generation.prefix_routing import PrefixRouter, RoutingPolicy
from generation.prompt_layout import ChatTemplate, ContextPassage
from generation.stages import PromptConfig, PromptStage
from retrieval.retriever import Retriever
from retrieval.sentences.quote import select_quote

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
    forms: FormConfig = field(default_factory=FormConfig)
    # Quality per form and context size, for `auto` (measured for the served model).
    form_quality: FormQuality | None = None
    # A question whose sources are less likely than this to answer gets "I do not know"
    # without the model; None: the calibrated threshold; 0: never.
    abstain_below: float | None = None
    record_content: bool = False


def _refusal_code(exc: BaseException) -> str:
    """How a request that ended before streaming is counted: the service's own error code, a
    cancellation (the client went away), or "error" for anything unexpected."""
    if isinstance(exc, ServiceError):
        return exc.code
    if isinstance(exc, asyncio.CancelledError):
        return "cancelled"
    return "error"


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
        self._forms = FormPolicy(
            config.forms, self.planning, config.form_quality or read_form_curves()
        )
        # While the idle floor refuses, the worker's first token is timed again now and then
        # (set where the stage models start from a warm-up's measurement, which one busy moment
        # can make too slow; None: the shipped priors, nothing to re-measure).
        self.floor_probe: FloorProbe | None = None
        runner = StageRunner(tracer, self.planning)
        # The prompt layout, also timed by the warm-up's calibration.
        self.prompts = PromptStage(template, config.prompt)
        self._retrieval = RetrievalSteps(runner, self.planning, config.retrieval, embeddings)
        self._generation = GenerationSteps(
            runner,
            self.planning,
            self._workers,
            self.router,
            self.prompts,
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
            code = _refusal_code(exc)
            if code == "error":  # a bug, not an answer: say what it was
                logger.error(
                    "answer failed before streaming trace_id=%s error=%s",
                    format(root.get_span_context().trace_id, "032x"),
                    f"{type(exc).__name__}: {exc}",
                    exc_info=exc,
                )
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
        mode = self._forms.mode_of(request.answer_mode)
        cache_key, hit = None, None
        if self.answer_cache is not None:  # ahead of retrieval, and of refusing for load
            cache_key = self.answer_cache.key(request.query, request.top_k, mode)
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
        answer.plan = answer.plan.asked(mode)
        if hit is not None:
            answer.cached, answer.sources = hit, hit.sources
            answer.plan = answer.plan.answering(hit.form, "a complete answer from the cache")
            return answer
        plan = answer.plan
        # Admission: when no generation can make the budget, a quote if the mode allows one,
        # else sources only where asked for, else a refusal.
        no_model = plan.planner and not plan.admitted
        quote_instead = no_model and mode in ("auto", "quote")
        sources_only = no_model and not quote_instead
        if self.floor_probe and no_model and plan.idle_floor_ms > request.ttft_budget_ms:
            # Under the floor as the stage models see it: let them see the worker again now
            # and then, in case they learned it slower than it is (a warm-up on a busy machine).
            self.floor_probe.refused(plan.worker or self.planning.gate.least_loaded())
        if sources_only and not request.allow_sources_only:
            raise self._refusal(request, plan)
        if no_model:  # the sources a full answer would have had, no rerank, no prompt
            answer.plan = plan.with_knobs(
                rerank_depth=0, passages=request.top_k, retrieve_k=request.top_k
            )
        hard = self.hard_deadline(deadline)
        # Sources alone need no reranking and no reading; a quote instead reads where it can.
        retrieved = await self._retrieval.run(
            retriever, answer, hard, rerank=not no_model, read=not sources_only
        )
        answer.timings, answer.degraded = retrieved.timings, retrieved.degraded
        evidence = self._forms.evidence(retrieved.first_pass)
        root.set_attribute("answer.evidence", round(evidence, 4))
        if sources_only:
            answer.sources = self._ranked(retrieved, request.top_k)
            answer.plan = answer.plan.cut("passages", "no plan makes the budget: sources only", 0)
            answer.outcome = "sources_only"
            return answer
        if evidence < (below := self._forms.abstain_below(self._config.abstain_below)):
            # The service says it does not know; the model is not asked.
            answer.sources = self._ranked(retrieved, request.top_k)
            answer.plan = answer.plan.answering(
                "abstain",
                f"the sources are unlikely to answer ({evidence:.2f} < {below:.2f})",
            )
            answer.outcome = "abstained"
            return answer
        if quote_instead:
            choice = FormChoice("quote", 0, 0.0, 0.0, "no generation makes the budget: a quote")
        else:
            choice = self._forms.choose(
                answer, retrieved.first_pass, evidence, self.planning.gate.least_loaded()
            )
        answer.plan = answer.plan.answering(choice.form, choice.reason)
        if choice.form == "quote":
            answer.quote = tuple(
                select_quote(retrieved.sentences, self._forms.config.quote, request.query)
            )
            answer.sources = self._ranked(retrieved, request.top_k)
            if not answer.quote:  # nothing quotable (code, fragments): say so
                answer.outcome = "abstained"
            return answer
        if choice.form == "focused":
            context = focused_excerpts(
                retrieved.sentences, max(choice.context, 1), self._forms.config.neighbours
            )
        else:
            context = context_passages(retrieved.passages)
        if plan.mode == "auto" and choice.context:
            answer.plan = answer.plan.with_knobs(passages=min(choice.context, len(context)))
        elif choice.form == "focused":
            answer.plan = answer.plan.with_knobs(passages=len(context))
        await self._generate(answer, retriever, retrieved, context, hard)
        return answer

    def _ranked(self, retrieved: Retrieved, top_k: int) -> tuple[Source, ...]:
        """The first `top_k` in retrieval order (a quote cites passage n as source n)."""
        return ranked_sources(retrieved.passages, top_k, self._config.snippet_chars)

    def _refusal(self, request: AnswerRequest, plan: RequestPlan) -> ServiceError:
        if plan.idle_floor_ms > request.ttft_budget_ms:  # no load would make it fit
            return InvalidRequestError(
                f"`ttft_budget_ms` is {request.ttft_budget_ms}; even an idle worker takes "
                f"about {plan.idle_floor_ms:.0f} ms to a first token here: ask for more, "
                "ask for `answer_mode` quote or auto, or allow a sources-only answer"
            )
        predicted = plan.plan.predicted_ms.total
        return OverloadedError(
            f"no plan can make the {request.ttft_budget_ms} ms budget now (the smallest is "
            f"predicted to take {predicted:.0f} ms); retry later, ask for `answer_mode` quote "
            "or auto, or allow a sources-only answer",
            retry_after_s=self.planning.retry_after_s(),
        )

    async def _generate(
        self,
        answer: PreparedAnswer,
        retriever: Retriever,
        retrieved: Retrieved,
        context: Sequence[ContextPassage],
        hard: Deadline,
    ) -> None:
        ids = [p.source_id for p in context]
        lookup = passage_lookup(retriever.index.passage_by_id)
        for attempt in range(2):  # a worker that is gone: once more, on another
            worker = self.router.choose(ids, foreign=self._config.prompt.adopt)
            try:
                answer.generation = await self._generation.open(
                    answer, hard, context, worker, lookup
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
