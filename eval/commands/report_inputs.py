"""The result files `answer-eval report` reads, validated at the edge, and the arithmetic on
their per-request records.

Reads `retrieval`, `answers` and `load` results (the layout of `eval/lib/results.py`) and the
stage-cost table (`eval/results/stage-costs.json`), whole or as a
committed summary whose records lie beside it (`eval/lib/records.py`). Unknown fields are
ignored, so newer files still read; a file that is none of these, or whose fields have the
wrong shape, raises `ReportInputError` with one line naming the file.

Per-stage arithmetic (`stage_segments`), for a request that finished ok with stage timings:
the stages before generation as the service reported them; `first token` = the server's TTFT
(the client's when the server gave none) minus those stages; `client/network` = client TTFT -
server TTFT. Records with `plan: {stage: budget_ms}` carry the planner's budgets per stage
(`planned_stages`), its `generate` budget being the one up to the first token.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from eval.lib.records import RecordsError, with_records

EARLY_STAGES = ("embed", "search", "rerank", "prompt")
# Per-request stage fields that are not a step before the first token.
NOT_EARLY = frozenset({"generate", "total"})


class ReportInputError(Exception):
    """A result file the report cannot read; the message names the file."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"{path}: {reason}")


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class Request(_Model):
    """A per-request record of `answers` (`AnswerRecord`), `load` (`RequestRecord`) or a bench."""

    status: str = "ok"
    rate_rps: float | None = None
    concurrency: int | None = None
    client_ttft_ms: float | None = None
    ttft_ms: float | None = None
    server_ttft_ms: float | None = None
    e2e_ms: float | None = None
    stages_ms: dict[str, float] = Field(default_factory=dict)
    ttft_budget_ms: float | None = None
    plan: dict[str, float] | None = None

    @property
    def client_ttft(self) -> float | None:
        return self.client_ttft_ms if self.client_ttft_ms is not None else self.ttft_ms


class _Envelope(_Model):
    command: str
    config: dict[str, Any] = Field(default_factory=dict)
    dataset: dict[str, Any] = Field(default_factory=dict)
    timestamp: str = ""


class AnswerMetrics(_Model):
    exact_match: float | None = None
    f1: float | None = None
    answer_recall: float | None = None
    citation_precision: float | None = None
    citation_recall: float | None = None
    abstention_rate: float | None = None
    false_abstention_rate: float | None = None
    cached_token_share: float | None = None
    ttft_ms: dict[str, float] = Field(default_factory=dict)
    e2e_ms: dict[str, float] = Field(default_factory=dict)
    ok: int = 0
    errored: int = 0
    rejected: int = 0
    ttft_p50_speedup_vs_a: float | None = None


class LoadLevel(_Model):
    rate: float | None = None
    concurrency: float | None = None
    offered_rps: float | None = None
    arrivals: int
    ok: int
    errored: int = 0
    rejected: int = 0
    timeouts: int = 0
    dropped_by_client: int = 0
    slo_attainment: float | None = None
    ttft_ms: dict[str, float] = Field(default_factory=dict)
    e2e_ms: dict[str, float] = Field(default_factory=dict)
    cached_token_share: float | None = None

    @property
    def offered(self) -> float | None:
        """The x of the attainment curve: the nominal rate, else (closed loop) the offered one."""
        return self.rate if self.rate is not None else self.offered_rps


class LoadMetrics(_Model):
    rates: list[LoadLevel] = Field(default_factory=list)
    concurrency: list[LoadLevel] = Field(default_factory=list)
    goodput_rps: float | None = None
    slo_ms: float | None = None


class RetrievalResult(_Envelope):
    metrics: dict[str, dict[str, float]]


class AnswersResult(_Envelope):
    metrics: AnswerMetrics
    requests: list[Request] = Field(default_factory=list)


class LoadResult(_Envelope):
    metrics: LoadMetrics
    requests: list[Request] = Field(default_factory=list)


class Cost(_Model):
    stage: str
    setting: dict[str, Any]
    p50_ms: float
    p95_ms: float
    runs: int
    recall: float | None = None


class StageCostsResult(_Model):
    created_at: str = ""
    index: dict[str, Any] = Field(default_factory=dict)
    costs: list[Cost]


AnyResult = RetrievalResult | AnswersResult | LoadResult | StageCostsResult
_RESULT_MODELS: dict[str, type[AnyResult]] = {
    "retrieval": RetrievalResult,
    "answers": AnswersResult,
    "load": LoadResult,
    "stage-costs": StageCostsResult,  # written without a `command`; known by its `costs`
}


