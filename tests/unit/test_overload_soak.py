"""The soak's memory, collector-pause and refusal-time summaries (docs/benchmarks/overload_soak.py)."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from answer_service.runtime.observability.gc_pauses import GcPauses
from answer_service.runtime.observability.loop_lag import LoopLag
from answer_service.runtime.observability.metrics import ServiceMetrics
from docs.benchmarks.overload_soak import (
    gc_pauses_between,
    loop_lag_between,
    parse_gc_pauses,
    parse_loop_lag,
    parse_refusals,
    refusals_between,
    soak_summary,
    wire_summary,
)
from docs.benchmarks.wire_timing import Exchange


def test_a_store_filling_early_then_flat_shows_in_the_second_half() -> None:
    # 20 minutes, a sample every 5 s: +10 MiB over the first 5 minutes, then flat.
    samples = [(5.0 * n, 700.0 + min(5.0 * n, 300.0) / 30.0, 20) for n in range(241)]
    summary = soak_summary(samples)
    assert summary["duration_s"] == 1200.0
    assert summary["rss_mib_first_minute"] == pytest.approx(701.0, abs=0.2)
    assert summary["rss_mib_last_minute"] == 710.0
    assert summary["rss_mib_per_minute"] > 0.3  # the whole run's slope sees the filling
    assert summary["rss_mib_per_minute_second_half"] == 0.0
    assert summary["fds_first_minute"] == summary["fds_last_minute"] == 20


def test_collector_pauses_between_two_readings_of_the_exposition() -> None:
    registry = CollectorRegistry()
    pauses = GcPauses(registry)
    young, full = pauses.histogram.labels(generation="0"), pauses.histogram.labels(generation="2")
    young.observe(0.0002)
    full.observe(0.2)  # before the first reading: not between them
    before = parse_gc_pauses(generate_latest(registry).decode())
    for seconds in (0.0003, 0.004):
        young.observe(seconds)
    full.observe(0.04)
    after = parse_gc_pauses(generate_latest(registry).decode())
    between = gc_pauses_between(before, after)
    assert between["0"] == {"collections": 2, "total_ms": 4.3, "max_ms_at_most": 5.0}
    assert between["2"] == {"collections": 1, "total_ms": 40.0, "max_ms_at_most": 50.0}
    assert between["1"] == {"collections": 0, "total_ms": 0.0, "max_ms_at_most": None}
    since_start = gc_pauses_between({}, after)
    assert since_start["2"] == {"collections": 2, "total_ms": 240.0, "max_ms_at_most": 250.0}


def test_the_services_refusal_times_between_two_readings() -> None:
    metrics = ServiceMetrics()
    shed = metrics.refusal.labels("503")
    shed.observe(0.8)  # before the first reading
    before = parse_refusals(metrics.exposition().decode())
    for ms in [1.5] * 90 + [4.0] * 9 + [12.0]:  # p50 and p90 under 2 ms, p99 under 5, one 12
        shed.observe(ms / 1000.0)
    metrics.refusal.labels("429").observe(0.0008)
    after = parse_refusals(metrics.exposition().decode())
    between = refusals_between(before, after)
    assert between["503"] == {
        "refusals": 100,
        "mean_ms": 1.83,
        "p50_ms_at_most": 2.0,
        "p90_ms_at_most": 2.0,
        "p99_ms_at_most": 5.0,
        "max_ms_at_most": 15.0,
    }
    assert between["429"]["refusals"] == 1
    assert between["429"]["max_ms_at_most"] == 1.0
    assert refusals_between({}, after)["503"]["max_ms_at_most"] is None  # 800 ms: past 500 ms


def test_the_event_loops_lag_between_two_readings() -> None:
    registry = CollectorRegistry()
    lag = LoopLag(registry)
    assert loop_lag_between({}, parse_loop_lag(generate_latest(registry).decode())) == {
        "samples": 0,
        "mean_ms": None,
        "p50_ms_at_most": None,
        "p90_ms_at_most": None,
        "p99_ms_at_most": None,
        "max_ms_at_most": None,
    }
    lag.histogram.observe(0.2)  # before the first reading
    before = parse_loop_lag(generate_latest(registry).decode())
    for ms in [0.3] * 95 + [6.0] * 4 + [40.0]:
        lag.histogram.observe(ms / 1000.0)
    between = loop_lag_between(before, parse_loop_lag(generate_latest(registry).decode()))
    assert between == {
        "samples": 100,
        "mean_ms": 0.93,
        "p50_ms_at_most": 0.5,
        "p90_ms_at_most": 0.5,
        "p99_ms_at_most": 7.5,
        "max_ms_at_most": 50.0,
    }
    assert loop_lag_between({}, {}) is None  # a service that exports none


def test_wire_times_are_summarised_per_response_status() -> None:
    seen = [Exchange(1, 10.0, 10.0 + ms / 1000.0, 503) for ms in (2.0, 3.0, 4.0, 9.0)]
    seen += [Exchange(2, 11.0, 12.5, 200), Exchange(3, 12.0, 12.1, None)]
    summary = wire_summary(seen)
    assert list(summary) == ["200", "503", "None"]
    assert summary["503"]["count"] == 4
    assert summary["503"]["p50"] == pytest.approx(3.5)
    assert summary["503"]["max"] == pytest.approx(9.0)
    assert summary["200"] == {
        "count": 1,
        "p50": 1500.0,
        "p90": 1500.0,
        "p95": 1500.0,
        "p99": 1500.0,
        "max": 1500.0,
    }
    assert wire_summary([]) == {}
