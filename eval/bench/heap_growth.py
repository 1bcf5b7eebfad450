"""What grew on a service's Python heap during a soak: tracemalloc snapshots taken by
eval/bench/heap_trace/sitecustomize.py, compared.

    python -m eval.bench.heap_growth /tmp/heap --since 2 --out docs/benchmarks/soak-heap-growth.json

Per snapshot the traced total (MiB); then, from snapshot `--since` (after warm-up: the
first ones hold the loading of models and indexes) to the last, the call sites whose live
memory grew or shrank most. A heap that is flat while the process's resident memory rises
points below Python (the allocator's arenas, native caches).
"""

from __future__ import annotations

import argparse
import json
import tracemalloc
from collections.abc import Sequence
from pathlib import Path
from typing import Any

_IGNORED = (
    tracemalloc.Filter(False, tracemalloc.__file__),
    tracemalloc.Filter(False, "<frozen importlib._bootstrap>"),
    tracemalloc.Filter(False, "<frozen importlib._bootstrap_external>"),
)


def _mib(snapshot: tracemalloc.Snapshot) -> float:
    return round(sum(stat.size for stat in snapshot.statistics("filename")) / 2**20, 2)


def heap_growth(paths: Sequence[Path], since: int, top: int) -> dict[str, Any]:
    snapshots = [tracemalloc.Snapshot.load(str(p)).filter_traces(_IGNORED) for p in paths]
    if len(snapshots) < 2:
        raise SystemExit("need at least two snapshots")
    since = min(max(since, 0), len(snapshots) - 2)
    changes = snapshots[-1].compare_to(snapshots[since], "traceback")
    changes.sort(key=lambda stat: abs(stat.size_diff), reverse=True)
    return {
        "snapshots": [p.name for p in paths],
        "traced_mib": [_mib(s) for s in snapshots],
        "since": paths[since].name,
        "traced_mib_change": round(_mib(snapshots[-1]) - _mib(snapshots[since]), 2),
        "largest_changes": [
            {
                "kib": round(stat.size_diff / 1024, 1),
                "blocks": stat.count_diff,
                "where": [f"{frame.filename}:{frame.lineno}" for frame in stat.traceback][-4:],
            }
            for stat in changes[:top]
        ],
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m eval.bench.heap_growth", description=__doc__)
    parser.add_argument("directory", type=Path, help="HEAP_TRACE_DIR of the run")
    parser.add_argument("--since", type=int, default=2, help="the snapshot to compare from")
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    paths = sorted(args.directory.glob("*.snap"))
    result = heap_growth(paths, args.since, args.top)
    text = json.dumps(result, indent=2)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
