"""Overload and soak, against one `answer-service serve` process and a running SGLang.

- overload: open-loop Poisson arrivals at `--overload-factor` times the measured goodput. The
  admitted requests (those not refused) should keep their SLO attainment, and the refused ones
  should be refused at once (client-side time to the 429/503, with Retry-After).
- soak: the goodput rate for `--soak-s`; the service process's resident memory and open file
  descriptors are sampled every `--sample-s` and should stay flat (first vs last minute,
  and the fitted slope).
- the garbage collector's pauses per phase (start-up, overload, soak), read from the
  service's `/metrics` (`answer_gc_pause_seconds`) before and after each.

Both drive the service with `answer-eval load` (eval/load.py). The answer cache is off so
every request is answered by the pipeline.

    python -m eval.overload_soak --index DIR --sglang-url http://127.0.0.1:30000 \\
        --goodput-rps 0.7 --out docs/benchmarks/overload-soak.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from eval.latency_stats import percentiles
from eval.service_process import ServiceProcess, free_port

SQUAD = Path(__file__).resolve().parents[2] / "shared" / "data" / "squad-v1.1-open"


def _load(
    url: str, args: argparse.Namespace, rate: float, duration_s: float, out: Path
) -> dict[str, Any]:
    command = [
        str(Path(sys.executable).with_name("answer-eval")),
        "load",
        "--url",
        url,
        "--questions",
        str(args.questions),
        "--seed",
        str(args.seed),
        "--rate",
        str(rate),
        "--duration",
        str(duration_s),
        "--slo-ms",
        str(args.slo_ms),
        "--ttft-budget-ms",
        str(int(args.slo_ms)),
        "--out",
        str(out),
    ]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    result: dict[str, Any] = json.loads(out.read_text())
    return result


def overload_summary(requests: list[dict[str, Any]], slo_ms: float) -> dict[str, Any]:
    refused = [r for r in requests if r["status"] == "rejected"]
    admitted = [r for r in requests if r["status"] != "rejected" and r["status"] != "dropped"]
    met = [r for r in admitted if r["status"] == "ok" and (r["client_ttft_ms"] or 1e18) <= slo_ms]
    return {
        "requests": len(requests),
        "admitted": len(admitted),
        "refused": len(refused),
        "refused_share": round(len(refused) / len(requests), 4) if requests else None,
        "admitted_attainment": round(len(met) / len(admitted), 4) if admitted else None,
        "admitted_outcomes": {
            status: sum(r["status"] == status for r in admitted)
            for status in sorted({r["status"] for r in admitted})
        },
        # Client side, send to the full refusal response (status 429/503 with Retry-After).
        "refusal_ms": percentiles([r["e2e_ms"] for r in refused if r["e2e_ms"] is not None]),
        "refusal_codes": sorted({str(r["error_code"]) for r in refused}),
        "server_errors_without_retry_after": sum(
            r["status"] == "error" and (r["http_status"] or 0) >= 500 for r in requests
        ),
    }


@dataclass(frozen=True, slots=True)
class GcHistogram:
    """One generation's pause histogram as read: cumulative counts by bucket upper bound (s),
    +Inf's being all of them, and the total time."""

    buckets: dict[float, float]
    total_s: float = 0.0


GcReading = dict[str, GcHistogram]


def gc_pauses(url: str) -> GcReading:
    """The service's garbage-collection pause histogram so far, from its `/metrics`."""
    return parse_gc_pauses(httpx.get(f"{url}/metrics", timeout=10.0).text)


def parse_gc_pauses(text: str) -> GcReading:
    """`answer_gc_pause_seconds` from a Prometheus exposition, per generation."""
    buckets: dict[str, dict[float, float]] = {}
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name != "answer_gc_pause_seconds":
            continue
        for sample in family.samples:
            generation = sample.labels.get("generation", "")
            if sample.name.endswith("_bucket"):
                buckets.setdefault(generation, {})[float(sample.labels["le"])] = sample.value
            elif sample.name.endswith("_sum"):
                totals[generation] = sample.value
    return {g: GcHistogram(counts, totals.get(g, 0.0)) for g, counts in buckets.items()}


def gc_pauses_between(before: GcReading, after: GcReading) -> dict[str, dict[str, Any]]:
    """Per generation, the collections between two readings: how many, their total, and the
    upper bound of the bucket the longest fell in (`max_ms_at_most`, None if none)."""
    summary = {}
    for generation, late in sorted(after.items()):
        early = before.get(generation, GcHistogram({}))
        delta = {b: seen - early.buckets.get(b, 0.0) for b, seen in late.buckets.items()}
        count = delta.get(float("inf"), 0.0)
        reached = [b for b, seen in sorted(delta.items()) if seen >= count]
        summary[generation] = {
            "collections": int(count),
            "total_ms": round((late.total_s - early.total_s) * 1000.0, 1),
            "max_ms_at_most": reached[0] * 1000.0 if count and reached[0] != float("inf") else None,
        }
    return summary


