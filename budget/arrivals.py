"""How fast requests are arriving: counts over sliding windows, for the planner's view of
how many requests a long prefill will hold up. Pure: the clock is passed in.

The rate is the higher of a long window's (steady, 30 s) and a short one's (5 s): a burst
after a quiet spell shows within seconds, not after half a minute of plans sized for the
quiet. Measured: at the start of a 2-requests/s level after a lighter one, the 30-s rate alone
let the first ~20 requests take 3-5 passages, and the queue they built made 48 of the
requests admitted behind them miss a 3-s budget (docs/benchmarks/planner-burst-onset.json).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from budget.deadline import Clock, monotonic_clock


@dataclass(slots=True)
class ArrivalRate:
    window_s: float = 30.0
    burst_window_s: float = 5.0
    clock: Clock = monotonic_clock
    _times: deque[float] = field(default_factory=deque)
    _first_s: float | None = None

    def __post_init__(self) -> None:
        if self.window_s <= 0 or not 0 < self.burst_window_s <= self.window_s:
            raise ValueError("window_s must be positive and burst_window_s in (0, window_s]")

    def mark(self) -> None:
        now_s = self.clock()
        if self._first_s is None:
            self._first_s = now_s
        self._times.append(now_s)
        self._forget(now_s)

    def per_second(self) -> float:
        """Arrivals per second over the window or the burst window, whichever is higher (each
        over the time since the first arrival while that is shorter, but at least a second)."""
        if self._first_s is None:
            return 0.0
        now_s = self.clock()
        self._forget(now_s)
        since_s = now_s - self._first_s
        steady = len(self._times) / max(1.0, min(self.window_s, since_s))
        recent = 0
        for seen_s in reversed(self._times):
            if seen_s <= now_s - self.burst_window_s:
                break
            recent += 1
        return max(steady, recent / max(1.0, min(self.burst_window_s, since_s)))

    def _forget(self, now_s: float) -> None:
        while self._times and self._times[0] <= now_s - self.window_s:
            self._times.popleft()
