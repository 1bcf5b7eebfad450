"""Which form answers a request (budget/forms.py), decided after retrieval when the evidence and
the time left are known, and what each form is given: the quote's sentences, or the focused
context's excerpts (the best sentences with their neighbours, one excerpt per passage)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from answer_service.pipeline.planning import RequestPlanning
from budget.forms import (
    FORMS,
    AnswerForm,
    AnswerMode,
    FormChoice,
    FormQuality,
    FormRequest,
    QualityCurves,
    choose_form,
)
from budget.planner import query_tokens
from budget.query_quality import QueryQuality, question_kind
from budget.request_plan import RequestPlan
from generation.prompt_layout import ContextPassage
from retrieval.sentences.answerable import AnswerableModel
from retrieval.sentences.quote import QuoteConfig
from retrieval.sentences.scorer import FEATURES, Candidate, ScoredSentence, best_probabilities

# Prompt tokens of one focused excerpt (a sentence and its neighbours) and of one passage, for
# the first-token prediction of each form before its prompt is laid out.
FOCUSED_EXCERPT_TOKENS = 90
PASSAGE_TOKENS = 190
FIXED_PROMPT_TOKENS = 120


def read_form_curves(path: Path | None = None) -> QualityCurves:
    """Per-form quality curves (`python -m eval.calibrate.form_curves`): the file given, or the
    ones shipped for the default model."""
    try:
        text = (
            path.read_text(encoding="utf-8")
            if path is not None
            else resources.files("answer_service.pipeline").joinpath("form_curves.json").read_text()
        )
        raw = json.loads(text)["curves"]
        return QualityCurves({form: tuple(raw[form]) for form in FORMS if form in raw})
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"not a form-curves file: {exc}") from exc


def read_form_choice(curves: FormQuality, path: Path | None = None) -> QueryQuality:
    """The per-query form model over `curves` (fitted by `eval.calibrate.form_choice`, removed
    in issue 39, last at 51f22ed): the file given, or the one shipped for the default model."""
    try:
        text = (
            path.read_text(encoding="utf-8")
            if path is not None
            else resources.files("answer_service.pipeline").joinpath("form_choice.json").read_text()
        )
        return QueryQuality.from_json(json.loads(text), curves)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"not a per-query form model: {exc}") from exc


@dataclass(frozen=True, slots=True)
class FormConfig:
    mode: AnswerMode = "auto"
    quote: QuoteConfig = field(default_factory=QuoteConfig)
    # Sentences on each side of a chosen one that go into its focused excerpt.
    neighbours: int = 1
    # The chance the sources answer at all, read for abstention (None: the best sentence's
    # probability against the quote's `min_probability`, for weights learned without it).
    answerable: AnswerableModel | None = None


@dataclass(frozen=True, slots=True)
class FormInput:
    """What the form choice knows of a request after retrieval."""

    plan: RequestPlan
    query: str
    # The scorer's own ranking (the form model was learned on it).
    sentences: Sequence[ScoredSentence]
    # What `FormPolicy.evidence` said of them.
    evidence: float
    # The worker the plan would send to, and the share of its prompts' tokens it holds cached.
    worker: str
    cached_share: float


class FormPolicy:
    def __init__(self, config: FormConfig, planning: RequestPlanning, quality: FormQuality) -> None:
        self.config = config
        self._planning = planning
        self._quality = quality
        # Whether `auto` will answer with a quote whatever retrieval finds: measured curves
        # (not a per-query model) that put the quote at or above every generated form. Fixed
        # by the curves, so decided once here rather than per request.
        self.quote_expected = isinstance(quality, QualityCurves) and _quote_dominates(quality)

    def evidence(self, sentences: Sequence[ScoredSentence]) -> float:
        """How likely the retrieved sentences are to answer: the answerable model's chance, or
        the best quotable sentence's probability where there is no such model."""
        if self.config.answerable is not None:
            return self.config.answerable.probability(sentences)
        return best_probabilities(sentences, 1)[0]

    def abstain_below(self, setting: float | None) -> float:
        """The evidence under which the service says it does not know: the setting, else the
        threshold calibrated with the model that gives the evidence."""
        if setting is not None:
            return setting
        if self.config.answerable is not None:
            return self.config.answerable.threshold
        return self.config.quote.min_probability

    def mode_of(self, asked: AnswerMode | None) -> AnswerMode:
        return asked or self.config.mode

    def choose(self, state: FormInput, remaining_ms: float) -> FormChoice:
        """The form for this request now: the one asked for, or under `auto` the best expected
        quality whose predicted first token fits the time left."""
        mode = state.plan.mode
        most = max(state.plan.knobs.passages, 1)
        if mode in ("quote", "passages") or (
            mode == "focused" and not self._planning.config.enabled
        ):
            # A quote has no context size; whole passages are the request's top_k as planned;
            # with the planner off every size is the request's.
            size = 0 if mode == "quote" else most
            return FormChoice(mode, size, 0.0, 0.0, f"answer_mode {mode} asked for")
        if mode == "auto" and self.quote_expected:  # and so it was planned as one
            return FormChoice("quote", 0, 0.0, 0.0, "auto: the quote is expected to answer best")
        worker = state.worker
        request = form_request(state.query, state.sentences, most, state.evidence)
        planner = self._planning.planner
        models = self._planning.models
        gate = self._planning.gate
        ahead = gate.pending_tokens(worker)
        cached = state.cached_share

        def cost(form: AnswerForm, size: int) -> float:
            if form == "quote":
                return 0.0
            per = FOCUSED_EXCERPT_TOKENS if form == "focused" else PASSAGE_TOKENS
            tokens = (FIXED_PROMPT_TOKENS + request.question_tokens + size * per) * (1 - cached)
            return models.predict_ms("prompt", size) + models.predict_ms(
                "first_token", ahead + tokens, worker
            )

        available = planner.available_ms(remaining_ms)
        expected = self._quality.expected(request)
        if mode == "focused":
            # How many excerpts is the service's choice, not the request's: the measured best
            # that fits (on a small model more excerpts answer worse, not better).
            if not expected.get("focused"):
                return FormChoice(mode, most, 0.0, 0.0, "answer_mode focused asked for")
            choice = choose_form(expected, cost, available, most, allowed=("focused",))
            return dataclasses.replace(
                choice,
                reason=f"answer_mode focused asked for: {choice.context} excerpt(s), "
                + choice.reason,
            )
        return choose_form(expected, cost, available, most)


