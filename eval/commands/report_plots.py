"""The plots of `answer-eval report`: what each one draws, as typed series, and the drawing.

Each `plot_*` function writes one PNG through matplotlib's Agg canvas (`Figure.savefig`, no
pyplot and no display). matplotlib is imported on the first plot, so the other `answer-eval`
commands do not pay for it. All times are milliseconds; rates are requests per second.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import numpy as np

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

DPI = 110
GOODPUT_ATTAINMENT = 0.9
# Known stages keep one colour in every plot; others take the next free colour.
STAGE_COLOURS = {
    "embed": "#4c72b0",
    "search": "#55a868",
    "rerank": "#c44e52",
    "prompt": "#8172b2",
    "first token": "#ccb974",
    "client/network": "#8c8c8c",
}
_SPARE_COLOURS = ("#64b5cd", "#dd8452", "#937860", "#da8bc3", "#8c613c")


@dataclass(frozen=True, slots=True)
class LatencySeries:
    """One level or variant: the client TTFT of the requests that got a first token and the
    e2e of those that finished ok, out of `arrivals` requests in all."""

    label: str
    arrivals: int
    ttft_ms: tuple[float, ...]
    e2e_ms: tuple[float, ...]


@dataclass(frozen=True, slots=True)
class LatencyPlot:
    title: str
    series: tuple[LatencySeries, ...]
    slo_ms: float | None = None
    budget_ms: float | None = None


@dataclass(frozen=True, slots=True)
class StageBar:
    """One horizontal stacked bar: time per stage in pipeline order. `planned` bars show the
    planner's per-stage budgets, the others the time spent."""

    label: str
    stages_ms: tuple[tuple[str, float], ...]
    budget_ms: float | None = None
    planned: bool = False


@dataclass(frozen=True, slots=True)
class WaterfallPlot:
    title: str
    bars: tuple[StageBar, ...]
    slo_ms: float | None = None


@dataclass(frozen=True, slots=True)
class SweepSeries:
    """SLO attainment per offered rate for one file; `goodput_rps` 0.0 when no level met it."""

    label: str
    points: tuple[tuple[float, float], ...]
    goodput_rps: float | None = None
    slo_ms: float | None = None


@dataclass(frozen=True, slots=True)
class QualityPoint:
    """One measurement at one depth (retrieval `depth`, or answers `top_k`). A series is a
    (`group`, `metric`) pair: the group (a retrieval mode, or `answers`) picks the colour, the
    metric the marker. `source` names the file it came from."""

    panel: Literal["retrieval", "answers"]
    group: str
    metric: str
    depth: float
    value: float
    source: str


def _figure(width_in: float, height_in: float) -> Figure:
    from matplotlib.figure import Figure  # deferred: see the module docstring

    return Figure(figsize=(width_in, height_in), dpi=DPI, layout="constrained")


def _save(figure: Figure, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, format="png")


def cdf_points(values_ms: Sequence[float], arrivals: int) -> tuple[list[float], list[float]]:
    """A step CDF over all `arrivals`, rising from 0 at the first value: requests without a
    value never reach the curve, so it tops out at the share that got one."""
    xs = sorted(values_ms)
    if not xs:
        return [], []
    total = max(arrivals, len(xs))
    return [xs[0], *xs], [0.0, *((rank + 1) / total for rank in range(len(xs)))]


def _log_scale(values: Sequence[float]) -> bool:
    positive = [v for v in values if v > 0]
    return len(positive) > 1 and max(positive) / min(positive) > 50


def _reference_lines(axis: Axes, lines: Sequence[tuple[str, float, str]], data_max: float) -> None:
    """Vertical lines (name, ms, style); one far beyond the data is named at the top right
    instead, so it does not squash the curves."""
    off_scale = []
    for name, at_ms, style in lines:
        if at_ms <= 2 * data_max:
            axis.axvline(at_ms, color="black", linestyle=style, label=f"{name} {at_ms:g} ms")
        else:
            off_scale.append(f"{name} {at_ms:g} ms (off scale) →")
    if off_scale:
        axis.annotate(
            "\n".join(off_scale),
            (0.98, 0.97),
            xycoords="axes fraction",
            ha="right",
            va="top",
            fontsize="small",
            color="dimgrey",
        )


