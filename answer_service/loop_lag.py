"""How late the event loop runs what is due: `answer_event_loop_lag_seconds` on `/metrics`.

Every request, refusals included, waits for the one thread that runs the event loop: to
read its body, to be planned, to have its response written. Whatever keeps that thread
(a callback that computes too long, the GIL held by another thread, a collection, the
operating system giving the core to SGLang) delays every one of them by the same amount.
A sleeper wakes every `every_s` and records how much later than due it ran: the
distribution of that lateness is what any request arriving at a random moment waits on top
of its own work, which the request timings alone cannot separate from that work.
"""

from __future__ import annotations

import asyncio

from prometheus_client import CollectorRegistry, Histogram

# From the loop's own granularity (a millisecond) to a stall that breaks a budget.
_LAG_SECONDS = (0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.025, 0.05, 0.1, 0.25)


class LoopLag:
    def __init__(self, registry: CollectorRegistry, every_s: float = 0.02) -> None:
        if every_s <= 0:
            raise ValueError("every_s must be positive")
        self.every_s = every_s
        self.histogram = Histogram(
            "answer_event_loop_lag_seconds",
            f"How much later than due the event loop woke a sleeper (sampled every "
            f"{every_s * 1000:g} ms): what a request arriving now waits for the loop.",
            buckets=_LAG_SECONDS,
            registry=registry,
        )

    async def run(self) -> None:
        """Sample until cancelled."""
        loop = asyncio.get_running_loop()
        while True:
            due_s = loop.time() + self.every_s
            await asyncio.sleep(self.every_s)
            self.histogram.observe(max(0.0, loop.time() - due_s))
