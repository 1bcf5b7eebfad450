"""`answer-eval report RESULT.json... --out DIR`: one Markdown page (`DIR/report.md`) with PNG
plots beside it, over the result files of the other commands, to show where the time went.

    answer-eval report eval/results/*.json run/load-*.json --out report/

Takes `retrieval`, `answers` and `load` results and the stage-cost table
in any mix (`eval/commands/report_inputs.py` reads them); each section is drawn from the files that have
its data and left out when none has. Every file is read before anything is written; a bad one
stops the report with one line naming it and exit code 2.

Sections: a summary row per file; latency CDFs (client TTFT and e2e per level or variant, the
SLO and the TTFT budget as vertical lines); the stage waterfall (p50 and p95 time per stage up
to the first token against the TTFT budget, and the planner's per-stage budgets where records
carry a `plan`); SLO attainment vs offered rate over all load files, goodput starred; quality vs
depth; the stage-cost table. The plots are drawn by `eval/commands/report_plots.py`.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from eval.commands.report_inputs import (
    AnswerMetrics,
    AnswersResult,
    AnyResult,
    LoadResult,
    ReportInputError,
    ResultFile,
    RetrievalResult,
    StageCostsResult,
    config_ms,
    load_levels,
    planned_stages,
    read_results,
    request_groups,
    stage_segments,
)
from eval.commands.report_plots import (
    LatencyPlot,
    LatencySeries,
    QualityPoint,
    StageBar,
    SweepSeries,
    WaterfallPlot,
    plot_latency,
    plot_quality,
    plot_sweeps,
    plot_waterfall,
)

REPORT_FILE = "report.md"


def _num(value: float | int | None, digits: int = 3) -> str:
    if value is None:
        return "-"
    return str(value) if isinstance(value, int) else f"{value:.{digits}f}"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}" if abs(value) >= 100 else f"{value:.1f}"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
    return [*lines, ""]


def _pcts(values: Sequence[float], qs: Sequence[int]) -> list[float | None]:
    if not values:
        return [None] * len(qs)
    return [float(v) for v in np.percentile(np.asarray(values, dtype=float), qs)]


def _headline(result: AnyResult) -> str:
    if isinstance(result, RetrievalResult):
        parts = [
            f"{mode} "
            + ", ".join(
                f"{name} {value:.3f}"
                for name, value in metrics.items()
                if name in ("ndcg@10", "recall@100")
            )
            for mode, metrics in result.metrics.items()
        ]
        return "; ".join(parts) + f" (depth {result.config.get('depth', '-')})"
    if isinstance(result, AnswersResult):
        m = result.metrics
        return (
            f"F1 {_num(m.f1)}, answer recall {_num(m.answer_recall)}, citation P/R "
            f"{_num(m.citation_precision)}/{_num(m.citation_recall)}; TTFT p50 "
            f"{_ms(m.ttft_ms.get('p50'))} ms, p95 {_ms(m.ttft_ms.get('p95'))} ms; ok {m.ok} of "
            f"{m.ok + m.errored + m.rejected}"
        )
    if isinstance(result, LoadResult):
        levels = load_levels(result)
        best = max((lv.slo_attainment or 0.0 for lv in levels), default=0.0)
        return (
            f"goodput {_num(result.metrics.goodput_rps, 2)} rps at TTFT ≤ "
            f"{_ms(result.metrics.slo_ms)} ms; {len(levels)} level(s); best attainment {best:.3f}"
        )
    stages = sorted({cost.stage for cost in result.costs})
    return f"{len(result.costs)} measurements of {', '.join(stages)}"


def _summary(files: Sequence[ResultFile]) -> list[str]:
    rows = []
    for file in files:
        result = file.result
        if isinstance(result, StageCostsResult):
            stamp, dataset = result.created_at, result.index
        else:
            stamp, dataset = result.timestamp, result.dataset
        counts = ", ".join(f"{k} {v}" for k, v in dataset.items() if isinstance(v, int | float))
        rows.append(
            [f"`{file.path}`", file.command, stamp or "-", counts or "-", _headline(result)]
        )
    return [
        "## Summary",
        "",
        *_table(["file", "command", "timestamp", "dataset", "headline"], rows),
    ]


def _latency(files: Sequence[ResultFile], out: Path) -> list[str]:
    lines: list[str] = []
    for file in files:
        groups = request_groups(file.result)
        series = [
            LatencySeries(
                label,
                len(records),
                tuple(t for r in records if (t := r.client_ttft) is not None),
                tuple(e for r in records if r.status == "ok" and (e := r.e2e_ms) is not None),
            )
            for label, records in groups
        ]
        if not any(s.ttft_ms or s.e2e_ms for s in series):
            continue
        png = f"{file.slug}-latency.png"
        slo, budget = config_ms(file, "slo_ms"), config_ms(file, "ttft_budget_ms")
        plot_latency(
            LatencyPlot(f"{file.label}: latency CDF", tuple(series), slo, budget), out / png
        )
        rows = []
        for s in series:
            ttft, e2e = _pcts(s.ttft_ms, (50, 90, 99)), _pcts(s.e2e_ms, (50, 99))
            rows.append(
                [
                    s.label,
                    str(s.arrivals),
                    str(len(s.ttft_ms)),
                    *(_ms(v) for v in ttft),
                    *(_ms(v) for v in e2e),
                ]
            )
        header = [
            "series",
            "requests",
            "with TTFT",
            "TTFT p50 ms",
            "p90",
            "p99",
            "e2e p50 ms",
            "p99",
        ]
        lines += [
            f"### {file.label}",
            "",
            f"![{file.label} latency CDF]({png})",
            "",
            *_table(header, rows),
        ]
    if not lines:
        return []
    intro = (
        "Client-side CDFs over all requests of each level or variant: failed, rejected "
        "and dropped requests never reach the curve, so where the TTFT curve crosses the "
        "SLO line is close to the SLO attainment."
    )
    return ["## Latency CDFs", "", intro, "", *lines]


def _stage_bars(file: ResultFile) -> list[StageBar]:
    bars: list[StageBar] = []
    for label, records in request_groups(file.result):
        per_request = [s for r in records if (s := stage_segments(r)) is not None]
        if not per_request:
            continue
        budgets = [b for r in records if (b := r.ttft_budget_ms) is not None]
        budget = float(np.median(budgets)) if budgets else config_ms(file, "ttft_budget_ms")
        if planned := planned_stages(records):
            bars.append(StageBar(f"{label} · planned", planned, budget, planned=True))
        names = list(dict.fromkeys(name for s in per_request for name in s))
        for q in (50, 95):
            spent = tuple(
                (name, float(np.percentile([s.get(name, 0.0) for s in per_request], q)))
                for name in names
            )
            bars.append(StageBar(f"{label} · p{q} (n={len(per_request)})", spent, budget))
    return bars


def _waterfall(files: Sequence[ResultFile], out: Path) -> list[str]:
    lines: list[str] = []
    for file in files:
        bars = _stage_bars(file)
        if not bars:
            continue
        png = f"{file.slug}-stages.png"
        slo = config_ms(file, "slo_ms")
        plot_waterfall(
            WaterfallPlot(f"{file.label}: time per stage up to the first token", tuple(bars), slo),
            out / png,
        )
        names = list(dict.fromkeys(name for bar in bars for name, _ in bar.stages_ms))
        rows = [
            [
                bar.label,
                *(_ms(dict(bar.stages_ms).get(n)) for n in names),
                _ms(sum(ms for _, ms in bar.stages_ms)),
                _ms(bar.budget_ms),
            ]
            for bar in bars
        ]
        lines += [
            f"### {file.label}",
            "",
            f"![{file.label} stage waterfall]({png})",
            "",
            *_table(["bar", *(f"{n} ms" for n in names), "sum ms", "budget ms"], rows),
        ]
    if not lines:
        return []
    intro = (
        "Median and p95 time per stage of the requests that finished ok, stacked in "
        "pipeline order, against the TTFT budget (black tick). `first token` is the "
        "server's TTFT less the earlier stages; `client/network` is client TTFT less "
        "server TTFT. Percentiles are per stage, so a bar's sum is not the TTFT "
        "percentile."
    )
    return ["## Where the time went: stage waterfall", "", intro, "", *lines]


def _sweeps(files: Sequence[ResultFile], out: Path) -> list[str]:
    loads = [(f, f.result) for f in files if isinstance(f.result, LoadResult)]
    if not loads:
        return []
    series = [
        SweepSeries(
            file.label,
            tuple(
                (x, lv.slo_attainment)
                for lv in load_levels(result)
                if (x := lv.offered) is not None and lv.slo_attainment is not None
            ),
            result.metrics.goodput_rps,
            config_ms(file, "slo_ms"),
        )
        for file, result in loads
    ]
    lines = ["## SLO attainment vs offered rate", ""]
    if any(s.points for s in series):
        plot_sweeps(series, out / "slo-attainment.png")
        lines += ["![SLO attainment vs offered rate](slo-attainment.png)", ""]
    header = [
        "level",
        "offered rps",
        "arrivals",
        "ok",
        "rejected",
        "errored",
        "timeouts",
        "dropped",
        "attainment",
        "TTFT p50 ms",
        "p99",
        "e2e p50 ms",
        "cached share",
    ]
    for file, result in loads:
        rows = [
            [
                f"{'rate' if lv.rate is not None else 'concurrency'} "
                f"{lv.rate if lv.rate is not None else lv.concurrency:g}",
                _num(lv.offered_rps, 2),
                str(lv.arrivals),
                str(lv.ok),
                str(lv.rejected),
                str(lv.errored),
                str(lv.timeouts),
                str(lv.dropped_by_client),
                _num(lv.slo_attainment),
                _ms(lv.ttft_ms.get("p50")),
                _ms(lv.ttft_ms.get("p99")),
                _ms(lv.e2e_ms.get("p50")),
                _num(lv.cached_token_share),
            ]
            for lv in load_levels(result)
        ]
        lines += [
            f"### {file.label}: goodput {_num(result.metrics.goodput_rps, 2)} rps at TTFT "
            f"≤ {_ms(config_ms(file, 'slo_ms'))} ms",
            "",
            *_table(header, rows),
        ]
    return lines


_ANSWER_COLUMNS = (
    "exact_match",
    "f1",
    "answer_recall",
    "citation_precision",
    "citation_recall",
    "abstention_rate",
    "false_abstention_rate",
    "cached_token_share",
)


def _answer_row(name: str, m: AnswerMetrics) -> list[str]:
    return [
        name,
        *(_num(getattr(m, column)) for column in _ANSWER_COLUMNS),
        _ms(m.ttft_ms.get("p50")),
        _ms(m.ttft_ms.get("p95")),
        f"{m.ok}/{m.errored}/{m.rejected}",
    ]


def _depth(config: dict[str, Any], key: str) -> float | None:
    value = config.get(key)
    return float(value) if isinstance(value, int | float) else None


def _quality(files: Sequence[ResultFile], out: Path) -> list[str]:
    points: list[QualityPoint] = []
    tables: list[str] = []
    answer_header = ["run", *_ANSWER_COLUMNS, "TTFT p50 ms", "p95", "ok/errored/rejected"]
    for file in files:
        result = file.result
        if isinstance(result, RetrievalResult):
            depth = _depth(result.config, "depth")
            names = list(dict.fromkeys(n for metrics in result.metrics.values() for n in metrics))
            for mode, metrics in result.metrics.items():
                points += [
                    QualityPoint("retrieval", mode, name, depth, value, file.label)
                    for name, value in metrics.items()
                    if depth is not None and name in ("ndcg@10", "recall@100")
                ]
            rows = [
                [mode, *(_num(metrics.get(n)) for n in names)]
                for mode, metrics in result.metrics.items()
            ]
            tables += [
                f"### {file.label} (depth {_num(depth, 0)})",
                "",
                *_table(["mode", *names], rows),
            ]
        elif isinstance(result, AnswersResult):
            top_k = _depth(result.config, "top_k")
            if top_k is not None:
                points += [
                    QualityPoint("answers", "answers", name, top_k, value, file.label)
                    for name in ("answer_recall", "f1")
                    if (value := getattr(result.metrics, name)) is not None
                ]
            tables += [
                f"### {file.label} (top_k {_num(top_k, 0)})",
                "",
                *_table(answer_header, [_answer_row("all", result.metrics)]),
            ]
    if not tables:
        return []
    lines = ["## Quality vs depth", ""]
    if points:
        plot_quality(points, out / "quality-depth.png")
        lines += ["![quality vs depth](quality-depth.png)", ""]
    return [*lines, *tables]


def _stage_costs(files: Sequence[ResultFile]) -> list[str]:
    lines: list[str] = []
    for file in files:
        if not isinstance(file.result, StageCostsResult):
            continue
        rows = [
            [
                c.stage,
                ", ".join(f"{k}={v}" for k, v in c.setting.items() if v is not None),
                _ms(c.p50_ms),
                _ms(c.p95_ms),
                str(c.runs),
                _num(c.recall),
            ]
            for c in file.result.costs
        ]
        lines += [
            f"### {file.label}",
            "",
            f"<details><summary>{len(rows)} measurements</summary>",
            "",
            *_table(["stage", "setting", "p50 ms", "p95 ms", "runs", "recall@k"], rows),
            "</details>",
            "",
        ]
    return ["## Stage costs (the planner's prior)", "", *lines] if lines else []


def write_report(paths: Sequence[Path], out: Path) -> Path:
    """Read every file first (so a bad one stops the report before anything is written), then
    write `out/report.md` and its plots."""
    files = read_results(paths)
    out.mkdir(parents=True, exist_ok=True)
    sections: list[Callable[[], list[str]]] = [
        lambda: _summary(files),
        lambda: _latency(files, out),
        lambda: _waterfall(files, out),
        lambda: _sweeps(files, out),
        lambda: _quality(files, out),
        lambda: _stage_costs(files),
    ]
    lines = ["# answer-eval report", "", f"From {len(files)} result file(s).", ""]
    for section in sections:
        lines += section()
    page = out / REPORT_FILE
    page.write_text("\n".join(lines).rstrip() + "\n", encoding="utf-8")
    return page


async def _report(args: argparse.Namespace) -> int:
    try:
        page = await asyncio.to_thread(write_report, args.results, args.out)
    except ReportInputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(page)
    return 0


def add_report_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    report = commands.add_parser(
        "report", help="Markdown and PNG plots (latency CDFs, stage waterfall, SLO, quality)"
    )
    report.add_argument("results", type=Path, nargs="+", metavar="RESULT.json")
    report.add_argument("--out", type=Path, required=True, help="folder for report.md and PNGs")
    report.set_defaults(run=_report)
