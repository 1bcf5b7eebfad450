"""The stage interface: a typed input and its deadline slice in, a `StageResult` out.

Every step of an answer (cache, embed, search, rerank, sentences, read, evidence, form, quote,
slot, prompt, generate, first_token) has this shape, whatever package implements it; one runner
in the service times it, records its span and the planner's observation, and hands the result,
cut included, to `RequestPlan.after` for the next plan. A stage that cannot finish in its slice
either gives back what it has with a `cut` saying what it left undone, or raises its package's
timeout.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from budget.deadline import Deadline

T_co = TypeVar("T_co", covariant=True)
In_contra = TypeVar("In_contra", contravariant=True)
Out_co = TypeVar("Out_co", covariant=True)

AttributeValue = str | bool | int | float


@dataclass(frozen=True, slots=True)
class StageCut:
    """Work a stage was asked for and did not do: why, and how much it did (of the knob the
    plan set: rerank depth, passages)."""

    reason: str
    done: int


@dataclass(frozen=True, slots=True)
class StageResult(Generic[T_co]):
    value: T_co
    elapsed_ms: float
    # The work done, in the unit the planner's model of the stage counts (query tokens,
    # candidates, passages); None when there is nothing to learn from (a cache hit, a skip).
    work: float | None = None
    cut: StageCut | None = None
    # Sizes and outcome for the stage's span (no query or document text).
    attributes: Mapping[str, AttributeValue] = field(default_factory=dict)


class Stage(Protocol[In_contra, Out_co]):
    """One step of an answer. `name` names its span and the planner's model of it."""

    @property
    def name(self) -> str: ...

    async def run(self, request: In_contra, deadline: Deadline) -> StageResult[Out_co]: ...


In = TypeVar("In")
Out = TypeVar("Out")


class StageRun(Protocol):
    """How a caller has its stages run: `run_stage` alone, or the service's `StageRunner`
    (which spans each stage and teaches the planner's model of it)."""

    async def __call__(
        self, stage: Stage[In, Out], request: In, deadline: Deadline
    ) -> StageResult[Out]: ...


async def run_stage(stage: Stage[In, Out], request: In, deadline: Deadline) -> StageResult[Out]:
    """A stage run as it is, with nothing around it."""
    return await stage.run(request, deadline)