def _cdf_axis(axis: Axes, plot: LatencyPlot, which: Literal["ttft", "e2e"]) -> None:
    pooled: list[float] = []
    for series in plot.series:
        values = series.ttft_ms if which == "ttft" else series.e2e_ms
        pooled.extend(values)
        xs, ys = cdf_points(values, series.arrivals)
        if xs:
            axis.step(xs, ys, where="post", label=f"{series.label} (n={series.arrivals})")
    if which == "ttft" and pooled:
        lines = [("SLO", plot.slo_ms, "--"), ("budget", plot.budget_ms, ":")]
        _reference_lines(axis, [(n, ms, s) for n, ms, s in lines if ms is not None], max(pooled))
    if _log_scale(pooled):
        axis.set_xscale("log")
    axis.set_ylim(0, 1.02)
    axis.set_xlabel("client TTFT (ms)" if which == "ttft" else "end to end (ms)")
    axis.set_ylabel("share of all requests")
    axis.set_title("time to first token" if which == "ttft" else "end to end (ok requests)")
    axis.grid(True, alpha=0.3)
    if axis.get_legend_handles_labels()[0]:
        axis.legend(fontsize="small", loc="lower right")


def plot_latency(plot: LatencyPlot, path: Path) -> None:
    """Client TTFT and e2e CDFs side by side, one line per level or variant."""
    figure = _figure(11, 4.2)
    ttft_axis, e2e_axis = figure.subplots(1, 2)
    _cdf_axis(ttft_axis, plot, "ttft")
    _cdf_axis(e2e_axis, plot, "e2e")
    figure.suptitle(plot.title)
    _save(figure, path)


def _stage_colour(stage: str, seen: dict[str, str]) -> str:
    if stage not in seen:
        spare = _SPARE_COLOURS[len(seen) % len(_SPARE_COLOURS)]
        seen[stage] = STAGE_COLOURS.get(stage, spare)
    return seen[stage]


def plot_waterfall(plot: WaterfallPlot, path: Path) -> None:
    """Stacked horizontal bars, top to bottom in the given order, with each bar's TTFT budget
    as a vertical tick across it and the SLO (when known) across the whole plot."""
    from matplotlib.lines import Line2D  # deferred: see the module docstring
    from matplotlib.patches import Patch

    figure = _figure(11, 1.4 + 0.45 * len(plot.bars))
    axis = figure.subplots()
    colours: dict[str, str] = {}
    for row, bar in enumerate(plot.bars):
        left = 0.0
        for stage, elapsed_ms in bar.stages_ms:
            axis.barh(
                row,
                elapsed_ms,
                left=left,
                height=0.7,
                color=_stage_colour(stage, colours),
                alpha=0.45 if bar.planned else 1.0,
                hatch="//" if bar.planned else None,
                edgecolor="white",
            )
            left += elapsed_ms
        axis.annotate(
            f"{left:,.0f} ms",
            (left, row),
            xytext=(5, 0),
            textcoords="offset points",
            va="center",
            fontsize="small",
            bbox={"facecolor": "white", "edgecolor": "none", "pad": 1, "alpha": 0.8},
        )
        if bar.budget_ms is not None:
            axis.vlines(bar.budget_ms, row - 0.45, row + 0.45, color="black", linewidth=2)
    handles: list[Patch | Line2D] = [Patch(color=c, label=s) for s, c in colours.items()]
    if any(bar.planned for bar in plot.bars):
        handles.append(
            Patch(facecolor="lightgrey", hatch="//", edgecolor="white", label="planned budget")
        )
    if any(bar.budget_ms is not None for bar in plot.bars):
        handles.append(Line2D([], [], color="black", linewidth=2, label="TTFT budget"))
    if plot.slo_ms is not None:
        axis.axvline(plot.slo_ms, color="black", linestyle="--")
        handles.append(
            Line2D([], [], color="black", linestyle="--", label=f"SLO {plot.slo_ms:g} ms")
        )
    axis.set_yticks(range(len(plot.bars)), [bar.label for bar in plot.bars])
    axis.invert_yaxis()
    axis.set_xlabel("milliseconds from arrival to first token")
    axis.set_xlim(0, axis.get_xlim()[1] * 1.1)
    axis.grid(True, axis="x", alpha=0.3)
    axis.set_title(plot.title)
    figure.legend(
        handles=handles,
        loc="outside lower center",
        ncols=min(len(handles), 9),
        fontsize="small",
        frameon=False,
    )
    _save(figure, path)


