"""The planner as the service runs it: models, gate and plans for one request at a time.

`RequestPlanning` holds what lives as long as the service (the stage models that learn from
every request, the quality curve, the generation gate, the arrival rate); each request gets a
`RequestPlan` value (budget/request_plan.py) from `start()`, and every later plan comes from
that value's own decisions.

With the planner switched off (`ANSWER_PLANNER=false`) the configuration is fixed by the
settings (passages = the request's `top_k`, rerank depth = `fixed_rerank_depth`, 20, when a
reranker is loaded); the plan is still predicted and recorded, so the two can be compared.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from answer_service.pipeline.admission import DEFAULT_QUEUE_MAX, GenerationGate
from budget import CacheEstimator
from budget.arrivals import ArrivalRate
from budget.forms import AnswerMode
from budget.planner import (
    PlanInput,
    Planner,
    PlannerConfig,
    QualityCurve,
    StageModels,
    StageName,
    query_tokens,
)
from budget.request_plan import RequestPlan

# The share of SQuAD questions whose gold passage is among the first n passages (n = 1..10) in
# hybrid order with its first d reranked by the builtin reranker (d = 0: hybrid order alone):
# 600 questions of the split's planner-training part, `python -m eval.calibrate.quality_curves
# --reranker builtin --part planner_training --sample 600` (eval/results/quality-curves.json).
# A quote is valued by what it answered at each fixed depth (quote mode, the planner off, 300
# planner-training questions: docs/benchmarks/builtin_reranker.py, builtin-reranker.json): the
# reranked order moves its gold passage up, not its answers, so a quote buys no rerank.
# `ANSWER_CALIBRATION_DIR` loads the curves measured with the reranker a deployment serves.
DEFAULT_QUALITY = QualityCurve(
    {
        0: (0.718, 0.817, 0.883, 0.917, 0.933, 0.948, 0.958, 0.960, 0.962, 0.965),
        10: (0.777, 0.877, 0.910, 0.938, 0.948, 0.955, 0.957, 0.962, 0.962, 0.965),
        20: (0.792, 0.888, 0.917, 0.938, 0.958, 0.962, 0.968, 0.970, 0.972, 0.977),
        30: (0.802, 0.883, 0.922, 0.948, 0.965, 0.970, 0.973, 0.975, 0.977, 0.978),
    },
    quote_by_depth={0: 0.797, 10: 0.793, 20: 0.800, 30: 0.800},
)


def read_quality_curves(path: Path) -> QualityCurve:
    """The `gold_in_top_n` curves by rerank depth of an `eval.calibrate.quality_curves` result
    file, and its `quote_by_depth` where one was added (quotes answered at fixed depths)."""
    try:
        metrics = json.loads(path.read_text())["metrics"]
        return QualityCurve(
            {int(d): tuple(curve["gold_in_top_n"]) for d, curve in metrics["depths"].items()},
            {int(d): float(q) for d, q in metrics.get("quote_by_depth", {}).items()},
        )
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{path} is not a quality-curves result: {exc}") from exc


@dataclass(frozen=True, slots=True)
class PlanningConfig:
    enabled: bool = True
    rerank_depths: tuple[int, ...] = (0, 10, 20, 30)
    fixed_rerank_depth: int = 20
    retrieve_slack: int = 0
    margin_fraction: float = 0.1
    margin_ms: float = 50.0
    admit_quantile: float = 0.9
    burst_window_s: float = 5.0
    slots_per_worker: int = 1
    tier_weights: tuple[tuple[str, float], ...] = (("premium", 3.0), ("standard", 1.0))
    default_tier: str = "standard"
    tier_max_wait_ms: float = 2000.0
    # Requests that may wait for a worker's generation slots; more get 503.
    queue_max: int = DEFAULT_QUEUE_MAX
    quality: QualityCurve = DEFAULT_QUALITY
    # SGLang workers the whole fleet shares, for the fleet's arrival rate per worker (None:
    # this replica's workers).
    fleet_workers: int | None = None


class FleetRate(Protocol):
    def mark(self) -> None: ...

    def per_second(self) -> float | None: ...


class RequestPlanning:
    def __init__(
        self, config: PlanningConfig, workers: Sequence[str], fleet: FleetRate | None = None
    ) -> None:
        self.config = config
        # Every replica's arrivals (answer_service/runtime/fleet_rate.py), where replicas share Redis.
        self.fleet = fleet
        self.models = StageModels(admit_quantile=config.admit_quantile)
        self.planner = Planner(
            self.models,
            config.quality,
            PlannerConfig(
                rerank_depths=config.rerank_depths,
                retrieve_slack=config.retrieve_slack,
                margin_fraction=config.margin_fraction,
                margin_ms=config.margin_ms,
            ),
        )
        self.arrivals = ArrivalRate(burst_window_s=config.burst_window_s)
        self.workers = max(len(workers), 1)
        self.gate = GenerationGate(
            workers,
            config.slots_per_worker,
            dict(config.tier_weights),
            config.tier_max_wait_ms,
            config.queue_max,
        )

    def start(
        self,
        query: str,
        top_k: int,
        remaining_ms: float,
        budget_ms: float,
        tier: str,
        reranker: bool,
        cache: CacheEstimator,
        *,
        mode: AnswerMode = "auto",
        quote_expected: bool = False,
        arrival: bool = True,
    ) -> RequestPlan:
        """The plan at arrival: the planner's choice, or the fixed configuration. A `quote`
        request is planned as one (no generation to pay for: the rerank depth is what it buys),
        and so is an `auto` one the quote is expected to answer (`quote_expected`: the forms'
        curves put it above every generated form); otherwise under `auto` the quote's own plan
        is kept for when no generation can make the budget.
        `arrival`: whether the request counts in the arrival rate (one the answer cache serves
        does not: it asks nothing of the workers)."""
        worker = self.gate.least_loaded()
        request = PlanInput(
            remaining_ms=remaining_ms,
            query_tokens=query_tokens(query),
            max_passages=top_k,
            reranker=reranker,
            prefill_ahead_tokens=self.gate.pending_tokens(worker),
            requests_ahead=self.gate.requests_ahead(worker),
            worker=worker,
            cached_share=cache.cached_share(worker),
            arrival_rate_rps=self.arrival_rate_rps(),
            quote=mode == "quote" or (mode == "auto" and quote_expected),
            replica_rate_rps=self.arrivals.per_second(),
        )
        if arrival:  # after: the rate is that of the requests before this one
            self.arrivals.mark()
            if self.fleet is not None:
                self.fleet.mark()
        quote = None
        if self.config.enabled:
            plan = self.planner.plan(request)
            if mode == "auto" and not request.quote:
                quote = self.planner.plan(dataclasses.replace(request, quote=True))
        else:
            depth = self.config.fixed_rerank_depth if reranker else 0
            plan = self.planner.evaluate(request, depth, top_k)
        return RequestPlan.at_arrival(
            plan,
            quote=quote,
            planner=self.config.enabled,
            tier=tier,
            budget_ms=budget_ms,
            requests_ahead=request.requests_ahead,
            # The smallest generated answer's, whatever this request is planned as.
            idle_floor_ms=self.planner.idle_floor_ms(dataclasses.replace(request, quote=False)),
        )

    def arrival_rate_rps(self) -> float:
        """Arrivals per second per worker: this replica's, or the fleet's where that is known
        and higher (a replica alone underestimates what its workers are asked to do)."""
        local = self.arrivals.per_second() / self.workers
        fleet = self.fleet.per_second() if self.fleet is not None else None
        if fleet is None:
            return local
        return max(local, fleet / (self.config.fleet_workers or self.workers))

    def retry_after_s(self) -> int:
        """When the least loaded worker should have worked off its queue."""
        worker = self.gate.least_loaded()
        drain_ms = self.models.predict_ms("first_token", self.gate.pending_tokens(worker), worker)
        return max(1, math.ceil(drain_ms / 1000.0))

    def observe(self, stage: StageName, work: float, elapsed_ms: float, worker: str = "") -> None:
        self.models.observe(stage, work, elapsed_ms, worker)
