"""Answer forms and how a request's form is chosen.

    quote     the sentences of the retrieved passages that answer, streamed with their
              citations, without the model (milliseconds)
    focused   the model answers from the best sentences and their neighbours (a short prompt)
    passages  the model answers from whole passages (the longest prompt)

`answer_mode` asks for one form, or `auto`: the planner then takes the form and context size of
the highest expected quality whose predicted first token fits the time left (the faster among
near-equals). What `auto` knows of a request and what it expects of each form go through one
small interface, `FormQuality`: today measured curves per form and context size for the served
model (`QualityCurves`); a per-query model can take its place.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

AnswerForm = Literal["quote", "focused", "passages"]
AnswerMode = Literal["auto", "quote", "focused", "passages"]
FORMS: tuple[AnswerForm, ...] = ("quote", "focused", "passages")
MODES: tuple[AnswerMode, ...] = ("auto", "quote", "focused", "passages")


@dataclass(frozen=True, slots=True)
class FormRequest:
    """What is known of a request when its form is chosen (after retrieval)."""

    question_tokens: int
    # The sentence scorer's probability for the best sentence, and the gap to the second.
    best_probability: float
    margin: float
    # The most passages (or sentence groups) the request may use.
    max_context: int
    # The chance the retrieved sentences answer at all (the answerable model's), the share of
    # the question's weight the best sentence holds among the candidates, and the question's
    # kind (budget/query_quality.py: who, when, where, how_many, why_how, which_what, other).
    answerable: float = 0.0
    best_cover: float = 0.0
    question_kind: str = "other"


class FormQuality(Protocol):
    def expected(self, request: FormRequest) -> Mapping[AnswerForm, Sequence[float]]:
        """Expected answer quality per form by context size (index 0: one passage or one
        sentence group; a quote has one entry)."""
        ...


@dataclass(frozen=True, slots=True)
class QualityCurves:
    """Measured answer quality per form and context size for one served model."""

    curves: Mapping[AnswerForm, Sequence[float]]

    def __post_init__(self) -> None:
        for form, curve in self.curves.items():
            if form not in FORMS or not curve or any(not 0.0 <= q <= 1.0 for q in curve):
                raise ValueError(f"a quality curve for {form!r} must be non-empty shares in [0, 1]")

    def expected(self, request: FormRequest) -> Mapping[AnswerForm, Sequence[float]]:
        return self.curves


@dataclass(frozen=True, slots=True)
class FormChoice:
    form: AnswerForm
    # Passages (or sentence groups) given to the model; 0 for a quote.
    context: int
    expected_quality: float
    predicted_ms: float
    reason: str


FormCost = Callable[[AnswerForm, int], float]
"""Predicted time to first token of a form at a context size, from now."""


def choose_form(
    quality: Mapping[AnswerForm, Sequence[float]],
    cost: FormCost,
    available_ms: float,
    max_context: int,
    allowed: Sequence[AnswerForm] = FORMS,
) -> FormChoice:
    """The allowed form and context size of the highest expected quality whose predicted time
    fits `available_ms`; equal quality (within half a point) goes to the faster. When none
    fits, the fastest allowed option, saying so."""
    options: list[tuple[float, float, AnswerForm, int]] = []
    for form in allowed:
        curve = quality.get(form)
        if not curve:
            continue
        sizes = [1] if form == "quote" else range(1, max(max_context, 1) + 1)
        for size in sizes:
            expected = curve[min(size, len(curve)) - 1]
            options.append((expected, cost(form, size), form, 0 if form == "quote" else size))
    if not options:
        raise ValueError("no form to choose from")
    fitting = [o for o in options if o[1] <= available_ms]
    if not fitting:
        expected, ms, form, size = min(options, key=lambda o: o[1])
        return FormChoice(
            form, size, expected, ms, f"nothing fits {available_ms:.0f} ms: the fastest form"
        )
    best = fitting[0]
    for option in fitting[1:]:
        if abs(option[0] - best[0]) > 0.005:
            if option[0] > best[0]:
                best = option
        elif option[1] < best[1]:
            best = option
    expected, ms, form, size = best
    return FormChoice(
        form, size, expected, ms, f"best expected quality {expected:.2f} that fits the time left"
    )
