"""Heap snapshots of a service process, for the soak's memory question (eval/bench/heap_growth.py).

Python imports `sitecustomize` at start-up from its path; with this folder on PYTHONPATH and
HEAP_TRACE_DIR set, the process starts tracemalloc (HEAP_TRACE_FRAMES frames, default 12) and
dumps a snapshot every HEAP_TRACE_EVERY_S seconds (default 150) to HEAP_TRACE_DIR/PID-NNN.snap:

    python -m eval.bench.overload_soak ... --service-env PYTHONPATH=eval/heap_trace \\
        --service-env HEAP_TRACE_DIR=/tmp/heap

Tracing slows allocation and a dump holds the interpreter for seconds: the figures of such a
run are for the heap, not for latency. Without HEAP_TRACE_DIR nothing happens.
"""

from __future__ import annotations

import os
import threading
import time
import tracemalloc
from pathlib import Path


def _dump_every(directory: Path, every_s: float) -> None:
    for n in range(1_000_000):
        time.sleep(every_s)
        tracemalloc.take_snapshot().dump(str(directory / f"{os.getpid()}-{n:03d}.snap"))


if directory := os.environ.get("HEAP_TRACE_DIR"):
    Path(directory).mkdir(parents=True, exist_ok=True)
    tracemalloc.start(int(os.environ.get("HEAP_TRACE_FRAMES", "12")))
    threading.Thread(
        target=_dump_every,
        args=(Path(directory), float(os.environ.get("HEAP_TRACE_EVERY_S", "150"))),
        daemon=True,
        name="heap-trace",
    ).start()
