"""One request's plan as a value, and every decision that changes it.

The planner chooses a plan when a request arrives (`RequestPlan.at_arrival`); from then on each
step of the request asks this module what comes next and gets a new plan back: admission
(`admit`: the model, a quote instead, sources only, or a refusal), each stage's result
(`after`: its time, and the cut it reports), the rerank that no longer fits (`before_rerank`),
the evidence that decides abstention (`after_evidence`), the answer form (`with_form`), the
generation slot (`queued`) and the first token (`first_token_at`). Nothing outside `budget/`
builds or edits a plan (tests/unit/test_plan_ownership.py), so what a request did is its last
plan. It ends as the `PlanRecord` of the `plan` event and the root span.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from budget.forms import AnswerMode, FormChoice
from budget.planner import Knobs, Plan, QualityCurve, StageName, StageTimes
from budget.stage import StageResult

# Stages whose time the plan records (the ones it predicts, and the reader and the stream).
_TIMED = frozenset({"embed", "search", "rerank", "sentences", "read", "prompt", "first_token"})
# The knob a stage's cut changes, as the cut is recorded and the field it sets: the rerank its
# depth, the prompt (and sources only) the passages. Any other stage's cut (the sentence reader
# reorders, it does not size) is only recorded.
_KNOBS = {
    "rerank": ("rerank", "rerank_depth"),
    "prompt": ("passages", "passages"),
    "passages": ("passages", "passages"),
}

Route = Literal["model", "quote", "sources_only", "refuse"]
"""How admission lets a request in: to the model; a quote instead (no generation can make the
budget, and the mode allows one); the sources alone (asked for); or not at all."""


@dataclass(frozen=True, slots=True)
class Cut:
    """Work the plan had that the request did not get, and why."""

    stage: str
    reason: str
    planned: int
    done: int

    @classmethod
    def from_json(cls, raw: Mapping[str, object]) -> Cut:
        """A cut as `dataclasses.asdict` wrote it (a stored request summary)."""
        return cls(
            str(raw["stage"]), str(raw["reason"]), int(str(raw["planned"])), int(str(raw["done"]))
        )


@dataclass(frozen=True, slots=True)
class PlanRecord:
    """What the request was planned to do and what it did; the `plan` event."""

    planner: bool
    tier: str
    budget_ms: float
    knobs: Knobs
    # The plan made at arrival, before any cut.
    initial: Knobs
    quality: float
    predicted_ms: StageTimes
    actual_ms: StageTimes
    cuts: tuple[Cut, ...]
    queue_wait_ms: float
    worker: str
    # The answer form chosen (quote, focused, passages; abstain or sources_only when the model
    # was not asked for another reason), for which mode, and why.
    form: str = "passages"
    mode: str = "auto"
    form_reason: str = ""
    # The smallest generated answer's typical time to a first token on an idle worker.
    floor_ms: float = 0.0


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
    # Whether admission lets it in to the model.
    admitted: bool = True
    route: Route = "model"
    mode: AnswerMode = "auto"
    form: str = "passages"
    form_reason: str = ""
    # Under `auto`, the plan of a quote, for when no generation can make the budget.
    quote: Plan | None = None

    @classmethod
    def at_arrival(
        cls,
        plan: Plan,
        *,
        quote: Plan | None = None,
        planner: bool,
        tier: str,
        budget_ms: float,
        requests_ahead: float,
        idle_floor_ms: float,
    ) -> RequestPlan:
        """The plan the planner chose at arrival. Admission: with nothing queued, a plan whose
        typical time makes the budget is tried (refusing on the p90 refused too many at low
        load); behind a queue, whose own time is less certain, only one that makes it at the
        admission quantile with its margins."""
        admitted = plan.admissible or (plan.likely and requests_ahead == 0)
        return cls(
            plan,
            planner,
            tier,
            budget_ms,
            plan.knobs,
            idle_floor_ms=idle_floor_ms,
            admitted=admitted,
            quote=quote,
        )

    # -- decisions: each returns the next plan -------------------------------------------------

    def admit(self, mode: AnswerMode, top_k: int, allow_sources_only: bool) -> RequestPlan:
        """How the request goes on, for the mode it asked: when no generation can make the
        budget, a quote if the mode allows one, else sources only where asked for, else a
        refusal. A request kept from the model gets the sources a full answer would have had,
        `top_k` passages; a quote gets the rerank depth its own plan bought (none without one)."""
        no_model = self.planner and not self.admitted
        route: Route = "model"
        if no_model:
            if mode in ("auto", "quote"):
                route = "quote"
            else:
                route = "sources_only" if allow_sources_only else "refuse"
        admitted = dataclasses.replace(self, mode=mode, route=route)
        if route == "quote" and self.quote is not None:
            return dataclasses.replace(admitted, plan=self.quote, knobs=self.quote.knobs)
        if no_model:
            return admitted._with_knobs(rerank_depth=0, passages=top_k, retrieve_k=top_k)
        return admitted

    def from_cache(self, form: str) -> RequestPlan:
        return self._answering(form, "a complete answer from the cache")

    def retrieving(self, top_k: int) -> RequestPlan:
        """The sources list the best `top_k` even when the prompt gets fewer: k costs little."""
        return self._with_knobs(retrieve_k=max(self.knobs.retrieve_k, top_k))

    def after(self, stage: str, result: StageResult[object]) -> RequestPlan:
        """A stage's result: its time (for the stages the plan records) and its cut."""
        plan = self
        if stage in _TIMED:
            plan = plan._spent(**{stage: result.elapsed_ms})
        if result.cut is not None:
            plan = plan._cut(stage, result.cut.reason, result.cut.done)
        return plan

    def before_rerank(self, available_ms: float) -> RequestPlan:
        """The rerank cut to nothing when retrieval overran its slice: what is left of the
        time (`available_ms`, less the margins) no longer holds the rerank and what follows."""
        predicted = self.plan.predicted_ms
        rest_ms = predicted.rerank + predicted.prompt + predicted.first_token
        if not self.planner or self.knobs.rerank_depth == 0 or available_ms >= rest_ms:
            return self
        return self._cut("rerank", "retrieval overran its slice: no time left to rerank", 0)

    def after_evidence(self, evidence: float, below: float) -> RequestPlan:
        """Sources only as admitted; else "I do not know" when the sources are unlikely to
        answer (the model is not asked); else the plan as it was."""
        if self.route == "sources_only":
            return self._cut("passages", "no plan makes the budget: sources only", 0)
        if evidence < below:
            reason = f"the sources are unlikely to answer ({evidence:.2f} < {below:.2f})"
            return self._answering("abstain", reason)
        return self

    @property
    def abstains(self) -> bool:
        return self.form == "abstain"

    def forced_form(self) -> FormChoice | None:
        """The form admission already fixed (a quote instead of a generation), if it did."""
        if self.route == "quote":
            return FormChoice("quote", 0, 0.0, 0.0, "no generation makes the budget: a quote")
        return None

    def with_form(self, choice: FormChoice, context: int) -> RequestPlan:
        """The re-plan after retrieval: the form that answers and why, and the passages of the
        `context` it will be given (under `auto`, the size the choice measured best)."""
        plan = self._answering(choice.form, choice.reason)
        if choice.form == "quote":
            return plan
        if self.mode == "auto" and choice.context:
            return plan._with_knobs(passages=min(choice.context, context))
        if choice.form == "focused":
            return plan._with_knobs(passages=context)
        return plan

    def sends_ahead(self, requests_ahead: float) -> bool:
        """Whether the prompt is sent as soon as its passages are final, so that its prefill
        overlaps the sentences, the evidence and the form, and is aborted if they decide on "I
        do not know". Only where the form is known before them (whole passages asked for) and a
        slot is free now: behind a queue the overlap gains nothing, and a prefill that may be
        wasted would hold up the requests queued after it."""
        return self.route == "model" and self.mode == "passages" and requests_ahead == 0

    def joined(self, sent: RequestPlan) -> RequestPlan:
        """This plan, decided while the prompt of `sent` was being laid out and sent ahead
        (`sends_ahead`): its own form and times, with the worker, queue, passages, cuts and
        prompt time of the prompt that went."""
        cuts = (*self.cuts, *(cut for cut in sent.cuts if cut not in self.cuts))
        return dataclasses.replace(
            self,
            knobs=dataclasses.replace(self.knobs, passages=sent.knobs.passages),
            cuts=cuts,
            worker=sent.worker,
            queue_wait_ms=sent.queue_wait_ms,
            actual=dataclasses.replace(self.actual, prompt=sent.actual.prompt),
        )

    def queued(self, worker: str, waited_ms: float) -> RequestPlan:
        return dataclasses.replace(self, worker=worker, queue_wait_ms=waited_ms)

    def first_token_at(self, elapsed_ms: float) -> RequestPlan:
        """The time from sending the prompt to its first token."""
        return self._spent(first_token=elapsed_ms)

    def streamed(self, elapsed_ms: float) -> RequestPlan:
        """The time the stream took after it opened."""
        return self._spent(generate=elapsed_ms)

    # -- reading ------------------------------------------------------------------------------

    def slice_ms(self, *stages: StageName) -> float:
        """The stages' predicted time plus their share of the plan's spare time."""
        predicted = self.plan.predicted_ms
        total = predicted.total
        spare = max(self.plan.available_ms - total, 0.0)
        stage_ms = sum(predicted.of(stage) for stage in stages)
        return stage_ms * (1.0 + spare / total) if total > 0 else stage_ms

    def degraded(self) -> tuple[str, ...]:
        """Why retrieval gave less than planned (a rerank or a reading cut short)."""
        return tuple(cut.reason for cut in self.cuts if cut.stage in ("rerank", "read"))

    def record(self, quality: QualityCurve) -> PlanRecord:
        return PlanRecord(
            planner=self.planner,
            tier=self.tier,
            budget_ms=self.budget_ms,
            knobs=self.knobs,
            initial=self.plan.knobs,
            quality=quality.quote(self.knobs.rerank_depth)
            if self.form == "quote"
            else quality.score(self.knobs.rerank_depth, self.knobs.passages),
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

    # -- the edits the decisions are made of --------------------------------------------------

    def _spent(self, **stages_ms: float) -> RequestPlan:
        return dataclasses.replace(self, actual=dataclasses.replace(self.actual, **stages_ms))

    def _cut(self, stage: str, reason: str, done: int) -> RequestPlan:
        """The knob `stage` sets (`_KNOBS`) cut to `done`, the cut recorded under the knob's
        name; a stage that sets no knob has its cut only recorded."""
        sets = _KNOBS.get(stage)
        if sets is None:
            return dataclasses.replace(self, cuts=(*self.cuts, Cut(stage, reason, 0, 0)))
        knob, name = sets
        planned = getattr(self.knobs, name)
        return dataclasses.replace(
            self,
            knobs=dataclasses.replace(self.knobs, **{name: done}),
            cuts=(*self.cuts, Cut(knob, reason, planned, done)),
        )

    def _with_knobs(self, **changes: int) -> RequestPlan:
        return dataclasses.replace(self, knobs=dataclasses.replace(self.knobs, **changes))

    def _answering(self, form: str, reason: str) -> RequestPlan:
        return dataclasses.replace(self, form=form, form_reason=reason)