def rss_mib(pid: int | str = "self") -> float:
    """A process's resident memory (VmRSS), in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024.0
    raise RuntimeError(f"no VmRSS in /proc/{pid}/status")


class Sampler:
    """The process's RSS (MiB) and open file descriptors every `every_s`."""

    def __init__(self, pid: int, every_s: float) -> None:
        self.pid = pid
        self.every_s = every_s
        self.samples: list[tuple[float, float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> tuple[float, float, int]:
        fds = len(os.listdir(f"/proc/{self.pid}/fd"))
        return time.monotonic(), rss_mib(self.pid), fds

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self.samples.append(self._sample())

    def __enter__(self) -> Sampler:
        self.samples.append(self._sample())
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()
        self.samples.append(self._sample())


def soak_summary(samples: list[tuple[float, float, int]], window_s: float = 60.0) -> dict[str, Any]:
    start, end = samples[0][0], samples[-1][0]
    t = np.array([s[0] - start for s in samples])
    rss = np.array([s[1] for s in samples])
    fds = np.array([s[2] for s in samples])
    first, last = t <= window_s, t >= (end - start) - window_s
    later = t >= (end - start) / 2
    return {
        "samples": len(samples),
        "duration_s": round(end - start, 1),
        "rss_mib_first_minute": round(float(np.median(rss[first])), 1),
        "rss_mib_last_minute": round(float(np.median(rss[last])), 1),
        "rss_mib_per_minute": round(float(np.polyfit(t / 60.0, rss, 1)[0]), 3),
        # Bounded stores fill early; what still rises in the second half is what to look at.
        "rss_mib_per_minute_second_half": round(
            float(np.polyfit(t[later] / 60.0, rss[later], 1)[0]), 3
        ),
        "fds_first_minute": int(np.median(fds[first])),
        "fds_last_minute": int(np.median(fds[last])),
        "fds_max": int(fds.max()),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--index", type=Path, required=True)
    parser.add_argument("--sglang-url", default="http://127.0.0.1:30000")
    parser.add_argument("--questions", type=Path, default=SQUAD / "questions.jsonl")
    parser.add_argument("--goodput-rps", type=float, required=True, help="measured goodput")
    parser.add_argument("--overload-factor", type=float, default=3.0)
    parser.add_argument("--overload-s", type=float, default=180.0)
    parser.add_argument("--soak-s", type=float, default=600.0, help="0: overload only")
    parser.add_argument("--sample-s", type=float, default=5.0)
    parser.add_argument("--slo-ms", type=float, default=3000.0)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--service-env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a setting for the service, e.g. ANSWER_RECENT_REQUESTS=300 (repeatable)",
    )
    args = parser.parse_args(argv)

    env = {key: value for key, value in os.environ.items() if not key.startswith("ANSWER_")}
    env.update(
        ANSWER_RERANKER_MODEL="",
        ANSWER_MAX_NEW_TOKENS=str(args.max_new_tokens),
        ANSWER_ANSWER_CACHE_TTL_S="0",
    )
    env.update(item.split("=", 1) for item in args.service_env)
    scratch = Path(tempfile.mkdtemp(prefix="overload-soak-"))
    service = ServiceProcess(
        "overload",
        port=free_port(),
        index_dir=args.index,
        sglang_url=args.sglang_url,
        env=env,
        scratch=scratch,
    )
    url = service.start(needs_reranker=False)
    try:
        pid = int((scratch / "service-overload.pid").read_text())
        overload_rate = args.goodput_rps * args.overload_factor
        ready_gc = gc_pauses(url)
        overload = _load(url, args, overload_rate, args.overload_s, scratch / "overload.json")
        overload_gc = gc_pauses(url)
        with Sampler(pid, args.sample_s) as sampler:
            soak = (
                _load(url, args, args.goodput_rps, args.soak_s, scratch / "soak.json")
                if args.soak_s > 0
                else {"requests": []}
            )
        soak_gc = gc_pauses(url)
    finally:
        service.stop()
    soak_stats: dict[str, Any] = (
        {
            "rate_rps": args.goodput_rps,
            **overload_summary(soak["requests"], args.slo_ms),
            **soak_summary(sampler.samples),
            "gc_pauses": gc_pauses_between(overload_gc, soak_gc),
        }
        if args.soak_s > 0
        else {}
    )
    trace = [[round(t - sampler.samples[0][0], 1), round(m, 1), f] for t, m, f in sampler.samples]
    summary: dict[str, Any] = {
        "command": "overload-soak",
        "config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "overload": {
            "rate_rps": overload_rate,
            **overload_summary(overload["requests"], args.slo_ms),
            "gc_pauses": gc_pauses_between(ready_gc, overload_gc),
        },
        "soak": soak_stats,
        "gc_pauses_start_up": gc_pauses_between({}, ready_gc),
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({**summary, "soak_trace": trace}, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
