"""The soak's memory summary (eval/overload_soak.py)."""

from __future__ import annotations

import pytest

from eval.overload_soak import soak_summary


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
