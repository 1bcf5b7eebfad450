"""The answer pipeline: every step of a request is a stage run by the one `StageRunner` under
its slice of the request's deadline, and after each `budget/` gives back the next plan.

    (rewrite →) cache → (admit) → embed → search → rerank → sentences → evidence (→ abstain)
          → form → read → quote                                (an answer without the model)
                 → (read, focused only →) slot → prompt → generate (send) → first_token
                                                                (answer_stream.py)

The reader orders sentences for an answer made of them (a quote, focused excerpts), so it runs
after the form is chosen: abstention and the form read the scorer's own order, and an answer
over whole passages never waits for it.

A request with history first has its query made standalone (`rewrite`, model-free): retrieval
and the prompt see the follow-up as searched, reading (the sentences, the reader, the form, the
quote) the follow-up as asked, abstention the stronger of both, the answer cache both
(`Queries`). `prepare()` does everything
that can still fail with a plain HTTP error (the answer cache, the plan and its admission,
retrieval, a generation slot, the prompt, and opening the SGLang stream up to its response
headers); `events()` then streams `plan`, `sources`, the answer and `done` (answer_stream.py).
A plan may end without the model: a cached answer, sources only, a quote, or an abstention when
the evidence is weak. A stage that overruns its slice is cut (rerank → retrieval order, fewer
passages) and generation re-planned with the time left. The pipeline decides nothing itself:
admission, cuts, abstention and the form come back from `budget/` as plans. No FastAPI here:
`eval/` runs the same pipeline in-process.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
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
from answer_service.pipeline.events import (
    AnswerRequest,
    CachedAnswer,
    PipelineEvent,
    Queries,
    ShortAnswer,
    Source,
)
from answer_service.pipeline.forms import (
    FormConfig,
    FormInput,
    FormPolicy,
    focused_excerpts,
    read_form_curves,
)
from answer_service.pipeline.generation_steps import GenerationConfig, GenerationSteps
from answer_service.pipeline.planning import FleetRate, PlanningConfig, RequestPlanning
from answer_service.pipeline.ports import AnswerListener, AnswerStore, EmbeddingStore
from answer_service.pipeline.prepared import AnswerHandle, Generation, PreparedAnswer, SentAhead
from answer_service.pipeline.probe import FloorProbe
from answer_service.pipeline.retrieval_steps import RetrievalConfig, RetrievalSteps, Retrieved
from answer_service.pipeline.stage_runner import StageRunner
from answer_service.pipeline.stages import (
    AnswerCacheStage,
    EvidenceStage,
    FormStage,
    QuoteRequest,
    QuoteStage,
)
from answer_service.pipeline.values import (
    context_passages,
    end_refused,
    numbered_sources,
    passage_lookup,
    ranked_sources,
)
from budget import CacheEstimator, Deadline
from budget.forms import AnswerMode, FormQuality
from budget.request_plan import RequestPlan
from budget.stage import Stage
from generation.client import GenerationClient
from generation.prefix_routing import PrefixRouter, RoutingPolicy
from generation.prompt_layout import ChatTemplate, ContextPassage
from generation.stages import PromptConfig, PromptStage
from retrieval.passage import ScoredPassage
from retrieval.query_rewrite import (
    Conversation,
    FollowUpRewriter,
    RewriteStage,
    UniformWeights,
)
from retrieval.retriever import Retriever
from retrieval.search.filters import allowed_lookup
from retrieval.sentences.quote import QuotedSentence
from retrieval.stages import ShortAnswerRequest

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


@dataclass(frozen=True, slots=True)
class _Outcome:
    """What every prepared answer of a request shares."""

    request: AnswerRequest
    queries: Queries
    deadline: Deadline
    root: Span
    cache_key: str | None


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
        query_stages: Sequence[Stage[str, str]] = (),
    ) -> None:
        """`query_stages`: stages that turn the question into the one searched and answered
        (a rewrite, say), run in order after admission and before retrieval; each is one more
        stage for the runner, with its span and slice, and nothing else to wire."""
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
        self._runner = StageRunner(tracer, self.planning)
        # The prompt layout, also timed by the warm-up's calibration.
        self.prompts = PromptStage(template, config.prompt)
        self._retrieval = RetrievalSteps(self._runner, self.planning, config.retrieval, embeddings)
        self._generation = GenerationSteps(
            self._runner,
            self.planning,
            self._workers,
            self.router,
            self.prompts,
            self.cache,
            config.generation,
        )
        self._query_stages = tuple(query_stages)
        self._evidence = EvidenceStage(self._forms)
        self._form_stage = FormStage(self._forms)
        self._quote = QuoteStage(self._forms.config.quote)
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
        run = self._runner.run
        hard = self.hard_deadline(deadline)
        queries = Queries.of(request.query)
        if request.history:  # ahead of the cache: a follow-up's key is what it searches
            queries = await self._rewritten(request, retriever, hard, root)
        cache_key, hit = None, None
        if self.answer_cache is not None:  # ahead of retrieval, and of refusing for load
            scope = request.passage_filter.key if request.passage_filter else ""
            read = queries.read if queries.split else None
            cache_key = self.answer_cache.key(queries.searched, request.top_k, mode, scope, read)
            hit = (
                await self._runner.measure(AnswerCacheStage(self.answer_cache), cache_key, hard)
            ).value
            if hit is not None and not _readable(hit, retriever, request):
                hit = None
            root.set_attribute("answer.cache_hit", hit is not None)
        plan = self.planning.start(
            queries.searched,
            request.top_k,
            deadline.remaining_ms(),
            request.ttft_budget_ms,
            request.tier,
            reranker=retriever.rerank is not None,
            cache=self.cache,
            mode=mode,
            quote_expected=self._forms.quote_expected,
            # A cached answer costs the workers nothing: it is not a load on them.
            arrival=hit is None,
        ).admit(mode, request.top_k, request.allow_sources_only)
        outcome = _Outcome(request, queries, deadline, root, cache_key)
        if hit is not None:
            return self._prepared(outcome, plan.from_cache(hit.form), hit.sources, cached=hit)
        if (
            self.floor_probe
            and plan.route != "model"
            and plan.idle_floor_ms > request.ttft_budget_ms
        ):
            # Under the floor as the stage models see it: let them see the worker again now
            # and then, in case they learned it slower than it is (a warm-up on a busy machine).
            self.floor_probe.refused(plan.worker or self.planning.gate.least_loaded())
        if plan.route == "refuse":
            raise self._refusal(request, plan)
        for stage in self._query_stages:  # they change what is searched and prompted
            rewritten, plan = await run(stage, queries.searched, deadline, plan)
            queries = dataclasses.replace(queries, searched=rewritten.value)
        outcome = dataclasses.replace(outcome, queries=queries)
        # Where whole passages are asked for and a slot is free, their prompt is sent as soon as
        # they are final, before the sentences are scored: its prefill runs while the
        # sentences, the evidence and the form are decided, and is aborted if they decide the
        # model is not needed. Where they will likely be generated over, their prompt pieces
        # are made in a thread meanwhile.
        ahead = SentAhead()
        prefetched: list[asyncio.Future[None]] = []
        on_passages: Callable[[list[ScoredPassage], RequestPlan], Awaitable[None]] | None = None
        if plan.sends_ahead(self.planning.gate.requests_ahead(self.planning.gate.least_loaded())):

            async def on_passages(passages: list[ScoredPassage], at: RequestPlan) -> None:
                context = context_passages(passages)
                await ahead.send(self._open(outcome, at, retriever, context, hard))

        elif plan.route == "model" and (
            mode == "passages" or (mode == "auto" and not self._forms.quote_expected)
        ):

            async def on_passages(passages: list[ScoredPassage], at: RequestPlan) -> None:
                prefetched.append(self.prompts.prefetch(context_passages(passages)))

        try:
            return await self._decide(
                outcome, plan, retriever, mode, hard, on_passages, ahead, prefetched
            )
        finally:
            if ahead.sent:  # not taken: the answer needs no model, or the request failed
                ahead.abandon(self.router)

    async def _decide(
        self,
        outcome: _Outcome,
        plan: RequestPlan,
        retriever: Retriever,
        mode: AnswerMode,
        hard: Deadline,
        on_passages: Callable[[list[ScoredPassage], RequestPlan], Awaitable[None]] | None,
        ahead: SentAhead,
        prefetched: list[asyncio.Future[None]],
    ) -> PreparedAnswer:
        """Retrieval, the evidence, the form and the answer in that form."""
        request, queries, deadline, root = (
            outcome.request,
            outcome.queries,
            outcome.deadline,
            outcome.root,
        )
        run = self._runner.run
        # Sources alone need no reranking; a quote reranks as deep as its plan bought.
        retrieved, plan = await self._retrieval.run(
            retriever,
            request,
            queries,
            plan,
            deadline,
            hard,
            rerank=plan.route != "sources_only",
            on_passages=on_passages,
        )
        readings = [retrieved.first_pass]
        if retrieved.searched_pass:  # a follow-up: the stronger of its two readings
            readings.append(retrieved.searched_pass)
        evidence, plan = await run(self._evidence, readings, deadline, plan)
        root.set_attribute("answer.evidence", round(evidence.value, 4))
        plan = plan.after_evidence(
            evidence.value, self._forms.abstain_below(self._config.abstain_below)
        )
        sources = self._ranked(retrieved, request.top_k)
        if plan.route == "sources_only":
            return self._prepared(outcome, plan, sources, answered="sources_only")
        if plan.abstains:  # the service says it does not know; the model is not asked
            wasted = ahead.abandon(self.router)
            root.set_attribute("answer.wasted_prefill_tokens", round(wasted))
            return self._prepared(outcome, plan, sources, answered="abstained", wasted=wasted)
        choice = plan.forced_form()
        if choice is None:
            worker = self.planning.gate.least_loaded()
            chosen, plan = await run(
                self._form_stage,
                FormInput(
                    plan,
                    queries.read,
                    retrieved.first_pass,
                    evidence.value,
                    worker,
                    self.cache.cached_share(worker),
                ),
                deadline,
                plan,
            )
            choice = chosen.value
        if choice.form in ("quote", "focused"):  # made of sentences: read them first
            retrieved, plan = await self._retrieval.read(
                retriever, queries.read, retrieved, plan, deadline, hard
            )
        if choice.form == "quote":
            plan = plan.with_form(choice, 0)
            quoted, plan = await run(
                self._quote, QuoteRequest(queries.read, retrieved.sentences), deadline, plan
            )
            # Nothing quotable (code, fragments): say so.
            answered = "ok" if quoted.value else "abstained"
            short = await self._short_answer(retriever, queries.read, quoted.value, deadline)
            return self._prepared(
                outcome, plan, sources, quote=quoted.value, answered=answered, short=short
            )
        if choice.form == "focused":
            context = focused_excerpts(
                retrieved.sentences, max(choice.context, 1), self._forms.config.neighbours
            )
        else:
            context = context_passages(retrieved.passages)
        plan = plan.with_form(choice, len(context))
        if choice.form == "passages" and ahead.sent:
            generation, sent = ahead.take()
            return self._generated(outcome, plan.joined(sent), retriever, retrieved, generation)
        ready = prefetched[0] if prefetched and choice.form == "passages" else None
        generation, plan = await self._open(outcome, plan, retriever, context, hard, ready)
        return self._generated(outcome, plan, retriever, retrieved, generation)

    async def _rewritten(
        self, request: AnswerRequest, retriever: Retriever, hard: Deadline, root: Span
    ) -> Queries:
        """The follow-up searched as made standalone from its history (the `rewrite` stage,
        model-free: microseconds, so it is spanned and timed but not planned) and read as
        asked, with the entities it points back to."""
        lexical = retriever.index.lexical
        weights = lexical if lexical is not None else UniformWeights()
        stage = RewriteStage(FollowUpRewriter(weights))
        conversation = Conversation(request.query, request.history)
        rewrite = (await self._runner.measure(stage, conversation, hard)).value
        root.set_attribute("answer.rewritten", rewrite.query != request.query)
        if self._config.record_content:
            root.set_attribute("answer.searched_query", rewrite.query)
            root.set_attribute("answer.read_query", rewrite.read_query)
        return Queries(searched=rewrite.query, read=rewrite.read_query)

    async def _short_answer(
        self, retriever: Retriever, query: str, quote: Sequence[QuotedSentence], deadline: Deadline
    ) -> ShortAnswer | None:
        """The short answer in the quote's first (likeliest) sentence where the span head is
        sure of one and time is left (the `short_answer` stage, not planned)."""
        if retriever.short_answer is None or not quote:
            return None
        request = ShortAnswerRequest(query, quote[0].text)
        span = (await self._runner.measure(retriever.short_answer, request, deadline)).value
        return None if span is None else ShortAnswer(span.text, span.start, span.end)

    def _prepared(
        self,
        outcome: _Outcome,
        plan: RequestPlan,
        sources: tuple[Source, ...],
        *,
        answered: str = "ok",
        cached: CachedAnswer | None = None,
        quote: tuple[QuotedSentence, ...] = (),
        short: ShortAnswer | None = None,
        router: PrefixRouter | None = None,
        generation: Generation | None = None,
        wasted: float = 0.0,
    ) -> PreparedAnswer:
        return PreparedAnswer(
            outcome.request,
            outcome.queries,
            outcome.deadline,
            outcome.root,
            plan,
            self.planning,
            self.listener,
            AnswerHandle(plan, answered, router, generation),
            cache=self.cache,
            sources=sources,
            cached=cached,
            cache_key=outcome.cache_key,
            quote=quote,
            short_answer=short,
            wasted_prefill_tokens=wasted,
        )

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

    async def _open(
        self,
        outcome: _Outcome,
        plan: RequestPlan,
        retriever: Retriever,
        context: Sequence[ContextPassage],
        hard: Deadline,
        ready: Awaitable[None] | None = None,
    ) -> tuple[Generation, RequestPlan]:
        """The generation's slot, prompt and open stream on the worker the router chooses
        (once more on another where that worker is gone)."""
        request = outcome.request
        ids = [p.source_id for p in context]
        # A remembered prefix may bring along passages another request retrieved: only those
        # this request may read are adopted (and shown as its sources).
        lookup = passage_lookup(
            allowed_lookup(retriever.index.passage_by_id, request.passage_filter)
        )
        for attempt in range(2):  # a worker that is gone: once more, on another
            worker = self.router.choose(ids, foreign=self._config.prompt.adopt)
            try:
                return await self._generation.open(
                    request,
                    outcome.queries.searched,
                    plan,
                    outcome.deadline,
                    hard,
                    context,
                    worker,
                    lookup,
                    ready,
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
            except BaseException:
                self.router.release(worker)
                raise
        raise AssertionError("unreachable")

    def _generated(
        self,
        outcome: _Outcome,
        plan: RequestPlan,
        retriever: Retriever,
        retrieved: Retrieved,
        generation: Generation,
    ) -> PreparedAnswer:
        find = allowed_lookup(retriever.index.passage_by_id, outcome.request.passage_filter)
        sources = numbered_sources(
            retrieved.passages, generation.prompt, self._config.snippet_chars, find
        )
        return self._prepared(outcome, plan, sources, router=self.router, generation=generation)

    def events(self, prepared: PreparedAnswer) -> AsyncIterator[PipelineEvent]:
        """`plan`, `sources`, then token deltas (each finished sentence followed by its
        `citation`), then `done`; a failure mid-stream adds `error`."""
        return answer_events(prepared, self._config.citations, self.answer_cache, self._runner)


def _readable(hit: CachedAnswer, retriever: Retriever, request: AnswerRequest) -> bool:
    """Every source of a cached answer is in the index served now and one the request may
    read. Its key already holds the request's filter; this holds whatever wrote the entry."""
    find = allowed_lookup(retriever.index.passage_by_id, request.passage_filter)
    return all(find(source.passage_id) is not None for source in hit.sources)
