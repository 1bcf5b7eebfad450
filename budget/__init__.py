"""Time budgets for a request, as pure values.

A request's time-to-first-token budget becomes a `Deadline` when it arrives; each stage gets a
slice of what is left. Everything here is standard library only, takes the clock as an argument
and never sleeps, so it is tested without waiting.

May import: the standard library. Imports nothing of ours; everything else may import it.
"""

from budget.cache_estimate import CacheEstimator, CacheStats
from budget.deadline import Clock, Deadline, monotonic_clock

__all__ = ["CacheEstimator", "CacheStats", "Clock", "Deadline", "monotonic_clock"]
