"""Stage latency models: a high quantile of a stage's latency as a function of its work.

Each stage's latency is modelled as `intercept + slope * work` plus a margin that lifts the
line to the chosen quantile (p90 by default). The prior comes from the measured cost table; the
model then refits itself from the stage timings it is shown, over a sliding window so that it
follows drift (another tenant on the cores, a cache that warms up):

- the slope is a Theil-Sen estimate (the median of pairwise slopes), so one outlier cannot tilt
  it, and never negative: more work never predicts less time;
- the intercept is the median residual, so outliers cannot shift it either;
- the margin is the chosen quantile of the residuals, which is what makes the prediction a high
  quantile rather than a mean. A second quantile, `admit_quantile`, is kept beside it for
  admission (`admit_ms`), which may take a lower one than the plan's choice does.

Until `min_observations` timings have been seen the fit is blended with the prior in proportion
to how many have. Refitting happens on `observe`, so `predict_ms` is a multiply and an add: the
planner calls it for every candidate plan.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field

_NORMAL = statistics.NormalDist()


@dataclass(frozen=True, slots=True)
class LinearPrior:
    """`intercept_ms + slope_ms * work`, plus `margin_ms` to reach the high quantile."""

    intercept_ms: float
    slope_ms: float = 0.0
    margin_ms: float = 0.0

    def __post_init__(self) -> None:
        if self.slope_ms < 0 or self.intercept_ms < 0 or self.margin_ms < 0:
            raise ValueError(f"a latency prior cannot be negative: {self}")

    def predict_ms(self, work: float) -> float:
        return self.intercept_ms + self.slope_ms * work + self.margin_ms

    def median_ms(self, work: float) -> float:
        """The line without the margin: the typical latency rather than the high quantile."""
        return self.intercept_ms + self.slope_ms * work


@dataclass(frozen=True, slots=True)
class ModelState:
    """What a model currently predicts with, for spans and the dashboard."""

    intercept_ms: float
    slope_ms: float
    margin_ms: float
    observations: int


def _quantile(ordered: list[float], q: float) -> float:
    """The `q` quantile of the sorted `ordered` by linear interpolation between order
    statistics."""
    position = q * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def _theil_sen_slope(points: list[tuple[float, float]]) -> float | None:
    """The median slope over pairs at a spread of distances (at most ~3n pairs, not n²/2)."""
    n = len(points)
    slopes = []
    for gap in {1, max(1, n // 4), max(1, n // 2)}:
        for i in range(n - gap):
            (x0, y0), (x1, y1) = points[i], points[i + gap]
            if x1 != x0:
                slopes.append((y1 - y0) / (x1 - x0))
    return statistics.median(slopes) if slopes else None


@dataclass(slots=True)
class LatencyModel:
    """One stage's high-quantile latency model, refitted from what it observes."""

    prior: LinearPrior
    quantile: float = 0.9
    window: int = 128
    min_observations: int = 8
    # Admission's quantile (`admit_ms`); None: the same as `quantile`.
    admit_quantile: float | None = None
    _points: deque[tuple[float, float]] = field(init=False)
    _fit: LinearPrior = field(init=False)
    _admit_q: float = field(init=False)
    _admit_margin: float = field(init=False)
    _prior_admit_margin: float = field(init=False)

    def __post_init__(self) -> None:
        self._admit_q = self.quantile if self.admit_quantile is None else self.admit_quantile
        for q in (self.quantile, self._admit_q):
            if not 0.5 <= q < 1.0:
                raise ValueError(f"quantiles must be in [0.5, 1), got {q}")
        if self.window < 2 or self.min_observations < 1:
            raise ValueError("window must be >= 2 and min_observations >= 1")
        self._points = deque(maxlen=self.window)
        self._fit = self.prior
        # The prior's margin is for `quantile`; for another quantile it is scaled as a normal
        # spread would be (z(admit) / z(quantile)), until observations replace it.
        z = _NORMAL.inv_cdf(self.quantile)
        ratio = _NORMAL.inv_cdf(self._admit_q) / z if z > 0 else 1.0
        self._prior_admit_margin = self.prior.margin_ms * ratio
        self._admit_margin = self._prior_admit_margin

    @property
    def observations(self) -> int:
        return len(self._points)

    def predict_ms(self, work: float) -> float:
        return self._fit.predict_ms(max(work, 0.0))

    def median_ms(self, work: float) -> float:
        return self._fit.median_ms(max(work, 0.0))

    def admit_ms(self, work: float) -> float:
        """The line lifted to `admit_quantile` rather than `quantile`."""
        return self._fit.median_ms(max(work, 0.0)) + self._admit_margin

    def state(self) -> ModelState:
        fit = self._fit
        return ModelState(fit.intercept_ms, fit.slope_ms, fit.margin_ms, self.observations)

    def observe(self, work: float, elapsed_ms: float) -> None:
        if elapsed_ms < 0 or elapsed_ms != elapsed_ms:  # negative or NaN: a clock bug
            return
        self._points.append((max(work, 0.0), elapsed_ms))
        self._refit()

    def settle(self) -> bool:
        """Take what has been observed as the prior, unblended: the service's warm-up measures
        each stage where it runs, and that, not a constant measured elsewhere, is what the
        model starts from. Later observations refit as before. False (and nothing changed)
        when nothing has been observed."""
        if not self._points:
            return False
        fit, admit_margin = self._line(list(self._points))
        self.prior = fit
        self._prior_admit_margin = admit_margin
        self._fit, self._admit_margin = fit, admit_margin
        return True

    def _line(self, points: list[tuple[float, float]]) -> tuple[LinearPrior, float]:
        """The fit of `points` alone, and its margin at the admission quantile."""
        slope = _theil_sen_slope(points)
        slope = self.prior.slope_ms if slope is None else max(slope, 0.0)
        residuals = [y - slope * x for x, y in points]
        intercept = max(statistics.median(residuals), 0.0)
        spread = sorted(r - intercept for r in residuals)

        def margin(q: float) -> float:
            return max(_quantile(spread, q), 0.0) if len(points) > 1 else 0.0

        return LinearPrior(intercept, slope, margin(self.quantile)), margin(self._admit_q)

    def _refit(self) -> None:
        points = list(self._points)
        fit, admit_margin = self._line(points)
        weight = min(1.0, len(points) / self.min_observations)
        self._fit = LinearPrior(
            intercept_ms=weight * fit.intercept_ms + (1 - weight) * self.prior.intercept_ms,
            slope_ms=weight * fit.slope_ms + (1 - weight) * self.prior.slope_ms,
            margin_ms=weight * fit.margin_ms + (1 - weight) * self.prior.margin_ms,
        )
        self._admit_margin = weight * admit_margin + (1 - weight) * self._prior_admit_margin
