"""How many prefills a worker should run at once, from what it was measured to do.

A GPU batches prompts: eight prefills at once take little longer than one, so one slot per
worker would leave it idle while requests queue. A CPU does not: two prefills at once take
twice as long as one, and each first token comes later for it. At warm-up the service sends
1, 2, 4, ... uncached prompts of one size at once and times until the last first token; this
module turns those timings into the number of generation slots: the most prompts at once for
which every doubling still bought at least `min_gain` times the throughput of the step before.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SlotChoice:
    slots: int
    # Prompts per second at each concurrency measured, for the log and /readyz.
    throughput: Mapping[int, float]
    reason: str


def slots_from_timings(all_first_ms: Mapping[int, float], min_gain: float = 1.25) -> SlotChoice:
    """`all_first_ms`: for each number of prompts sent at once, the milliseconds until the last
    of them had its first token. Concurrencies are read in increasing order; the first step that
    does not raise throughput by `min_gain` (or is missing) ends the search."""
    if min_gain <= 1.0:
        raise ValueError("min_gain must be above 1: otherwise every step pays")
    measured = sorted((n, ms) for n, ms in all_first_ms.items() if n >= 1 and ms > 0)
    throughput = {n: n / (ms / 1000.0) for n, ms in measured}
    if not measured or measured[0][0] != 1:
        return SlotChoice(1, throughput, "no timing of a single prompt: one slot")
    slots, reason = 1, "only one prompt measured"
    for (before, _), (now, _) in itertools.pairwise(measured):
        gain = throughput[now] / throughput[before]
        if gain < min_gain:
            reason = (
                f"{now} prompts at once gave {gain:.2f}x the throughput of {before} "
                f"(under {min_gain:.2f}x)"
            )
            break
        slots = now
        reason = f"{now} prompts at once gave {gain:.2f}x the throughput of {before}"
    return SlotChoice(slots, throughput, reason)