@dataclass(frozen=True, slots=True)
class ResultFile:
    path: Path
    label: str
    result: AnyResult

    @property
    def command(self) -> str:
        return "stage-costs" if isinstance(self.result, StageCostsResult) else self.result.command

    @property
    def slug(self) -> str:
        return re.sub(r"[^A-Za-z0-9_.-]+", "-", self.label).strip("-.") or "result"


def read_result(path: Path, label: str) -> ResultFile:
    """One result file, validated; `ReportInputError` with a one-line reason otherwise."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise ReportInputError(path, f"cannot read: {exc}") from exc
    except json.JSONDecodeError as exc:
        raise ReportInputError(path, f"not valid JSON ({exc.msg}, line {exc.lineno})") from exc
    if not isinstance(raw, dict):
        raise ReportInputError(path, "expected a JSON object")
    try:
        raw = with_records(raw, path.parent)  # a committed summary: its records lie beside it
    except RecordsError as exc:
        raise ReportInputError(path, str(exc)) from exc
    kind = "stage-costs" if "command" not in raw and "costs" in raw else str(raw.get("command"))
    model = _RESULT_MODELS.get(kind)
    if model is None:
        known = ", ".join(_RESULT_MODELS)
        raise ReportInputError(
            path, f"not an answer-eval result: command {raw.get('command')!r} (known: {known})"
        )
    try:
        return ResultFile(path, label, model.model_validate(raw))
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "(top level)"
        more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        reason = f"malformed {kind} result: `{where}`: {first['msg']}{more}"
        raise ReportInputError(path, reason) from exc


def read_results(paths: Sequence[Path]) -> list[ResultFile]:
    """Every file, in order, each labelled by `labels`."""
    return [read_result(path, label) for path, label in zip(paths, labels(paths), strict=True)]


def labels(paths: Sequence[Path]) -> list[str]:
    """File stems, made unique with the parent folder (then a number) where they clash."""
    stems = Counter(path.stem for path in paths)
    named = [f"{p.parent.name}/{p.stem}" if stems[p.stem] > 1 else p.stem for p in paths]
    clashes = Counter(named)
    return [f"{name} ({n})" if clashes[name] > 1 else name for n, name in enumerate(named, 1)]


def config_ms(file: ResultFile, key: str) -> float | None:
    if isinstance(file.result, StageCostsResult):
        return None
    value = file.result.config.get(key)
    if value is None and key == "slo_ms" and isinstance(file.result, LoadResult):
        value = file.result.metrics.slo_ms
    return float(value) if isinstance(value, int | float) else None


def load_levels(result: LoadResult) -> list[LoadLevel]:
    return result.metrics.rates or result.metrics.concurrency


def request_groups(result: AnyResult) -> list[tuple[str, list[Request]]]:
    """The per-request records by level (load); one group otherwise."""
    if isinstance(result, AnswersResult):
        return [("all", result.requests)] if result.requests else []
    if not isinstance(result, LoadResult):
        return []
    by_level: dict[tuple[str, float], list[Request]] = {}
    for record in result.requests:
        if record.rate_rps is not None:
            by_level.setdefault(("rate", record.rate_rps), []).append(record)
        elif record.concurrency is not None:
            by_level.setdefault(("concurrency", record.concurrency), []).append(record)
        else:
            by_level.setdefault(("level", 0.0), []).append(record)
    units = {"rate": " rps", "concurrency": " in flight", "level": ""}
    return [
        (f"{kind} {level:g}{units[kind]}", by_level[kind, level])
        for kind, level in sorted(by_level)
    ]


def stage_segments(record: Request) -> dict[str, float] | None:
    ttft = record.server_ttft_ms if record.server_ttft_ms is not None else record.client_ttft
    if record.status != "ok" or ttft is None or not record.stages_ms:
        return None
    rank = {name: n for n, name in enumerate(EARLY_STAGES)}
    early = sorted(
        ((name, ms) for name, ms in record.stages_ms.items() if name not in NOT_EARLY),
        key=lambda item: rank.get(item[0], len(rank)),
    )
    segments = dict(early)
    segments["first token"] = max(ttft - sum(segments.values()), 0.0)
    client = record.client_ttft
    if record.server_ttft_ms is not None and client is not None:
        segments["client/network"] = max(client - record.server_ttft_ms, 0.0)
    return segments


def planned_stages(records: Sequence[Request]) -> tuple[tuple[str, float], ...]:
    plans = [r.plan for r in records if r.plan]
    stages: dict[str, list[float]] = {}
    for plan in plans:
        for name, budget_ms in plan.items():
            stage = name.removesuffix("_ms")
            stages.setdefault("first token" if stage == "generate" else stage, []).append(budget_ms)
    return tuple((name, float(np.median(values))) for name, values in stages.items())