def plot_sweeps(series: Sequence[SweepSeries], path: Path) -> None:
    """SLO attainment against offered rate, one line per file, each goodput starred."""
    figure = _figure(8, 4.8)
    axis = figure.subplots()
    for one in series:
        rates = [rate for rate, _ in one.points]
        attained = [share * 100 for _, share in one.points]
        slo = f", TTFT SLO {one.slo_ms:g} ms" if one.slo_ms is not None else ""
        (line,) = axis.plot(rates, attained, marker="o", label=f"{one.label}{slo}")
        if one.goodput_rps:
            at = dict(one.points).get(one.goodput_rps)
            if at is not None:
                axis.plot(
                    one.goodput_rps,
                    at * 100,
                    marker="*",
                    markersize=16,
                    color=line.get_color(),
                    linestyle="none",
                )
                axis.annotate(
                    f"goodput {one.goodput_rps:g} rps",
                    (one.goodput_rps, at * 100),
                    textcoords="offset points",
                    xytext=(8, -16),
                    fontsize="small",
                )
    axis.axhline(
        GOODPUT_ATTAINMENT * 100,
        color="grey",
        linestyle=":",
        label=f"goodput threshold ({GOODPUT_ATTAINMENT:.0%})",
    )
    axis.set_ylim(0, 105)
    axis.set_xlim(left=0)
    axis.set_xlabel("offered rate (requests/s)")
    axis.set_ylabel("SLO attainment (% of arrivals)")
    axis.set_title("SLO attainment vs offered rate")
    axis.grid(True, alpha=0.3)
    axis.legend(fontsize="small", loc="lower left")
    _save(figure, path)


def _spread(values: Sequence[float], gap: float) -> list[float]:
    """Label heights for `values`, in the same order, pushed up until `gap` apart."""
    placed = list(values)
    last = -np.inf
    for index in sorted(range(len(values)), key=lambda i: values[i]):
        placed[index] = last = max(values[index], last + gap)
    return placed


def _quality_axis(axis: Axes, points: Sequence[QualityPoint], xlabel: str) -> None:
    by_series: dict[tuple[str, str], list[QualityPoint]] = {}
    for point in points:
        by_series.setdefault((point.group, point.metric), []).append(point)
    groups = list(dict.fromkeys(p.group for p in points))
    metrics = list(dict.fromkeys(p.metric for p in points))
    colours = {group: f"C{n % 10}" for n, group in enumerate(groups)}
    lonely: list[tuple[QualityPoint, str]] = []
    for (group, metric), members in by_series.items():
        members.sort(key=lambda p: p.depth)
        line = ("-", "--", ":", "-.")[metrics.index(metric) % 4] if len(members) > 1 else ""
        axis.plot(
            [p.depth for p in members],
            [p.value for p in members],
            linestyle=line,
            marker="osD^v"[metrics.index(metric) % 5],
            color=colours[group],
            label=f"{group} {metric}",
            markersize=7,
        )
        if len(members) == 1:
            lonely.append((members[0], colours[group]))
    heights = _spread([p.value for p, _ in lonely], gap=0.045)
    for (point, colour), height in zip(lonely, heights, strict=True):
        axis.annotate(
            f"{point.group} {point.metric} {point.value:.3f}",
            (point.depth, point.value),
            xytext=(12, height),
            textcoords=("offset points", "data"),
            va="center",
            fontsize="x-small",
            color=colour,
        )
    depths = sorted({p.depth for p in points})
    axis.set_xticks(depths, [f"{d:g}" for d in depths])
    if len(depths) == 1:
        axis.set_xlim(depths[0] * 0.6, depths[0] * 1.6)
    axis.set_ylim(0, 1.05)
    axis.set_xlabel(xlabel)
    axis.set_ylabel("score (0 to 1)")
    axis.grid(True, alpha=0.3)
    axis.legend(fontsize="small", loc="lower left", ncols=2 if len(by_series) > 4 else 1)


def plot_quality(points: Sequence[QualityPoint], path: Path) -> None:
    """Quality against depth: retrieval metrics vs `depth`, answer metrics vs `top_k`; a
    panel only for the kinds there are points of."""
    panels = [
        (kind, xlabel)
        for kind, xlabel in (
            ("retrieval", "retrieval depth (passages ranked per query)"),
            ("answers", "top_k (passages per answer)"),
        )
        if any(p.panel == kind for p in points)
    ]
    figure = _figure(6 * len(panels), 4.5)
    axes = np.atleast_1d(figure.subplots(1, len(panels)))
    for axis, (kind, xlabel) in zip(axes, panels, strict=True):
        _quality_axis(axis, [p for p in points if p.panel == kind], xlabel)
        axis.set_title(f"{kind} quality vs depth")
    _save(figure, path)
