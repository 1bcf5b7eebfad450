"""How fast requests are arriving: a count over a sliding window, for the planner's view of
how many requests a long prefill will hold up. Pure: the clock is passed in."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from budget.deadline import Clock, monotonic_clock


@dataclass(slots=True)
class ArrivalRate:
    window_s: float = 30.0
    clock: Clock = monotonic_clock
    _times: deque[float] = field(default_factory=deque)
    _first_s: float | None = None

    def __post_init__(self) -> None:
        if self.window_s <= 0:
            raise ValueError("window_s must be positive")

    def mark(self) -> None:
        now_s = self.clock()
        if self._first_s is None:
            self._first_s = now_s
        self._times.append(now_s)
        self._forget(now_s)

    def per_second(self) -> float:
        """Arrivals per second over the window (over the time since the first arrival while
        that is shorter, but at least a second)."""
        if self._first_s is None:
            return 0.0
        now_s = self.clock()
        self._forget(now_s)
        span_s = max(1.0, min(self.window_s, now_s - self._first_s))
        return len(self._times) / span_s

    def _forget(self, now_s: float) -> None:
        while self._times and self._times[0] <= now_s - self.window_s:
            self._times.popleft()
