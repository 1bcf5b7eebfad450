"""One request's plan as a value: what the planner chose at arrival, the knobs as they stand
after any cut, the time each stage really took. Every change returns a new plan (a cut, a
stage's time, a re-plan), so what the request did is the last plan and nothing edits it behind
the runner's back. It ends as the `PlanRecord` of the `plan` event and the root span.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from answer_service.pipeline.events import Cut, PlanRecord
from budget.forms import AnswerMode
from budget.planner import Knobs, Plan, QualityCurve, Stage, StageTimes

# Stages whose cut changes no knob of the plan.
_KNOBLESS = frozenset({"read"})


@dataclass(frozen=True, slots=True)
class RequestPlan:
    plan: Plan
    planner: bool
    tier: str
    budget_ms: float
    knobs: Knobs
    actual: StageTimes = field(default_factory=StageTimes)
    cuts: tuple[Cut, ...] = ()
    queue_wait_ms: float = 0.0
    worker: str = ""
    # The smallest plan's median time to a first token on an idle worker, as the stage models
    # (calibrated at warm-up) predict it: a budget under it is the request's problem, not the
    # load's.
    idle_floor_ms: float = 0.0
    # Whether admission lets it in.
    admitted: bool = True
    mode: AnswerMode = "auto"
    form: str = "passages"
    form_reason: str = ""

    @classmethod
    def of(cls, plan: Plan, planner: bool, tier: str, budget_ms: float) -> RequestPlan:
        return cls(plan, planner, tier, budget_ms, plan.knobs)

    def slice_ms(self, *stages: Stage) -> float:
        """The stages' predicted time plus their share of the plan's spare time."""
        predicted = self.plan.predicted_ms
        total = predicted.total
        spare = max(self.plan.available_ms - total, 0.0)
        stage_ms = sum(predicted.of(stage) for stage in stages)
        return stage_ms * (1.0 + spare / total) if total > 0 else stage_ms

    def spent(self, **stages_ms: float) -> RequestPlan:
        return dataclasses.replace(self, actual=dataclasses.replace(self.actual, **stages_ms))

    def cut(self, stage: str, reason: str, done: int) -> RequestPlan:
        """The plan with the knob `stage` sets (the rerank depth, or for any other stage the
        passages) cut to `done`, and the cut recorded under the knob's name. A stage that sets
        no knob (the sentence reader: it reorders, it does not size) is only recorded."""
        if stage in _KNOBLESS:
            return dataclasses.replace(self, cuts=(*self.cuts, Cut(stage, reason, 0, 0)))
        knob, field = ("rerank", "rerank_depth") if stage == "rerank" else ("passages", "passages")
        planned = getattr(self.knobs, field)
        return dataclasses.replace(
            self,
            knobs=dataclasses.replace(self.knobs, **{field: done}),
            cuts=(*self.cuts, Cut(knob, reason, planned, done)),
        )

    def with_knobs(self, **changes: int) -> RequestPlan:
        return dataclasses.replace(self, knobs=dataclasses.replace(self.knobs, **changes))

    def asked(self, mode: AnswerMode) -> RequestPlan:
        return dataclasses.replace(self, mode=mode)

    def answering(self, form: str, reason: str) -> RequestPlan:
        """The re-plan after retrieval: the form that will answer, and why."""
        return dataclasses.replace(self, form=form, form_reason=reason)

    def queued(self, worker: str, waited_ms: float) -> RequestPlan:
        return dataclasses.replace(self, worker=worker, queue_wait_ms=waited_ms)

    def record(self, quality: QualityCurve) -> PlanRecord:
        return PlanRecord(
            planner=self.planner,
            tier=self.tier,
            budget_ms=self.budget_ms,
            knobs=self.knobs,
            initial=self.plan.knobs,
            quality=quality.score(self.knobs.rerank_depth, self.knobs.passages),
            predicted_ms=self.plan.predicted_ms,
            actual_ms=self.actual,
            cuts=self.cuts,
            queue_wait_ms=self.queue_wait_ms,
            worker=self.worker,
            form=self.form,
            mode=self.mode,
            form_reason=self.form_reason,
            floor_ms=self.idle_floor_ms,
        )
