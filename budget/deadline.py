"""A monotonic expiry carried from a request's arrival down to every stage."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

Clock = Callable[[], float]
"""Returns monotonic seconds; `time.monotonic` in production, a fake in tests."""


def monotonic_clock() -> float:
    return time.monotonic()


@dataclass(frozen=True, slots=True)
class Deadline:
    """An absolute expiry on `clock`'s timeline.

    Invariant: `expires_at_s` never moves; slices are new deadlines that end no later than
    their parent, so a stage can never be handed more time than the request has left.
    """

    started_at_s: float
    expires_at_s: float
    clock: Clock = monotonic_clock

    @classmethod
    def after_ms(cls, budget_ms: float, clock: Clock = monotonic_clock) -> Deadline:
        if budget_ms <= 0:
            raise ValueError(f"budget_ms must be positive, got {budget_ms}")
        now_s = clock()
        return cls(started_at_s=now_s, expires_at_s=now_s + budget_ms / 1000.0, clock=clock)

    @property
    def budget_ms(self) -> float:
        return (self.expires_at_s - self.started_at_s) * 1000.0

    def remaining_s(self) -> float:
        """Seconds left, never negative."""
        return max(0.0, self.expires_at_s - self.clock())

    def remaining_ms(self) -> float:
        return self.remaining_s() * 1000.0

    def elapsed_ms(self) -> float:
        return (self.clock() - self.started_at_s) * 1000.0

    @property
    def expired(self) -> bool:
        return self.clock() >= self.expires_at_s

    def slice_ms(self, budget_ms: float) -> Deadline:
        """A child deadline of at most `budget_ms` from now, capped at this deadline."""
        now_s = self.clock()
        expires_at_s = min(self.expires_at_s, now_s + max(0.0, budget_ms) / 1000.0)
        return Deadline(started_at_s=now_s, expires_at_s=expires_at_s, clock=self.clock)

    def slice_fraction(self, fraction: float) -> Deadline:
        """A child deadline holding `fraction` (0..1] of the time left."""
        if not 0.0 < fraction <= 1.0:
            raise ValueError(f"fraction must be in (0, 1], got {fraction}")
        return self.slice_ms(self.remaining_ms() * fraction)

    def timeout_s(self, floor_s: float = 0.0, cap_s: float | None = None) -> float:
        """The time left as a timeout for an external call, bounded below and above."""
        timeout_s = max(floor_s, self.remaining_s())
        return timeout_s if cap_s is None else min(cap_s, timeout_s)
