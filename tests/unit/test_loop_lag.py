"""The event loop's lateness (answer_service/runtime/observability/loop_lag.py): a callback that keeps the loop
shows up as lag, a loop left free does not."""

from __future__ import annotations

import asyncio
import logging
import threading
import time

import pytest
from prometheus_client import CollectorRegistry

from answer_service.runtime.observability.loop_lag import LoopLag


def _counts(registry: CollectorRegistry) -> tuple[float, float]:
    """(samples, samples later than 30 ms)."""
    total = registry.get_sample_value("answer_event_loop_lag_seconds_count") or 0.0
    within = registry.get_sample_value("answer_event_loop_lag_seconds_bucket", {"le": "0.025"})
    return total, total - (within or 0.0)


def _compute(seconds: float) -> None:
    """What a callback computing on the loop does to everyone else."""
    until = time.perf_counter() + seconds
    while time.perf_counter() < until:
        pass


async def _sample_while(lag: LoopLag, work: float, blocking: bool) -> None:
    sampler = asyncio.create_task(lag.run())
    await asyncio.sleep(0.1)
    if blocking:
        _compute(work)
    else:
        await asyncio.sleep(work)
    await asyncio.sleep(0.1)
    sampler.cancel()
    await asyncio.gather(sampler, return_exceptions=True)


def test_a_callback_that_keeps_the_loop_is_seen_as_lag() -> None:
    registry = CollectorRegistry()
    lag = LoopLag(registry, every_s=0.01)
    asyncio.run(_sample_while(lag, 0.2, blocking=True))
    samples, late = _counts(registry)
    assert samples >= 5
    assert late == 1  # the one sleeper due during the 200 ms stall
    stalled = registry.get_sample_value("answer_event_loop_lag_seconds_sum") or 0.0
    assert 0.15 < stalled < 0.5


def test_a_free_loop_has_no_lag_to_speak_of() -> None:
    registry = CollectorRegistry()
    lag = LoopLag(registry, every_s=0.01)
    asyncio.run(_sample_while(lag, 0.2, blocking=False))
    samples, late = _counts(registry)
    assert samples >= 20
    assert late == 0


def test_the_interval_must_be_positive() -> None:
    with pytest.raises(ValueError, match="every_s"):
        LoopLag(CollectorRegistry(), every_s=0)
    with pytest.raises(ValueError, match="stall_s"):
        LoopLag(CollectorRegistry(), stall_s=-1)


def test_a_stall_is_logged_once_with_the_stack_that_kept_the_loop(
    caplog: pytest.LogCaptureFixture,
) -> None:
    registry = CollectorRegistry()
    lag = LoopLag(registry, every_s=0.01, stall_s=0.04)
    with caplog.at_level(logging.WARNING, logger="answer_service.runtime.observability.loop_lag"):
        asyncio.run(_sample_while(lag, 0.3, blocking=True))
    stalls = [r for r in caplog.records if "event loop stalled" in r.getMessage()]
    assert len(stalls) == 1  # one stall, however long it went on
    assert "in _compute" in stalls[0].getMessage()
    assert registry.get_sample_value("answer_event_loop_stalls_total") == 1


def test_no_stall_is_reported_on_a_free_loop_or_when_off(
    caplog: pytest.LogCaptureFixture,
) -> None:
    free, off = CollectorRegistry(), CollectorRegistry()
    with caplog.at_level(logging.WARNING, logger="answer_service.runtime.observability.loop_lag"):
        asyncio.run(_sample_while(LoopLag(free, every_s=0.01, stall_s=0.04), 0.3, blocking=False))
        asyncio.run(_sample_while(LoopLag(off, every_s=0.01), 0.3, blocking=True))
    assert not [r for r in caplog.records if "event loop stalled" in r.getMessage()]
    assert free.get_sample_value("answer_event_loop_stalls_total") == 0
    assert off.get_sample_value("answer_event_loop_stalls_total") == 0
    time.sleep(0.05)  # a quarter of stall_s and more: the watchdog ends with its sampler
    assert not [t for t in threading.enumerate() if t.name == "loop-stall-watch"]
