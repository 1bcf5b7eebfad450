"""The one place a stage is run: under its deadline slice, in a span of its own with its budget,
sizes and outcome; its time and any cut go into the request's plan, and its work and time teach
the planner's model of the stage. Stages themselves (retrieval/stages.py, generation/stages.py)
know nothing of spans or plans."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol, TypeVar

from opentelemetry import trace
from opentelemetry.trace import Span, Status, StatusCode, Tracer

from answer_service.pipeline.request_plan import RequestPlan
from budget import Deadline
from budget.planner import STAGES
from budget.planner import Stage as PlannedStage
from budget.stage import AttributeValue, Stage, StageResult

In = TypeVar("In")
Out = TypeVar("Out")


class PlanHolder(Protocol):
    """The request whose plan a stage's result changes."""

    plan: RequestPlan


class StageObserver(Protocol):
    def observe(
        self, stage: PlannedStage, work: float, elapsed_ms: float, worker: str = ""
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
        holder: PlanHolder,
        *,
        attributes: Mapping[str, AttributeValue] | None = None,
    ) -> StageResult[Out]:
        result, span = await self.start(stage, request, deadline, holder, attributes=attributes)
        span.end()
        return result

    async def start(
        self,
        stage: Stage[In, Out],
        request: In,
        deadline: Deadline,
        holder: PlanHolder,
        *,
        attributes: Mapping[str, AttributeValue] | None = None,
    ) -> tuple[StageResult[Out], Span]:
        """`run`, leaving the span open for the caller to end (a generation's span lasts as
        long as its stream)."""
        span = self._tracer.start_span(
            stage.name,
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
        planned = _planned(stage.name)
        if planned is not None:
            if result.work is not None:
                self._observer.observe(planned, result.work, result.elapsed_ms)
            holder.plan = holder.plan.spent(**{planned: result.elapsed_ms})
        if result.cut is not None:
            holder.plan = holder.plan.cut(stage.name, result.cut.reason, result.cut.done)
        return result, span


def _planned(name: str) -> PlannedStage | None:
    return next((stage for stage in STAGES if stage == name), None)