def _quote_dominates(quality: QualityCurves) -> bool:
    curves = quality.curves
    quote = max(curves.get("quote", ()), default=None)
    others = [q for form, curve in curves.items() if form != "quote" for q in curve]
    return quote is not None and all(quote >= q for q in others)


def form_request(
    question: str, sentences: Sequence[ScoredSentence], max_context: int, answerable: float
) -> FormRequest:
    """What the form choice knows of a request after its first pass (`sentences` ranked best
    first; `answerable` the chance they answer at all)."""
    best, second = best_probabilities(sentences, 2)
    top = next((s for s in sentences if s.candidate.ref.whole), None)
    cover = (
        float(top.features[_LOCAL_COVER]) if top is not None and top.features is not None else 0.0
    )
    return FormRequest(
        query_tokens(question),
        best,
        best - second,
        max_context,
        answerable=answerable,
        best_cover=cover,
        question_kind=question_kind(question),
    )


_LOCAL_COVER = FEATURES.index("local_cover")


def focused_excerpts(
    sentences: Sequence[ScoredSentence], groups: int, neighbours: int
) -> list[ContextPassage]:
    """One excerpt per passage for the `groups` passages holding the best sentences: those
    sentences and `neighbours` on each side, in the passage's order, gaps marked with "…", a
    definition's sentences after the term they define. Numbered in the order of their best
    sentence."""
    chosen: dict[int, list[int]] = {}
    for scored in sentences:
        ref = scored.candidate.ref
        if ref.kind == "code" and len(chosen) >= 1:
            continue
        if ref.row not in chosen and len(chosen) >= groups:
            continue
        chosen.setdefault(ref.row, []).append(ref.position)
        if len(chosen) >= groups and sum(map(len, chosen.values())) >= 2 * groups:
            break
    units: dict[int, dict[int, Candidate]] = {}
    for scored in sentences:
        ref = scored.candidate.ref
        units.setdefault(ref.row, {})[ref.position] = scored.candidate
    excerpts: list[ContextPassage] = []
    for number, (row, positions) in enumerate(chosen.items(), start=1):
        of_row = units[row]
        passage = next(iter(of_row.values())).passage
        keep = sorted(
            {p + d for p in positions for d in range(-neighbours, neighbours + 1)} & set(of_row)
        )
        parts: list[str] = []
        said: set[str] = set()  # the terms of definitions this excerpt has named
        for i, position in enumerate(keep):
            if i and position != keep[i - 1] + 1:
                parts.append("…")
            unit = of_row[position]
            if unit.term and unit.term not in said:
                # A definition's sentence after the term it defines, unless the excerpt has
                # just given the term's own line.
                said.add(unit.term)
                if not parts or " ".join(parts[-1].split()) != unit.term:
                    parts.append(f"{unit.term}:")
            parts.append(unit.text)
        excerpts.append(ContextPassage(number, passage.passage_id, passage.title, " ".join(parts)))
    return excerpts
