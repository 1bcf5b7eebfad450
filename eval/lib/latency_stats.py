"""What a load run records per request, and the latency statistics computed from the records.

Everything here is pure: the load engine (`eval/lib/load_engine.py`) produces `RequestRecord`s grouped in
`LevelRun`s, these functions turn them into the `metrics` of `answer-eval load`.

Definitions (all times in milliseconds, measured by the client unless named `server_`):
- percentiles are numpy's default linear interpolation between closest ranks
  (`numpy.percentile(..., method="linear")`, Hyndman & Fan type 7);
- `ttft_ms`: from sending the request to the first `token` event, over the requests that got
  one; `server_ttft_ms`: the `ttft_ms` the service reported in its `done` event;
- `itl_ms`: gaps between consecutive `token` events, pooled over all requests (the mean is the
  mean gap, not a mean of per-request means);
- `e2e_ms`: from sending to the end of the stream, over the requests that finished `ok`;
- `slo_attainment`: requests that finished `ok` with a client TTFT <= the SLO, divided by all
  requests that arrived at that level. Rejected (429/503 with Retry-After), errored (non-200,
  `error` event, broken stream), timed-out and dropped-by-client requests all count as misses:
  a request the service refused or failed did not get its first token in time;
- `goodput_rps` (DistServe): the highest offered rate whose attainment is at least 90%; 0.0
  when no level reaches it;
- `cached_token_share`: the sum of cached prompt tokens over the sum of prompt tokens, over the
  requests whose `done` event reported them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, cast

import numpy as np

Status = Literal["ok", "error", "rejected", "timeout", "dropped"]
LevelKind = Literal["rate", "concurrency"]

PERCENTILES = (50, 90, 95, 99)
GOODPUT_ATTAINMENT = 0.9


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """One request as the client saw it.

    `rate_rps` is set in open loop, `concurrency` in closed loop. Offsets are seconds since the
    level started; `planned_offset_s` is the Poisson arrival time (open loop only), so
    `start_offset_s - planned_offset_s` is the client's own scheduling lag. `dropped` requests
    were never sent (the client's in-flight cap was reached).

    The optional tail is written only when set: `passages_in_prompt` and `form` (the answer
    form that answered) from the `done` event, `answer` (the answer's text, for requests that
    finished ok, when the run keeps answers; `short_answer` its short answer's) and the `plan_*` choices of the service's `plan`
    event.
    """

    question_id: str
    status: Status
    start_offset_s: float
    rate_rps: float | None = None
    concurrency: int | None = None
    planned_offset_s: float | None = None
    http_status: int | None = None
    error_code: str | None = None
    client_ttft_ms: float | None = None
    server_ttft_ms: float | None = None
    e2e_ms: float | None = None
    itl_ms: tuple[float, ...] = ()
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    completion_tokens: int | None = None
    outcome: str | None = None
    stages_ms: tuple[tuple[str, float], ...] = ()
    passages_in_prompt: int | None = None
    form: str | None = None
    # Prompt tokens sent ahead of the form's decision and aborted (the `done` event's).
    wasted_prefill_tokens: int | None = None
    answer: str | None = None
    short_answer: str | None = None
    plan_planner: bool | None = None
    plan_rerank_depth: int | None = None
    plan_passages: int | None = None
    plan_retrieve_k: int | None = None
    plan_cuts: tuple[str, ...] | None = None

    @property
    def lag_ms(self) -> float | None:
        if self.planned_offset_s is None or self.status == "dropped":
            return None
        return (self.start_offset_s - self.planned_offset_s) * 1000.0

    def to_json(self) -> dict[str, Any]:
        return {
            "question_id": self.question_id,
            "status": self.status,
            "start_offset_s": round(self.start_offset_s, 6),
            "rate_rps": self.rate_rps,
            "concurrency": self.concurrency,
            "planned_offset_s": _round(self.planned_offset_s, 6),
            "http_status": self.http_status,
            "error_code": self.error_code,
            "client_ttft_ms": _round(self.client_ttft_ms),
            "server_ttft_ms": self.server_ttft_ms,
            "e2e_ms": _round(self.e2e_ms),
            "itl_ms": [round(gap, 3) for gap in self.itl_ms],
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "completion_tokens": self.completion_tokens,
            "outcome": self.outcome,
            "stages_ms": dict(self.stages_ms),
            **{
                name: list(value) if isinstance(value, tuple) else value
                for name in _OPTIONAL
                if (value := getattr(self, name)) is not None
            },
        }

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> RequestRecord:
        cuts = value.get("plan_cuts")
        return cls(
            **{
                **value,
                "status": cast(Status, value["status"]),
                "itl_ms": tuple(value["itl_ms"]),
                "stages_ms": tuple(value["stages_ms"].items()),
                "plan_cuts": None if cuts is None else tuple(cuts),
            }
        )


# RequestRecord's fields that `to_json` writes only when they are set.
_OPTIONAL = (
    "passages_in_prompt",
    "form",
    "wasted_prefill_tokens",
    "answer",
    "short_answer",
    "plan_planner",
    "plan_rerank_depth",
    "plan_passages",
    "plan_retrieve_k",
    "plan_cuts",
)


@dataclass(frozen=True, slots=True)
class LevelRun:
    """All requests of one load level (a rate, or a concurrency) and its wall time: from the
    first planned arrival to the last response, the drain included."""

    kind: LevelKind
    level: float
    duration_s: float
    elapsed_s: float
    records: tuple[RequestRecord, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "level": self.level,
            "duration_s": self.duration_s,
            "elapsed_s": round(self.elapsed_s, 6),
            "records": [record.to_json() for record in self.records],
        }

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> LevelRun:
        return cls(
            kind=cast(LevelKind, value["kind"]),
            level=float(value["level"]),
            duration_s=float(value["duration_s"]),
            elapsed_s=float(value["elapsed_s"]),
            records=tuple(RequestRecord.from_json(r) for r in value["records"]),
        )


def _round(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


def percentiles(values: Iterable[float], qs: Sequence[int] = PERCENTILES) -> dict[str, float]:
    """`{"p50": ..., ...}` by numpy's linear interpolation; empty when there are no values."""
    array = np.fromiter(values, dtype=np.float64)
    if array.size == 0:
        return {}
    points = np.percentile(array, qs, method="linear")
    return {f"p{q}": round(float(v), 3) for q, v in zip(qs, points, strict=True)}


def _summary(values: Sequence[float], qs: Sequence[int] = PERCENTILES) -> dict[str, Any]:
    summary: dict[str, Any] = {"count": len(values), **percentiles(values, qs)}
    if values:
        summary["mean"] = round(float(np.mean(values)), 3)
    return summary


def slo_hit(record: RequestRecord, slo_ms: float) -> bool:
    return (
        record.status == "ok"
        and record.client_ttft_ms is not None
        and record.client_ttft_ms <= slo_ms
    )


def slo_attainment(records: Sequence[RequestRecord], slo_ms: float) -> float | None:
    """Share of all arrivals that finished ok with a first token within `slo_ms`; rejected,
    errored, timed-out and dropped requests count as misses. None when nothing arrived."""
    if not records:
        return None
    return sum(slo_hit(r, slo_ms) for r in records) / len(records)


def goodput_rps(levels: Iterable[tuple[float, float | None]]) -> float:
    """DistServe's goodput: the highest rate whose SLO attainment is >= 90% (0.0 if none).
    `levels` are (rate, attainment) pairs; attainment need not fall monotonically with rate."""
    meeting = [
        rate for rate, attained in levels if attained is not None and attained >= GOODPUT_ATTAINMENT
    ]
    return max(meeting, default=0.0)


def cached_token_share(records: Iterable[RequestRecord]) -> float | None:
    """Sum of cached over sum of prompt tokens, over requests that reported both."""
    prompt = cached = 0
    for record in records:
        if record.prompt_tokens is not None and record.cached_tokens is not None:
            prompt += record.prompt_tokens
            cached += record.cached_tokens
    return cached / prompt if prompt else None


def itl_stats(records: Iterable[RequestRecord]) -> dict[str, Any]:
    """Mean, p50 and p95 of the inter-token gaps of all requests pooled together."""
    gaps = [gap for record in records for gap in record.itl_ms]
    return _summary(gaps, (50, 95))


def stage_p50_ms(records: Iterable[RequestRecord]) -> dict[str, float]:
    """The median of each server stage's time, over the requests that reported it."""
    by_stage: dict[str, list[float]] = {}
    for record in records:
        for stage, elapsed_ms in record.stages_ms:
            by_stage.setdefault(stage, []).append(elapsed_ms)
    return {stage: percentiles(values, (50,))["p50"] for stage, values in by_stage.items()}


def counts(records: Iterable[RequestRecord]) -> dict[str, int]:
    tally = {"ok": 0, "errored": 0, "rejected": 0, "timeouts": 0, "dropped_by_client": 0}
    names = {"ok": "ok", "error": "errored", "rejected": "rejected", "timeout": "timeouts"}
    for record in records:
        tally[names.get(record.status, "dropped_by_client")] += 1
    return tally


def level_metrics(run: LevelRun, slo_ms: float) -> dict[str, Any]:
    """The metrics of one level; see the module docstring for the definitions."""
    records = run.records
    tally = counts(records)
    ok = [r for r in records if r.status == "ok"]
    lags = [lag for r in records if (lag := r.lag_ms) is not None]
    prompt = sum(r.prompt_tokens or 0 for r in records)
    cached = sum(r.cached_tokens or 0 for r in records)
    metrics: dict[str, Any] = {
        run.kind: run.level,
        "arrivals": len(records),
        "sent": len(records) - tally["dropped_by_client"],
        **tally,
        "slo_attainment": slo_attainment(records, slo_ms),
        "offered_rps": round(len(records) / run.duration_s, 3) if run.duration_s else None,
        "throughput_rps": round(len(ok) / run.elapsed_s, 3) if run.elapsed_s else None,
        "elapsed_s": round(run.elapsed_s, 3),
        "ttft_ms": _summary([t for r in records if (t := r.client_ttft_ms) is not None]),
        "server_ttft_ms": _summary([t for r in records if (t := r.server_ttft_ms) is not None]),
        "itl_ms": itl_stats(records),
        "e2e_ms": _summary([t for r in ok if (t := r.e2e_ms) is not None], (50, 95, 99)),
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "cached_token_share": cached_token_share(records),
        "stage_p50_ms": stage_p50_ms(records),
    }
    if lags:
        metrics["schedule_lag_ms"] = {**percentiles(lags, (50, 99)), "max": round(max(lags), 3)}
    return metrics


def sweep_metrics(runs: Sequence[LevelRun], slo_ms: float) -> dict[str, Any]:
    """`{"rates" | "concurrency": [per level], "goodput_rps", "slo_ms"}`. In open loop the
    goodput is over the nominal rates; in closed loop over each level's offered rate (requests
    sent per second of the duration), since there the rate is an outcome, not a setting."""
    kind = runs[0].kind if runs else "rate"
    levels = [level_metrics(run, slo_ms) for run in runs]
    rate_key = "rate" if kind == "rate" else "offered_rps"
    return {
        "rates" if kind == "rate" else "concurrency": levels,
        "goodput_rps": goodput_rps((m[rate_key], m["slo_attainment"]) for m in levels),
        "slo_ms": slo_ms,
    }
