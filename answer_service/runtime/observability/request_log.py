"""What the dashboard is drawn from: one summary per finished or refused request.

`RequestLog` keeps the last summaries of this replica in memory and, when the service has a
Redis (`ANSWER_REDIS_URL`), also appends them to a shared stream, so a dashboard on any replica
sees every replica's requests (`answer_service/runtime/observability/shared_requests.py`). A summary holds numbers and
ids only: no query, passage or answer text.

Replicas of different versions share one stream: `from_json` reads a summary that lacks the
fields added since (the answer's form and how it ended) with their defaults, and ignores the
top-level fields it does not know (a newer replica wrote them).
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, Protocol

from answer_service.pipeline.events import AnswerStats, Cut, PlanRecord
from budget.planner import STAGES, Knobs


@dataclass(frozen=True, slots=True)
class StageSpend:
    stage: str
    planned_ms: float
    actual_ms: float


@dataclass(frozen=True, slots=True)
class RequestSummary:
    """A request as the dashboard shows it. `at` is when it ended (unix seconds)."""

    trace_id: str
    at: float
    replica: str
    tier: str
    # ok, error, cancelled, sources_only, or the code it was refused with (overloaded, ...).
    outcome: str
    budget_ms: float
    ttft_ms: float | None
    within_budget: bool
    worker: str
    prompt_tokens: int
    cached_tokens: int
    planner: bool
    quality: float | None
    knobs: Knobs | None
    initial: Knobs | None
    stages: tuple[StageSpend, ...]
    queue_wait_ms: float
    cuts: tuple[Cut, ...]
    degraded: tuple[str, ...]
    # The answer_mode asked for and the form that answered (quote, focused, passages, abstain,
    # sources_only) and why; "" for a refusal, and for a summary from an older replica.
    mode: str = ""
    form: str = ""
    form_reason: str = ""
    # stop, length, repetition, unsupported, quote, ... (AnswerStats.finish_reason).
    finish_reason: str = ""
    unsupported_sentences: int = 0
    from_cache: bool = False

    @property
    def refused(self) -> bool:
        """Refused before any event was sent (no plan ran)."""
        return self.knobs is None

    @classmethod
    def answered(
        cls, stats: AnswerStats, plan: PlanRecord, *, at: float, replica: str
    ) -> RequestSummary:
        return cls(
            trace_id=stats.trace_id,
            at=at,
            replica=replica,
            tier=plan.tier,
            outcome=stats.outcome,
            budget_ms=plan.budget_ms,
            ttft_ms=stats.ttft_ms,
            within_budget=stats.within_budget,
            worker=stats.worker,
            prompt_tokens=stats.prompt_tokens,
            cached_tokens=stats.cached_tokens,
            planner=plan.planner,
            quality=plan.quality,
            knobs=plan.knobs,
            initial=plan.initial,
            stages=tuple(
                StageSpend(stage, plan.predicted_ms.of(stage), plan.actual_ms.of(stage))
                for stage in STAGES
            ),
            queue_wait_ms=plan.queue_wait_ms,
            cuts=plan.cuts,
            degraded=stats.degraded,
            mode=plan.mode,
            form=stats.form,
            form_reason=stats.form_reason,
            finish_reason=stats.finish_reason,
            unsupported_sentences=stats.unsupported_sentences,
            from_cache=stats.from_cache,
        )

    @classmethod
    def refusal(
        cls, *, trace_id: str, tier: str, code: str, budget_ms: float, at: float, replica: str
    ) -> RequestSummary:
        return cls(
            trace_id=trace_id,
            at=at,
            replica=replica,
            tier=tier,
            outcome=code,
            budget_ms=budget_ms,
            ttft_ms=None,
            within_budget=False,
            worker="",
            prompt_tokens=0,
            cached_tokens=0,
            planner=False,
            quality=None,
            knobs=None,
            initial=None,
            stages=(),
            queue_wait_ms=0.0,
            cuts=(),
            degraded=(),
        )

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RequestSummary:
        """The inverse of `to_json`; a malformed record raises KeyError, TypeError or
        ValueError. The fields with defaults may be missing (an older replica wrote it)."""

        def knobs(value: Any) -> Knobs | None:
            return None if value is None else Knobs.from_json(value)

        ttft = data["ttft_ms"]
        quality = data["quality"]
        return cls(
            trace_id=str(data["trace_id"]),
            at=float(data["at"]),
            replica=str(data["replica"]),
            tier=str(data["tier"]),
            outcome=str(data["outcome"]),
            budget_ms=float(data["budget_ms"]),
            ttft_ms=None if ttft is None else float(ttft),
            within_budget=bool(data["within_budget"]),
            worker=str(data["worker"]),
            prompt_tokens=int(data["prompt_tokens"]),
            cached_tokens=int(data["cached_tokens"]),
            planner=bool(data["planner"]),
            quality=None if quality is None else float(quality),
            knobs=knobs(data["knobs"]),
            initial=knobs(data["initial"]),
            stages=tuple(StageSpend(**s) for s in data["stages"]),
            queue_wait_ms=float(data["queue_wait_ms"]),
            cuts=tuple(Cut.from_json(c) for c in data["cuts"]),
            degraded=tuple(str(d) for d in data["degraded"]),
            mode=str(data.get("mode", "")),
            form=str(data.get("form", "")),
            form_reason=str(data.get("form_reason", "")),
            finish_reason=str(data.get("finish_reason", "")),
            unsupported_sentences=int(data.get("unsupported_sentences", 0)),
            from_cache=bool(data.get("from_cache", False)),
        )


class SummarySink(Protocol):
    """Where summaries are shared beyond this process (a Redis stream)."""

    def publish(self, summary: RequestSummary) -> None: ...


def this_replica() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


class RequestLog:
    """This replica's last `capacity` request summaries, newest last. Called from the event
    loop and from worker threads alike, so it locks."""

    def __init__(
        self,
        capacity: int = 2000,
        *,
        replica: str | None = None,
        sink: SummarySink | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.replica = replica or this_replica()
        self.sink = sink
        self._clock = clock
        self._summaries: deque[RequestSummary] = deque(maxlen=capacity)
        self._lock = threading.Lock()

    def answered(self, stats: AnswerStats, plan: PlanRecord) -> None:
        self.add(RequestSummary.answered(stats, plan, at=self._clock(), replica=self.replica))

    def refused(self, *, trace_id: str, tier: str, code: str, budget_ms: float) -> None:
        self.add(
            RequestSummary.refusal(
                trace_id=trace_id,
                tier=tier,
                code=code,
                budget_ms=budget_ms,
                at=self._clock(),
                replica=self.replica,
            )
        )

    def add(self, summary: RequestSummary) -> None:
        with self._lock:
            self._summaries.append(summary)
        if self.sink is not None:
            self.sink.publish(summary)

    def since(self, at: float) -> list[RequestSummary]:
        """Summaries that ended at or after `at`, oldest first."""
        with self._lock:
            return [s for s in self._summaries if s.at >= at]
