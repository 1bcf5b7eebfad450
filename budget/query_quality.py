"""Expected answer quality per form for one request, from what its first retrieval pass saw.

The measured curves (`QualityCurves`) give every request the same expectation per form and
context size. This model gives each request its own: a logistic model per configuration it was
trained on (a form at a context size) over features of the first pass (the best sentence's
probability and its margin over the second, the chance the sources answer at all, how much of
the question the best sentence holds, the question's length and kind). Learned by
`eval.calibrate.form_choice` (removed in issue 39, last at 51f22ed) on the planner-training part
of the committed split, from the same questions answered in each configuration. Sizes it was not trained on expect
nothing, so the planner never picks them; a form it has no model for keeps the curves' values.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from budget.forms import FORMS, AnswerForm, FormQuality, FormRequest

# Question kinds, by their first words.
KINDS = ("who", "when", "where", "how_many", "why_how", "which_what")
_KIND_PATTERNS = (
    ("how_many", re.compile(r"\bhow (many|much|long|old|far|big|large|often)\b", re.I)),
    ("who", re.compile(r"\b(who|whom|whose)\b", re.I)),
    ("when", re.compile(r"\b(when|what year|what date)\b", re.I)),
    ("where", re.compile(r"\bwhere\b", re.I)),
    ("why_how", re.compile(r"\b(why|how)\b", re.I)),
    ("which_what", re.compile(r"\b(which|what)\b", re.I)),
)

FEATURES = (
    "bias",
    "best_probability",
    "margin",
    "answerable",
    "best_cover",
    "log_question_tokens",
    *(f"kind_{kind}" for kind in KINDS),
)


def question_kind(question: str) -> str:
    for kind, pattern in _KIND_PATTERNS:
        if pattern.search(question):
            return kind
    return "other"


def feature_row(request: FormRequest) -> tuple[float, ...]:
    """`FEATURES` of a request, in order."""
    return (
        1.0,
        request.best_probability,
        request.margin,
        request.answerable,
        request.best_cover,
        math.log1p(request.question_tokens),
        *(float(request.question_kind == kind) for kind in KINDS),
    )


@dataclass(frozen=True, slots=True)
class ConfigurationModel:
    """One configuration's logistic model over standardised `FEATURES` (the bias unscaled)."""

    form: AnswerForm
    size: int
    weights: tuple[float, ...]
    mean: tuple[float, ...]
    scale: tuple[float, ...]

    def __post_init__(self) -> None:
        if not len(self.weights) == len(self.mean) == len(self.scale) == len(FEATURES):
            raise ValueError(f"one weight, mean and scale for each of {FEATURES}")
        if self.size < 1:
            raise ValueError("a configuration's size is at least 1")
        if self.form not in FORMS:
            raise ValueError(f"no answer form {self.form!r}")

    def probability(self, row: Sequence[float]) -> float:
        z = sum(
            w * (x - m) / s
            for w, x, m, s in zip(self.weights, row, self.mean, self.scale, strict=True)
        )
        return 1.0 / (1.0 + math.exp(-max(min(z, 30.0), -30.0)))


class QueryQuality:
    """`FormQuality` per request: the trained configurations' probabilities, by form and size
    (zero at sizes not trained on), over `fallback` for forms with no model."""

    def __init__(self, models: Sequence[ConfigurationModel], fallback: FormQuality) -> None:
        if not models:
            raise ValueError("a per-query model needs at least one configuration")
        self._models = list(models)
        self._fallback = fallback

    def expected(self, request: FormRequest) -> Mapping[AnswerForm, Sequence[float]]:
        row = feature_row(request)
        out: dict[AnswerForm, list[float]] = {}
        for model in self._models:
            curve = out.setdefault(model.form, [])
            curve.extend([0.0] * (model.size - len(curve)))
            curve[model.size - 1] = model.probability(row)
        fallback = self._fallback.expected(request)
        merged: dict[AnswerForm, Sequence[float]] = dict(fallback)
        merged.update(out)
        return merged

    @classmethod
    def from_json(cls, raw: Mapping[str, Any], fallback: FormQuality) -> QueryQuality:
        """The `configurations` of a file the removed `eval.calibrate.form_choice` wrote
        (ValueError, KeyError or TypeError when it is not one)."""
        if tuple(raw.get("features", ())) != FEATURES:
            raise ValueError(f"a per-query model must be over {FEATURES}")
        entries = raw.get("configurations")
        if not isinstance(entries, list):
            raise ValueError("no configurations")
        models = [
            ConfigurationModel(
                form=entry["form"],
                size=int(entry["size"]),
                weights=tuple(float(w) for w in entry["weights"]),
                mean=tuple(float(m) for m in entry["mean"]),
                scale=tuple(float(s) for s in entry["scale"]),
            )
            for entry in entries
        ]
        return cls(models, fallback)
