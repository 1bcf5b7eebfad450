"""The deadline planner: how much work each stage may do so the first token arrives in time.

A plan fixes the rerank depth (0: no rerank), how many passages go into the prompt, and so how
deep retrieval searches. Each candidate plan has a predicted high-quantile time per stage (from
`StageModels`, which learn online) and an expected quality (from `QualityCurve`, measured
offline); the planner picks the best quality whose predicted time to first token fits the time
left minus a safety margin, and the cheapest such plan among equals. When not even the smallest
plan fits, the plan says so (`fits=False`) and the caller refuses the request or answers with
sources only.

After retrieval the generation part is re-planned with what is then known: the time really
left, the prompt's real token count and cached prefix, and the worker's queue
(`passages_that_fit`).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from budget.latency_model import LatencyModel, LinearPrior, ModelState

# The stages the planner predicts and prices (the runner runs others too: their names are plain
# strings; `budget.stage.Stage` is the protocol every stage honours).
StageName = Literal["embed", "search", "rerank", "sentences", "prompt", "first_token"]
STAGES: tuple[StageName, ...] = ("embed", "search", "rerank", "sentences", "prompt", "first_token")
# Sentences scored per retrieved passage, for the sentence stage's predicted work.
SENTENCES_PER_PASSAGE = 6
# A stage's estimated time for an amount of work on a worker (`StageModels.median_ms`, ...).
StageEstimate = Callable[[StageName, float, str], float]


def query_tokens(query: str) -> int:
    """About four characters a token: good enough to price embedding a query."""
    return max(1, len(query) // 4)


_EMBED = LinearPrior(6.0, 0.07, 15.0)
_SEARCH = LinearPrior(4.0, 0.05, 15.0)
_RERANK = LinearPrior(10.0, 21.5, 120.0)
_SENTENCES = LinearPrior(1.0, 0.1, 3.0)
_PROMPT = LinearPrior(4.0, 1.5, 10.0)
_FIRST_TOKEN = LinearPrior(120.0, 1.9, 350.0)


@dataclass(frozen=True, slots=True)
class StagePriors:
    """Priors from the cost table measured on these 2 cores (eval/results/stage-costs.json,
    docs/benchmarks/cpu-prefix-attention.json), with margins for sharing the cores with SGLang.

    Work units: embed, query tokens; search, candidates asked for; rerank, candidates scored;
    sentences, sentences scored; prompt, passages; first_token, prompt tokens SGLang must prefill before this prompt's first
    token (its own uncached tokens plus those queued ahead of it on the worker).
    """

    embed: LinearPrior = _EMBED
    search: LinearPrior = _SEARCH
    rerank: LinearPrior = _RERANK
    sentences: LinearPrior = _SENTENCES
    prompt: LinearPrior = _PROMPT
    first_token: LinearPrior = _FIRST_TOKEN

    def of(self, stage: StageName) -> LinearPrior:
        prior: LinearPrior = getattr(self, stage)
        return prior


@dataclass(slots=True)
class StageModels:
    """One latency model per stage; the first-token model is kept per SGLang worker."""

    priors: StagePriors = field(default_factory=StagePriors)
    quantile: float = 0.9
    # The quantile admission predicts with (`admit_ms`): plans are chosen on `quantile`.
    admit_quantile: float = 0.9
    _models: dict[tuple[StageName, str], LatencyModel] = field(default_factory=dict)

    def model(self, stage: StageName, worker: str = "") -> LatencyModel:
        key = (stage, worker if stage == "first_token" else "")
        found = self._models.get(key)
        if found is None:
            found = self._models[key] = LatencyModel(
                self.priors.of(stage), self.quantile, admit_quantile=self.admit_quantile
            )
        return found

    def predict_ms(self, stage: StageName, work: float, worker: str = "") -> float:
        return self.model(stage, worker).predict_ms(work)

    def median_ms(self, stage: StageName, work: float, worker: str = "") -> float:
        return self.model(stage, worker).median_ms(work)

    def admit_ms(self, stage: StageName, work: float, worker: str = "") -> float:
        return self.model(stage, worker).admit_ms(work)

    def observe(self, stage: StageName, work: float, elapsed_ms: float, worker: str = "") -> None:
        self.model(stage, worker).observe(work, elapsed_ms)

    def settle(self) -> list[str]:
        """Every model that has observed something takes that as its prior (`LatencyModel.settle`);
        the names of those that did (`first_token@<worker>` per worker)."""
        return [
            f"{stage}@{worker}" if worker else stage
            for (stage, worker), model in sorted(self._models.items())
            if model.settle()
        ]

    def states(self) -> dict[str, ModelState]:
        return {
            f"{stage}@{worker}" if worker else stage: model.state()
            for (stage, worker), model in sorted(self._models.items())
        }


@dataclass(frozen=True, slots=True)
class QualityCurve:
    """Expected answer quality by rerank depth and passages in the prompt.

    `by_depth[d][n - 1]` is the measured share of questions whose evidence is among the first
    `n` passages when the top `d` candidates are reranked (d = 0: retrieval order). Depths not
    measured take the nearest measured depth below; passages beyond the curve take its end.
    `quote_by_depth[d]`, where measured, is the share of quotes that hold the answer at rerank
    depth d: what a quote is worth, which its passages' order alone overstates.
    """

    by_depth: Mapping[int, Sequence[float]]
    quote_by_depth: Mapping[int, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if 0 not in self.by_depth:
            raise ValueError("a quality curve needs depth 0 (no rerank)")
        if self.quote_by_depth and 0 not in self.quote_by_depth:
            raise ValueError("a quote's curve needs depth 0 (no rerank)")
        if any(not 0.0 <= q <= 1.0 for q in self.quote_by_depth.values()):
            raise ValueError("a quote's curve holds shares in [0, 1]")
        for depth, curve in self.by_depth.items():
            if not curve or any(b < a for a, b in itertools.pairwise(curve)):
                raise ValueError(f"the curve at depth {depth} must be non-empty and monotone")

    def score(self, rerank_depth: int, passages: int) -> float:
        if passages <= 0:
            return 0.0
        depth = max(d for d in self.by_depth if d <= max(rerank_depth, 0))
        curve = self.by_depth[depth]
        return curve[min(passages, len(curve)) - 1]

    def quote(self, rerank_depth: int) -> float:
        """A quote's expected quality at a rerank depth: its measured curve (the nearest depth
        below), else the share with the evidence first (the scorer weighs a sentence by its
        passage's rank)."""
        if not self.quote_by_depth:
            return self.score(rerank_depth, 1)
        depth = max(d for d in self.quote_by_depth if d <= max(rerank_depth, 0))
        return self.quote_by_depth[depth]


@dataclass(frozen=True, slots=True)
class StageTimes:
    """Milliseconds per stage: a plan's predictions, or what a request really spent. The one
    stage-times type: the `plan` event shows the planned stages, `done` the request's."""

    embed: float = 0.0
    search: float = 0.0
    rerank: float = 0.0
    sentences: float = 0.0
    # The sentence reader (0 where the scorer was sure, or there is no reader); not planned.
    read: float = 0.0
    prompt: float = 0.0
    first_token: float = 0.0
    # The stream from its first token to its end; not planned.
    generate: float = 0.0

    @property
    def total(self) -> float:
        """The planned stages' time to a first token."""
        return sum(self.of(stage) for stage in STAGES)

    def of(self, stage: StageName) -> float:
        value: float = getattr(self, stage)
        return value


@dataclass(frozen=True, slots=True)
class Knobs:
    rerank_depth: int
    passages: int
    retrieve_k: int

    @classmethod
    def from_json(cls, raw: Mapping[str, object]) -> Knobs:
        """Knobs as `dataclasses.asdict` wrote them (a stored request summary)."""
        return cls(
            int(str(raw["rerank_depth"])), int(str(raw["passages"])), int(str(raw["retrieve_k"]))
        )


@dataclass(frozen=True, slots=True)
class Plan:
    knobs: Knobs
    predicted_ms: StageTimes
    quality: float
    # The time the plan was made against (the time left minus the safety margin).
    available_ms: float
    fits: bool
    # The prompt tokens SGLang is expected to prefill for it (the gate's queue cost).
    uncached_tokens: float = 0.0
    # Whether its typical (median, no margin) time fits the whole time left: a plan that does
    # not fit with the margins may still be worth trying; one that does not even fit so is
    # refused (admission).
    likely: bool = True
    # Whether its time at the models' admission quantile fits with the margins (the same as
    # `fits` where that quantile is the planning one).
    admissible: bool = True


@dataclass(frozen=True, slots=True)
class PlanInput:
    """What the planner knows when a request arrives."""

    remaining_ms: float
    query_tokens: int
    max_passages: int
    reranker: bool
    # Prompt tokens the chosen worker must prefill before this request's own (its queue).
    prefill_ahead_tokens: float = 0.0
    # Requests the worker takes before this one's prefill starts, in units of its slots. Each
    # costs the first-token model's fixed part (its intercept) on top of its tokens: a queue
    # of short prompts is not one long prompt.
    requests_ahead: float = 0.0
    worker: str = ""
    # The expected share of this request's prompt tokens SGLang will serve from its cache.
    cached_share: float = 0.0
    # Requests arriving per second per worker, recently: what this request's prefill delays.
    arrival_rate_rps: float = 0.0
    # Answered by a quote (no model): its time ends with the sentences, its passages are the
    # sources (`max_passages`), and only the rerank depth is chosen (`QualityCurve.quote`).
    quote: bool = False
    # Requests arriving per second at this replica, recently: what shares its CPU with the
    # rerank this request would run.
    replica_rate_rps: float = 0.0


@dataclass(frozen=True, slots=True)
class PlannerConfig:
    rerank_depths: tuple[int, ...] = (0, 10, 20, 30)
    # Candidates retrieved beyond the passages kept, for the cache-aware layout's slack.
    retrieve_slack: int = 0
    # Tokens of the fixed part of the prompt (system prompt, template) and of one passage.
    fixed_prompt_tokens: int = 120
    passage_tokens: int = 190
    # Kept back from the time left, as a fraction plus a constant: the models' misses.
    margin_fraction: float = 0.1
    margin_ms: float = 50.0
    # The share of a worker's time prefills may take at the current arrival rate: a plan whose
    # prefill would push past it is not chosen (unless nothing smaller exists), because every
    # request arriving meanwhile waits behind it. Decoding needs the rest of the cores. A
    # quote's reranks are held to the same share of the replica's CPU.
    max_utilization: float = 0.5

    def __post_init__(self) -> None:
        if 0 not in self.rerank_depths or any(d < 0 for d in self.rerank_depths):
            raise ValueError("rerank_depths must contain 0 and no negative depth")
        if not 0.0 <= self.margin_fraction < 1.0 or self.margin_ms < 0:
            raise ValueError("the safety margin must be a fraction in [0, 1) and ms >= 0")
        if not 0.0 < self.max_utilization <= 1.0:
            raise ValueError("max_utilization must be in (0, 1]")


@dataclass(frozen=True, slots=True)
class PromptOption:
    """A prompt the generation re-plan may send: its passages, tokens and expected cache."""

    passages: int
    prompt_tokens: int
    uncached_tokens: float


class Planner:
    """Chooses plans from the stage models and the quality curve. Pure and synchronous: the
    caller passes in the time left and the load it sees."""

    def __init__(
        self,
        models: StageModels,
        quality: QualityCurve,
        config: PlannerConfig | None = None,
    ) -> None:
        self.models = models
        self.quality = quality
        self.config = config or PlannerConfig()

    def available_ms(self, remaining_ms: float) -> float:
        config = self.config
        return remaining_ms * (1.0 - config.margin_fraction) - config.margin_ms

    def plan(self, request: PlanInput) -> Plan:
        """The best plan that fits the time left; else the smallest one, with `fits=False`
        (and `likely` saying whether its median time would still make the budget).

        Each stage is predicted once per distinct amount of work (not once per candidate), so
        the choice over every depth x passages combination stays well under a millisecond.
        """
        models, config = self.models, self.config
        available = self.available_ms(request.remaining_ms)
        depths = config.rerank_depths if request.reranker else (0,)
        if request.quote:
            return self._quote_plan(request, depths, available)
        embed_ms = models.predict_ms("embed", request.query_tokens) + self._sentences_ms(
            request, models.predict_ms
        )
        passages_range = range(1, max(request.max_passages, 1) + 1)
        queue_ms = self._queue_ms(request)
        generation_ms = [
            models.predict_ms("prompt", n)
            + queue_ms
            + models.predict_ms(
                "first_token",
                request.prefill_ahead_tokens + self._uncached(request, n),
                request.worker,
            )
            for n in passages_range
        ]
        sustainable = self._sustainable_passages(request, passages_range)
        search_ms: dict[int, float] = {}
        best: tuple[float, float, int, int] | None = None  # quality, total, depth, passages
        smallest: tuple[float, int, int] | None = None
        for depth in depths:
            rerank_ms = models.predict_ms("rerank", depth) if depth else 0.0
            for passages, gen_ms in enumerate(generation_ms, start=1):
                k = max(depth, passages + config.retrieve_slack)
                if k not in search_ms:
                    search_ms[k] = models.predict_ms("search", k)
                total = embed_ms + search_ms[k] + rerank_ms + gen_ms
                if smallest is None or total < smallest[0]:
                    smallest = (total, depth, passages)
                if total <= available and passages <= sustainable:
                    quality = self.quality.score(depth, passages)
                    if best is None or _better(quality, total, best[0], best[1]):
                        best = (quality, total, depth, passages)
        assert smallest is not None
        if best is not None:
            return self.evaluate(request, best[2], best[3])
        return self.evaluate(request, smallest[1], smallest[2])

    def _quote_plan(self, request: PlanInput, depths: Sequence[int], available: float) -> Plan:
        """A quote's plan: the rerank depth of the best quote quality that fits (the faster
        among equals), else no rerank. A depth whose reranks at the replica's arrival rate would
        keep its CPU busier than `max_utilization` is not chosen: every request arriving
        meanwhile would wait behind them."""
        best: tuple[float, float, int] | None = None  # quality, total, depth
        for depth in depths:
            plan = self.evaluate(request, depth, request.max_passages)
            busy = request.replica_rate_rps * plan.predicted_ms.rerank / 1000.0
            if (
                plan.fits
                and busy <= self.config.max_utilization
                and (best is None or _better(plan.quality, plan.predicted_ms.total, *best[:2]))
            ):
                best = (plan.quality, plan.predicted_ms.total, depth)
        return self.evaluate(request, best[2] if best else 0, request.max_passages)

    def _sustainable_passages(self, request: PlanInput, passages_range: range) -> int:
        """The most passages whose own prefill keeps the worker's prefill utilization (arrival
        rate x prefill time) under `max_utilization`; at least one."""
        if request.arrival_rate_rps <= 0:
            return passages_range[-1]
        most = 1
        for n in passages_range:
            own_ms = self.models.predict_ms(
                "first_token", self._uncached(request, n), request.worker
            )
            if request.arrival_rate_rps * own_ms / 1000.0 > self.config.max_utilization:
                break
            most = n
        return most

    def _uncached(self, request: PlanInput, passages: int) -> float:
        prompt_tokens = (
            self.config.fixed_prompt_tokens
            + request.query_tokens
            + passages * self.config.passage_tokens
        )
        return prompt_tokens * (1.0 - min(max(request.cached_share, 0.0), 1.0))

    def evaluate(self, request: PlanInput, depth: int, passages: int) -> Plan:
        """One candidate: its predicted stage times and quality against the time left."""
        available = self.available_ms(request.remaining_ms)
        models = self.models
        retrieve_k = max(depth, passages + self.config.retrieve_slack)
        uncached = 0.0 if request.quote else self._uncached(request, passages)
        times = StageTimes(
            embed=models.predict_ms("embed", request.query_tokens),
            search=models.predict_ms("search", retrieve_k),
            rerank=models.predict_ms("rerank", depth) if depth else 0.0,
            sentences=self._sentences_ms(request, models.predict_ms),
        )
        if not request.quote:
            times = dataclasses.replace(
                times,
                prompt=models.predict_ms("prompt", passages),
                first_token=self._queue_ms(request)
                + models.predict_ms(
                    "first_token", request.prefill_ahead_tokens + uncached, request.worker
                ),
            )
        fits = times.total <= available
        typical_ms = self._total_ms(request, depth, passages, models.median_ms)
        likely = fits or typical_ms <= request.remaining_ms
        admissible = fits
        if models.admit_quantile != models.quantile:
            admissible = self._total_ms(request, depth, passages, models.admit_ms) <= available
        return Plan(
            knobs=Knobs(depth, passages, retrieve_k),
            predicted_ms=times,
            quality=self.quality.quote(depth)
            if request.quote
            else self.quality.score(depth, passages),
            available_ms=available,
            fits=fits,
            uncached_tokens=uncached,
            likely=likely,
            admissible=admissible,
        )

    def idle_floor_ms(self, request: PlanInput) -> float:
        """The typical (median) time of the smallest plan with nothing queued ahead: a budget
        under it cannot be met however idle the service is."""
        idle = dataclasses.replace(request, prefill_ahead_tokens=0.0, requests_ahead=0.0)
        return self._total_ms(idle, 0, 1, self.models.median_ms)

    @staticmethod
    def _sentences_ms(request: PlanInput, at: Callable[..., float]) -> float:
        """Scoring the sentences of the passages retrieved for the sources (top_k)."""
        return float(at("sentences", SENTENCES_PER_PASSAGE * max(request.max_passages, 1), ""))

    def _queue_ms(self, request: PlanInput) -> float:
        """The fixed part of the first-token time of each request queued ahead."""
        if request.requests_ahead <= 0:
            return 0.0
        fixed_ms = self.models.median_ms("first_token", 0.0, request.worker)
        return request.requests_ahead * max(fixed_ms, 0.0)

    def _total_ms(self, request: PlanInput, depth: int, passages: int, at: StageEstimate) -> float:
        """A plan's time to first token with each stage estimated by `at` (the models' median
        or admission quantile); the queue's fixed part is always its median."""
        retrieve_k = max(depth, passages + self.config.retrieve_slack)
        retrieval = (
            at("embed", request.query_tokens, "")
            + self._sentences_ms(request, at)
            + at("search", retrieve_k, "")
            + (at("rerank", depth, "") if depth else 0.0)
        )
        if request.quote:
            return retrieval
        ahead = request.prefill_ahead_tokens + self._uncached(request, passages)
        return (
            retrieval
            + at("prompt", passages, "")
            + at("first_token", ahead, request.worker)
            + self._queue_ms(request)
        )

    def first_token_floor_ms(self, worker: str) -> float:
        """The fixed part of any first token on `worker` (its typical time for an empty
        prompt): a request with less time left cannot get one, however short its prompt."""
        return self.models.median_ms("first_token", 0.0, worker)

    def prompt_fits(
        self,
        remaining_ms: float,
        option: PromptOption,
        prefill_ahead_tokens: float,
        worker: str,
    ) -> tuple[bool, float]:
        """Whether a laid-out prompt's predicted time to first token fits what is left, and
        the prediction."""
        predicted = self.models.predict_ms("prompt", option.passages) + self.models.predict_ms(
            "first_token", prefill_ahead_tokens + option.uncached_tokens, worker
        )
        return predicted <= self.available_ms(remaining_ms), predicted

    def passages_that_fit(
        self,
        remaining_ms: float,
        options: Iterable[PromptOption],
        prefill_ahead_tokens: float,
        worker: str,
    ) -> tuple[PromptOption, float]:
        """The generation re-plan: of `options` (most passages first, produced lazily), the
        first whose predicted time to first token fits what is left, else the last (the
        smallest); with its prediction."""
        last: tuple[PromptOption, float] | None = None
        for option in options:
            fits, predicted = self.prompt_fits(remaining_ms, option, prefill_ahead_tokens, worker)
            last = (option, predicted)
            if fits:
                return last
        if last is None:
            raise ValueError("no prompt options to choose from")
        return last


def _better(quality: float, total_ms: float, other_quality: float, other_total_ms: float) -> bool:
    """Higher quality wins; equal quality (within 0.5 point) goes to the faster plan."""
    if abs(quality - other_quality) > 0.005:
        return quality > other_quality
    return total_ms < other_total_ms
