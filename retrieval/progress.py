"""A long phase's progress on stderr: how much is done of how much, the rate, the time left.

On a terminal one line is rewritten in place, at most every `_TTY_EVERY_S`; anywhere else (a log
file, CI, `make demo` piped) a plain line every `_PLAIN_EVERY_S`, so a log shows the work moving
without a flood. Each phase ends with one line saying how long it took, and that is logged
too (`phase done`), which is what the build's timings are read from. A phase without a count
(a faiss index trained, BM25 counted) shows its start and its end.

The clock and the stream are passed in (defaults: `time.monotonic`, `sys.stderr` when the
phase starts), so tests drive it with a fake clock and a string buffer.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from types import TracebackType
from typing import TextIO

logger = logging.getLogger(__name__)

_TTY_EVERY_S = 0.2
_PLAIN_EVERY_S = 10.0


def duration(seconds: float) -> str:
    """`42 s`, `3 min 05 s`, `1 h 02 min`: what a person reads at a glance."""
    whole = round(seconds)
    if whole < 60:
        return f"{whole} s"
    minutes, secs = divmod(whole, 60)
    if minutes < 60:
        return f"{minutes} min {secs:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


class Progress:
    """`with Progress("sentence vectors", total=n, unit="sentences") as shown:` then
    `shown.advance(k)` as work is done; `notes` add counts to the line (`passages=1280`).

    `initial`: already done before this run (a resumed build): counted as done, left out of
    the rate. `enabled=False` shows nothing but still logs the phase's time.
    """

    def __init__(
        self,
        phase: str,
        total: int | None = None,
        unit: str = "",
        *,
        initial: int = 0,
        enabled: bool = True,
        stream: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.phase = phase
        self.total = total
        self.unit = unit
        self.done = initial
        self.enabled = enabled
        self._initial = initial
        self._stream = stream
        self._clock = clock
        self._notes: dict[str, object] = {}
        self._started_s = 0.0
        self._shown_s = 0.0
        self._tty = False
        self._width = 0

    def __enter__(self) -> Progress:
        self._started_s = self._shown_s = self._clock()
        if self._stream is None:
            self._stream = sys.stderr
        self._tty = self._stream.isatty()
        self._show(self._line(), final=False)
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.finish(stopped=kind is not None)

    def advance(self, count: int = 1, **notes: object) -> None:
        self.done += count
        self._notes.update(notes)
        now_s = self._clock()
        if now_s - self._shown_s >= (_TTY_EVERY_S if self._tty else _PLAIN_EVERY_S):
            self._shown_s = now_s
            self._show(self._line(), final=False)

    def finish(self, *, stopped: bool = False) -> None:
        elapsed_s = self._clock() - self._started_s
        count = f"{self.done:,} {self.unit}".rstrip() if self.unit or self.total else ""
        rate = self._rate(elapsed_s)
        line = f"{self.phase}: {count + ' ' if count else ''}{'stopped after' if stopped else 'in'}"
        line += f" {duration(elapsed_s)}"
        if rate:
            line += f" ({rate})"
        self._show(line + self._noted(), final=True)
        logger.info(
            "phase done phase=%s count=%d seconds=%.1f stopped=%s",
            self.phase,
            self.done,
            elapsed_s,
            stopped,
        )

    def _line(self) -> str:
        elapsed_s = self._clock() - self._started_s
        if self.total is None:
            done = f" {self.done:,} {self.unit}".rstrip() if self.done else ""
            return f"{self.phase}:{done} ... {duration(elapsed_s)}{self._noted()}"
        share = self.done / self.total if self.total else 1.0
        line = f"{self.phase}: {self.done:,}/{self.total:,} {self.unit}".rstrip()
        line += f" ({share:.0%})"
        if rate := self._rate(elapsed_s):
            line += f", {rate}"
        left_s = self._left_s(elapsed_s)
        line += f", about {duration(left_s)} left" if left_s is not None else ", estimating"
        return line + self._noted()

    def _rate(self, elapsed_s: float) -> str:
        counted = self.done - self._initial
        if counted <= 0 or elapsed_s <= 0 or not (self.unit or self.total):
            return ""
        per_s = counted / elapsed_s
        unit = self.unit or "items"
        return f"{per_s:,.1f} {unit}/s" if per_s >= 1 else f"{1 / per_s:,.1f} s per {unit[:-1]}"

    def _left_s(self, elapsed_s: float) -> float | None:
        """The time left at the rate so far; none until something was done this run."""
        counted = self.done - self._initial
        if self.total is None or counted <= 0 or elapsed_s <= 0:
            return None
        return max(0, self.total - self.done) * elapsed_s / counted

    def _noted(self) -> str:
        notes = ", ".join(
            f"{key}={value:,}" if isinstance(value, int) else f"{key}={value}"
            for key, value in self._notes.items()
        )
        return f" [{notes}]" if notes else ""

    def _show(self, line: str, *, final: bool) -> None:
        if not self.enabled or self._stream is None:
            return
        if self._tty:
            padding = " " * max(0, self._width - len(line))
            self._width = 0 if final else len(line)
            self._stream.write(f"\r{line}{padding}{chr(10) if final else ''}")
        else:
            self._stream.write(line + "\n")
        self._stream.flush()
