"""The collector's pause timer and the heap freeze, on this process's own collector."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry

from answer_service.runtime.observability.gc_pauses import GcPauses, freeze_heap, thaw_heap


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
def pauses(registry: CollectorRegistry) -> Iterator[GcPauses]:
    timer = GcPauses(registry)
    timer.install()
    yield timer
    timer.remove()


def _count(registry: CollectorRegistry, generation: str) -> float:
    value = registry.get_sample_value("answer_gc_pause_seconds_count", {"generation": generation})
    return value or 0.0


def test_each_collection_is_timed_under_its_generation(
    pauses: GcPauses, registry: CollectorRegistry
) -> None:
    before = {g: _count(registry, g) for g in "012"}
    gc.collect(2)
    gc.collect(2)
    gc.collect(0)
    assert _count(registry, "2") - before["2"] >= 2
    assert _count(registry, "0") - before["0"] >= 1
    total = registry.get_sample_value("answer_gc_pause_seconds_sum", {"generation": "2"})
    assert total is not None
    assert total > 0.0


def test_removed_timer_counts_nothing_more(pauses: GcPauses, registry: CollectorRegistry) -> None:
    pauses.remove()
    pauses.remove()  # twice is harmless
    before = _count(registry, "2")
    gc.collect(2)
    assert _count(registry, "2") == before
    assert pauses._callback not in gc.callbacks


def test_installing_twice_times_once(pauses: GcPauses) -> None:
    pauses.install()
    assert gc.callbacks.count(pauses._callback) == 1


def test_frozen_objects_leave_the_oldest_generation_until_thawed() -> None:
    kept = [[i] for i in range(50_000)]  # tracked containers that outlive the collection
    gc.collect()
    assert len(gc.get_objects(generation=2)) > 50_000
    try:
        frozen = freeze_heap(collect=True)
        # What a full collection walks now: none of what was alive at the freeze.
        assert frozen > 50_000
        # A frozen object still dies by its count (below), so what another thread drops after
        # the freeze leaves the permanent generation: the count can only fall from `frozen`.
        assert 50_000 < gc.get_freeze_count() <= frozen
        assert len(gc.get_objects(generation=2)) < 1_000
        assert not any(obj is kept for obj in gc.get_objects(generation=2))
    finally:
        thaw_heap()
    assert gc.get_freeze_count() == 0
    assert len(gc.get_objects(generation=2)) > 50_000
    del kept


def test_frozen_objects_are_still_freed_by_their_count() -> None:
    class Probe:
        freed = False

        def __del__(self) -> None:
            Probe.freed = True

    probe = Probe()
    try:
        freeze_heap(collect=False)
        del probe  # no cycle: the reference count frees it, frozen or not
        assert Probe.freed
    finally:
        thaw_heap()
