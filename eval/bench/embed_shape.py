"""The query embedder's memory and latency with and without padded token lengths, side by side.

torch keeps native memory for every input shape it has run, so a service embedding queries of
ever new token lengths grows until it has seen them all (`retrieval/embedder.py`,
`EmbedderConfig.pad_to_multiple_of`). Each arm is a fresh process: load the embedder (its
`warm_up()` runs the padded lengths once), then embed `--queries` real questions one at a time,
as the service does (SQuAD dev and NQ-open questions and SciFact train claims, interleaved, for
a spread of lengths).
Per arm: resident memory after warm-up and at the end, the per-query latency, and how many
distinct token lengths the questions had. The arms alternate (A B, B A, ...) for `--rounds`;
the vectors of the two arms are compared by cosine.

    python -m eval.bench.embed_shape --out docs/benchmarks/embed-shape-buckets.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from eval.bench.overload_soak import rss_mib
from eval.lib.latency_stats import percentiles
from eval.lib.paths import SHARED_DATA

DATA = SHARED_DATA
QUESTIONS = (
    DATA / "squad-v1.1-open" / "questions.jsonl",
    DATA / "nq-open" / "NQ-open.dev.jsonl",
    DATA / "scifact" / "queries.train.jsonl",
)


def _questions(limit: int) -> list[str]:
    sets = [
        [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        for path in QUESTIONS
    ]
    mixed = [row for rows in itertools.zip_longest(*sets) for row in rows if row is not None]
    return [row.get("question") or row["text"] for row in mixed][:limit]


def run_arm(pad: int, queries: int, vectors_out: Path) -> dict[str, Any]:
    """One arm in this process (it must be a fresh one for the memory figures)."""
    from retrieval.embedder import EmbedderConfig, SentenceTransformerEmbedder

    start = rss_mib()
    embedder = SentenceTransformerEmbedder(EmbedderConfig(pad_to_multiple_of=pad))
    began = time.perf_counter()
    embedder.warm_up()
    warm_s = time.perf_counter() - began
    warmed = rss_mib()
    texts = _questions(queries)
    lengths = {len(embedder.token_spans(text)) for text in texts}
    latencies, vectors = [], []
    for text in texts:
        began = time.perf_counter()
        vectors.append(embedder.encode([text], batch_size=1)[0])
        latencies.append((time.perf_counter() - began) * 1000.0)
    np.save(vectors_out, np.stack(vectors))
    end = rss_mib()
    half = len(latencies) // 2
    return {
        "pad_to_multiple_of": pad,
        "queries": len(texts),
        "distinct_token_lengths": len(lengths),
        "warm_up_s": round(warm_s, 2),
        "rss_mib_before_load": round(start, 1),
        "rss_mib_after_warm_up": round(warmed, 1),
        "rss_mib_end": round(end, 1),
        "rss_mib_growth_serving": round(end - warmed, 1),
        "latency_ms": percentiles(latencies),
        "latency_ms_second_half": percentiles(latencies[half:]),
    }


def _median(runs: list[dict[str, Any]], *path: str) -> float:
    values = []
    for run in runs:
        value: Any = run
        for key in path:
            value = value[key]
        values.append(float(value))
    return round(float(np.median(values)), 3)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--queries", type=int, default=3000)
    parser.add_argument("--pads", default="1,16", help="the arms' pad_to_multiple_of")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--arm", type=int, help=argparse.SUPPRESS)  # a child: run one arm
    parser.add_argument("--vectors", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.arm is not None:
        print(json.dumps(run_arm(args.arm, args.queries, args.vectors)))
        return 0

    pads = [int(p) for p in args.pads.split(",")]
    runs: dict[int, list[dict[str, Any]]] = {pad: [] for pad in pads}
    scratch = Path(tempfile.mkdtemp(prefix="embed-shapes-"))
    for round_ in range(args.rounds):
        for pad in pads if round_ % 2 == 0 else pads[::-1]:
            vectors = scratch / f"pad{pad}.npy"
            child = [sys.executable, "-m", "eval.bench.embed_shape", "--out", str(args.out)]
            child += ["--arm", str(pad), "--queries", str(args.queries), "--vectors", str(vectors)]
            done = subprocess.run(child, check=True, capture_output=True, text=True, env=os.environ)
            runs[pad].append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(f"pad={pad} round={round_}: {runs[pad][-1]}", file=sys.stderr)
    first, *others = pads
    cosines = {}
    base = np.load(scratch / f"pad{first}.npy")
    for pad in others:
        cosine = (base * np.load(scratch / f"pad{pad}.npy")).sum(axis=1)
        cosines[f"{first}_vs_{pad}"] = {"min": round(float(cosine.min()), 4)}
        cosines[f"{first}_vs_{pad}"]["mean"] = round(float(cosine.mean()), 4)
    arms = {
        str(pad): {
            "rss_mib_after_warm_up_median": _median(found, "rss_mib_after_warm_up"),
            "rss_mib_growth_serving_median": _median(found, "rss_mib_growth_serving"),
            "latency_ms_p50_median": _median(found, "latency_ms", "p50"),
            "latency_ms_p99_median": _median(found, "latency_ms", "p99"),
            "warm_up_s_median": _median(found, "warm_up_s"),
            "runs": found,
        }
        for pad, found in runs.items()
    }
    summary = {
        "command": "python -m eval.bench.embed_shape " + " ".join(argv or sys.argv[1:]),
        "cpu": _cpu_model(),
        "arms": arms,
        "cosine": cosines,
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps({k: v for k, v in summary.items() if k != "arms"}, indent=2))
    return 0


def _cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown"


if __name__ == "__main__":
    raise SystemExit(main())
