"""A phase's progress line: done of total, rate, time left; in place on a terminal, plain lines
at a slower pace elsewhere; a resumed phase's earlier work is left out of its rate."""

from __future__ import annotations

import io
import logging

import pytest

from retrieval.progress import Progress, duration


class FakeClock:
    def __init__(self) -> None:
        self.now_s = 100.0

    def __call__(self) -> float:
        return self.now_s


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_plain_lines_carry_the_rate_and_the_time_left() -> None:
    clock, out = FakeClock(), io.StringIO()
    with Progress("sentence vectors", 1000, "sentences", stream=out, clock=clock) as shown:
        for _ in range(4):
            clock.now_s += 5.0
            shown.advance(100, passages=1280)
    lines = out.getvalue().splitlines()
    assert lines[0] == "sentence vectors: 0/1,000 sentences (0%), estimating"
    # A plain line every 10 s, not every advance: at 10 s and 20 s.
    assert lines[1] == (
        "sentence vectors: 200/1,000 sentences (20%), 20.0 sentences/s, about 40 s left"
        " [passages=1,280]"
    )
    assert lines[2].startswith("sentence vectors: 400/1,000 sentences (40%)")
    assert "about 30 s left" in lines[2]
    assert lines[3] == "sentence vectors: 400 sentences in 20 s (20.0 sentences/s) [passages=1,280]"
    assert len(lines) == 4


def test_a_terminal_line_is_rewritten_in_place_and_ends_with_a_newline() -> None:
    clock, out = FakeClock(), Terminal()
    with Progress("documents", 10, "documents", stream=out, clock=clock) as shown:
        for _ in range(10):
            clock.now_s += 0.5
            shown.advance(1)
    text = out.getvalue()
    assert text.count("\r") == 12  # the first line, ten updates, the last line
    assert "\n" not in text[:-1]
    # Padded with blanks over what is left of the longer line before it.
    last = text.rsplit("\r", 1)[1]
    assert last.rstrip(" \n") == "documents: 10 documents in 5 s (2.0 documents/s)"
    assert last.endswith(" \n")


def test_a_resumed_phase_rates_only_this_runs_work() -> None:
    clock, out = FakeClock(), io.StringIO()
    with Progress("documents", 100, "documents", initial=50, stream=out, clock=clock) as shown:
        clock.now_s += 10.0
        shown.advance(10)
    lines = out.getvalue().splitlines()
    assert lines[1] == "documents: 60/100 documents (60%), 1.0 documents/s, about 40 s left"


def test_a_phase_without_a_count_shows_its_start_and_end_and_logs_its_time(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock, out = FakeClock(), io.StringIO()
    with (
        caplog.at_level(logging.INFO, logger="retrieval.progress"),
        Progress("faiss index (hnsw)", stream=out, clock=clock),
    ):
        clock.now_s += 75.0
    assert out.getvalue().splitlines() == [
        "faiss index (hnsw): ... 0 s",
        "faiss index (hnsw): in 1 min 15 s",
    ]
    assert "phase=faiss index (hnsw) count=0 seconds=75.0" in caplog.text


def test_disabled_shows_nothing_and_a_failure_says_stopped() -> None:
    clock, out = FakeClock(), io.StringIO()
    with Progress("BM25", stream=out, clock=clock, enabled=False):
        clock.now_s += 1.0
    assert out.getvalue() == ""
    with pytest.raises(RuntimeError), Progress("BM25", stream=out, clock=clock):
        raise RuntimeError("boom")
    assert out.getvalue().splitlines()[-1] == "BM25: stopped after 0 s"


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [(0.4, "0 s"), (59.6, "1 min 00 s"), (185, "3 min 05 s"), (3720, "1 h 02 min")],
)
def test_durations_read_at_a_glance(seconds: float, shown: str) -> None:
    assert duration(seconds) == shown
