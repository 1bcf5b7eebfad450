"""The garbage collector's pauses: timed for `/metrics`, and the start-up heap kept out of them.

Every thread stops while CPython collects, the event loop's included. A collection of the
youngest generations walks only what was allocated since the last one (about a
millisecond here), but a full one walks every tracked object, and after start-up the service
holds about 550,000 (torch, transformers, sentence-transformers, the index's metadata): one
full collection took ~235 ms on these cores, a stall of every answer streaming and every
refusal waiting for the loop. Those objects live as long as the process, so once the service
is warm, and before it says it is ready, they are moved to the collector's permanent
generation (`gc.freeze()`), which no collection walks; objects made later are collected as
before. Frozen objects that a reference count frees are still freed: only reference cycles
among them would now be kept, and at that moment nothing is in flight. Only the start-up heap
is frozen: freezing again while serving would also freeze the requests under way, whose
frames and tasks do form cycles; what loads later (a reranker, a swapped-in index) holds tens
of thousands of objects, not hundreds of thousands.

The service always freezes once warm (`ANSWER_GC_FREEZE` went: docs/changelog.md). The pause
histogram is measured either way.
"""

from __future__ import annotations

import gc
import logging
import time
from typing import Any

from prometheus_client import CollectorRegistry, Histogram

logger = logging.getLogger(__name__)

# From a young collection's tenth of a millisecond to a full one's quarter second and more.
_PAUSE_SECONDS = (0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)


class GcPauses:
    """Times each collection into `answer_gc_pause_seconds{generation}` while installed.

    `gc.callbacks` is the process's: each app installs its own timer on start and removes it
    on shutdown (tests build several apps in one process).
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self.histogram = Histogram(
            "answer_gc_pause_seconds",
            "Time the process stood still for each garbage collection, by the oldest "
            "generation it collected (2: a full collection).",
            ("generation",),
            buckets=_PAUSE_SECONDS,
            registry=registry,
        )
        self._children = [self.histogram.labels(generation=str(g)) for g in range(3)]
        self._started: float | None = None

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        elif self._started is not None:
            self._children[info["generation"]].observe(time.perf_counter() - self._started)
            self._started = None

    def install(self) -> None:
        if self._callback not in gc.callbacks:
            gc.callbacks.append(self._callback)

    def remove(self) -> None:
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)


def freeze_heap(*, collect: bool) -> int:
    """Move every object the collector tracks now to its permanent generation; how many are
    frozen. `collect` first frees what is already garbage (a full collection)."""
    started = time.perf_counter()
    if collect:
        gc.collect()
    gc.freeze()
    frozen = gc.get_freeze_count()
    logger.info(
        "gc heap frozen objects=%d collected=%s ms=%.0f",
        frozen,
        collect,
        (time.perf_counter() - started) * 1000.0,
    )
    return frozen


def thaw_heap() -> None:
    """Give the frozen objects back to the collector (an app shutting down in a process that
    goes on, as in the tests)."""
    gc.unfreeze()
