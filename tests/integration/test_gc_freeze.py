"""The service freezes its start-up heap out of the collector's walks before it says it is
ready, times every collection on `/metrics`, and gives the heap back when it shuts down; and
it samples how late its event loop runs, which collections are one cause of. (The real tiny
SGLang answers.)"""

from __future__ import annotations

import gc
import time

import httpx
import pytest

from tests.integration.conftest import ServiceFactory
from tests.support import post_answer

pytestmark = [pytest.mark.integration, pytest.mark.sglang]


def _pauses(url: str, generation: str) -> float:
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        if line.startswith(f'answer_gc_pause_seconds_count{{generation="{generation}"}}'):
            return float(line.split()[-1])
    raise AssertionError(f"no pause count for generation {generation} on /metrics")


def test_ready_service_has_frozen_its_heap(tiny_service: ServiceFactory) -> None:
    with tiny_service(planner="off") as url:
        # The embedder, the index and everything torch and transformers made at import.
        assert gc.get_freeze_count() > 100_000
        assert len(gc.get_objects(generation=2)) < gc.get_freeze_count() / 10
        # The freeze's own full collection was timed, and so is every one after it.
        full = _pauses(url, "2")
        assert full >= 1
        gc.collect(2)
        assert _pauses(url, "2") >= full + 1
        response = post_answer(url, {"query": "Who won Super Bowl 50?", "ttft_budget_ms": 5000})
        assert response.status_code == 200
    assert gc.get_freeze_count() == 0  # given back on shutdown


def test_young_collections_are_timed(tiny_service: ServiceFactory) -> None:
    with tiny_service(planner="off") as url:
        young = _pauses(url, "0")
        gc.collect(0)
        assert _pauses(url, "0") >= young + 1


def _lag_samples(url: str) -> float:
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        if line.startswith("answer_event_loop_lag_seconds_count"):
            return float(line.split()[-1])
    raise AssertionError("no event-loop lag on /metrics")


def test_the_event_loops_lag_is_sampled_while_serving(tiny_service: ServiceFactory) -> None:
    with tiny_service(planner="off") as url:
        before = _lag_samples(url)
        time.sleep(0.5)
        assert _lag_samples(url) >= before + 10  # every 20 ms
