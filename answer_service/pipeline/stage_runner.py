"""The one place a stage is run: under its deadline slice, in a span of its own with its budget,
sizes and outcome; its work and time teach the planner's model of the stage, and `budget/`
returns the request's next plan from its result (`RequestPlan.after`: its time, its cut).
Stages themselves (retrieval/stages.py, generation/stages.py, pipeline/stages.py) know nothing
of spans or plans; the runner writes nothing but the span."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol, TypeVar

from opentelemetry import trace
from opentelemetry.trace import Span, Status, StatusCode, Tracer

from budget import Deadline
from budget.planner import STAGES, StageName
from budget.request_plan import RequestPlan
from budget.stage import AttributeValue, Stage, StageResult

In = TypeVar("In")
Out = TypeVar("Out")


class StageObserver(Protocol):
    def observe(
        self, stage: StageName, work: float, elapsed_ms: float, worker: str = ""
    ) -> None: ...


class StageRunner:
    def __init__(self, tracer: Tracer, observer: StageObserver) -> None:
        self._tracer = tracer
        self._observer = observer

    async def run(
        self,
        stage: Stage[In, Out],
        request: In,
        deadline: Deadline,
        plan: RequestPlan,
        *,
        attributes: Mapping[str, AttributeValue] | None = None,
        worker: str = "",
        parent: Span | None = None,
    ) -> tuple[StageResult[Out], RequestPlan]:
        """The stage's result and the plan that follows it. `parent`: the request's span where
        it is not the current one (the stream's stages run after `prepare` has returned)."""
        result, plan, span = await self.start(
            stage, request, deadline, plan, attributes=attributes, worker=worker, parent=parent
        )
        span.end()
        return result, plan

    async def measure(
        self, stage: Stage[In, Out], request: In, deadline: Deadline
    ) -> StageResult[Out]:
        """A stage run outside a request's plan, timed, spanned and teaching the planner's
        model the same way: the answer cache's lookup (whose answer decides whether a request
        counts as an arrival at all) and the warm-up's calibration (`budget.stage.StageRun`)."""
        span = self._tracer.start_span(
            stage.name, attributes={"answer.stage.budget_ms": deadline.remaining_ms()}
        )
        with trace.use_span(span, end_on_exit=True, record_exception=True):
            result = await stage.run(request, deadline)
            span.set_attributes(dict(result.attributes))
            span.set_attribute("answer.stage.elapsed_ms", result.elapsed_ms)
        self._observe(stage.name, result, "")
        return result

    async def start(
        self,
        stage: Stage[In, Out],
        request: In,
        deadline: Deadline,
        plan: RequestPlan,
        *,
        attributes: Mapping[str, AttributeValue] | None = None,
        worker: str = "",
        parent: Span | None = None,
    ) -> tuple[StageResult[Out], RequestPlan, Span]:
        """`run`, leaving the span open for the caller to end (a generation's span lasts as
        long as its stream). `worker`: the SGLang worker whose model the stage teaches (the
        first token's is kept per worker)."""
        span = self._tracer.start_span(
            stage.name,
            context=trace.set_span_in_context(parent) if parent is not None else None,
            attributes={"answer.stage.budget_ms": deadline.remaining_ms(), **(attributes or {})},
        )
        try:
            with trace.use_span(span, end_on_exit=False, record_exception=False):
                result = await stage.run(request, deadline)
        except BaseException as exc:
            span.record_exception(exc)
            span.set_status(Status(StatusCode.ERROR, str(exc)[:200]))
            span.end()
            raise
        span.set_attributes(dict(result.attributes))
        span.set_attribute("answer.stage.elapsed_ms", result.elapsed_ms)
        if result.cut is not None:
            span.set_attribute("answer.degraded", result.cut.reason)
        self._observe(stage.name, result, worker)
        return result, plan.after(stage.name, result), span

    def _observe(self, name: str, result: StageResult[object], worker: str) -> None:
        """A planned stage's work and time teach its model (a cache hit or a skip, no work,
        teaches nothing)."""
        planned = _planned(name)
        if planned is not None and result.work is not None:
            self._observer.observe(planned, result.work, result.elapsed_ms, worker)


def _planned(name: str) -> StageName | None:
    return next((stage for stage in STAGES if stage == name), None)
