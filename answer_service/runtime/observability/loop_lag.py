"""How late the event loop runs what is due: `answer_event_loop_lag_seconds` on `/metrics`.

Every request, refusals included, waits for the one thread that runs the event loop: to
read its body, to be planned, to have its response written. Whatever keeps that thread
(a callback that computes too long, the GIL held by another thread, a collection, the
operating system giving the core to SGLang) delays every one of them by the same amount.
A sleeper wakes every `every_s` and records how much later than due it ran: the
distribution of that lateness is what any request arriving at a random moment waits on top
of its own work, which the request timings alone cannot separate from that work.

With `stall_s` set (`Experiment.loop_stall_ms`, an eval's; off in the service), a watchdog thread also looks at
the sampler: when it is `stall_s` past due, the watchdog logs the stack the loop's thread is
in at that moment (once per stall) and counts it in `answer_event_loop_stalls`, so that what
keeps the loop is named, not guessed. It sees a thread computing in Python or waiting in a
call that holds the loop; it cannot run while a garbage collection or another C call keeps
the GIL (those show up as a stall it reports late, in the frame that was running), nor while
the process gets no core at all.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import time
import traceback

from prometheus_client import CollectorRegistry, Counter, Histogram

logger = logging.getLogger(__name__)

# From the loop's own granularity (a millisecond) to a stall that breaks a budget.
_LAG_SECONDS = (0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.025, 0.05, 0.1, 0.25)


class LoopLag:
    def __init__(
        self, registry: CollectorRegistry, every_s: float = 0.02, stall_s: float = 0.0
    ) -> None:
        if every_s <= 0 or stall_s < 0:
            raise ValueError("every_s must be positive and stall_s not negative")
        self.every_s = every_s
        self.stall_s = stall_s
        self.stalls = Counter(
            "answer_event_loop_stalls",
            "Times the event loop was kept past Experiment.loop_stall_ms (counted only where that "
            "is set; each logged with the stack the loop was in).",
            registry=registry,
        )
        # When the sampler is next due (time.monotonic); None while it is not running.
        self._due_s: float | None = None
        self.histogram = Histogram(
            "answer_event_loop_lag_seconds",
            f"How much later than due the event loop woke a sleeper (sampled every "
            f"{every_s * 1000:g} ms): what a request arriving now waits for the loop.",
            buckets=_LAG_SECONDS,
            registry=registry,
        )

    async def run(self) -> None:
        """Sample (and watch, with `stall_s`) until cancelled."""
        stop = threading.Event()
        if self.stall_s > 0:
            threading.Thread(
                target=self._watch,
                args=(threading.get_ident(), stop),
                name="loop-stall-watch",
                daemon=True,
            ).start()
        try:
            while True:
                due_s = self._due_s = time.monotonic() + self.every_s
                await asyncio.sleep(self.every_s)
                self.histogram.observe(max(0.0, time.monotonic() - due_s))
        finally:
            self._due_s = None
            stop.set()

    def _watch(self, loop_thread: int, stop: threading.Event) -> None:
        reported: float | None = None
        while not stop.wait(self.stall_s / 4):
            due_s = self._due_s
            if due_s is None or due_s == reported:
                continue
            late_s = time.monotonic() - due_s
            if late_s < self.stall_s:
                continue
            reported = due_s
            frame = sys._current_frames().get(loop_thread)
            stack = "".join(traceback.format_stack(frame)) if frame is not None else "(gone)\n"
            self.stalls.inc()
            logger.warning(
                "event loop stalled late_ms=%.0f (still running), its thread's stack:\n%s",
                late_s * 1000.0,
                stack.rstrip(),
            )
