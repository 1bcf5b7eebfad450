"""Overload and soak, against one `answer-service serve` process and a running SGLang.

- overload: open-loop Poisson arrivals at `--overload-factor` times the measured goodput. The
  admitted requests (those not refused) should keep their SLO attainment, and the refused ones
  should be refused at once (client-side time to the 429/503, with Retry-After).
- soak: the goodput rate for `--soak-s`; the service process's resident memory and open file
  descriptors are sampled every `--sample-s` and should stay flat (first vs last minute,
  and the fitted slope).
- the garbage collector's pauses per phase (start-up, overload, soak), the service's own
  time to each refusal (`service_refusal_ms`: from the request reaching it to the 429/503
  handed to the HTTP server, bucketed) and how late its event loop ran what was due
  (`loop_lag_ms`), read from its `/metrics` (`answer_gc_pause_seconds`,
  `answer_refusal_seconds`, `answer_event_loop_lag_seconds`) before and after each.
- in the overload, each response's time on the wire (`wire_ms`, by status: from the
  request's first bytes on the loopback interface to its response's, by the kernel's clock;
  docs/benchmarks/wire_timing.py, as root): what the service host takes, without the load generator's
  own waits on the cores it shares (`--no-wire` to skip).

Both drive the service with `answer-eval load` (eval/lib/load_engine.py). The answer cache is off so
every request is answered by the pipeline.

    PYTHONPATH=. python docs/benchmarks/overload_soak.py --index DIR --sglang-url http://127.0.0.1:30000 \\
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
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from docs.benchmarks.wire_timing import Exchange, LoopbackCapture, exchanges
from eval.lib.data import SQUAD_DIR
from eval.lib.latency_stats import percentiles
from eval.lib.stack import ServiceProcess, add_service_options, free_port, service_environment


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


def _schedule_lag(load: dict[str, Any]) -> dict[str, float] | None:
    """How late the load generator sent its requests (its own loop's lateness, on the cores it
    shares with the service): part of every client-side time it reports."""
    rates = load.get("metrics", {}).get("rates", [])
    return rates[0].get("schedule_lag_ms") if rates else None


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
class HistogramReading:
    """One labelled child of a Prometheus histogram as read: cumulative counts by bucket upper
    bound (s), +Inf's being all of them, and the total time."""

    buckets: dict[float, float]
    total_s: float = 0.0


Reading = dict[str, HistogramReading]


def read_metrics(url: str) -> str:
    return httpx.get(f"{url}/metrics", timeout=10.0).text


def parse_histogram(text: str, family_name: str, label: str) -> Reading:
    """A histogram family from a Prometheus exposition, per value of `label`."""
    buckets: dict[str, dict[float, float]] = {}
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name != family_name:
            continue
        for sample in family.samples:
            value = sample.labels.get(label, "")
            if sample.name.endswith("_bucket"):
                buckets.setdefault(value, {})[float(sample.labels["le"])] = sample.value
            elif sample.name.endswith("_sum"):
                totals[value] = sample.value
    return {v: HistogramReading(counts, totals.get(v, 0.0)) for v, counts in buckets.items()}


def parse_gc_pauses(text: str) -> Reading:
    """`answer_gc_pause_seconds` per generation."""
    return parse_histogram(text, "answer_gc_pause_seconds", "generation")


def parse_refusals(text: str) -> Reading:
    """`answer_refusal_seconds` (the service's time to a 429/503) per status."""
    return parse_histogram(text, "answer_refusal_seconds", "status")


def parse_loop_lag(text: str) -> Reading:
    """`answer_event_loop_lag_seconds` (unlabelled: one child, under "")."""
    return parse_histogram(text, "answer_event_loop_lag_seconds", "")


@dataclass(frozen=True, slots=True)
class Observed:
    """What a histogram child observed between two readings."""

    count: int
    total_ms: float
    cumulative: dict[float, float]

    def at_most_ms(self, share: float) -> float | None:
        """The upper bound (ms) of the bucket holding the `share` quantile; None where nothing
        was observed or it lies past the last finite bucket."""
        if not self.count:
            return None
        bound = min(b for b, seen in self.cumulative.items() if seen >= share * self.count)
        return None if bound == float("inf") else bound * 1000.0


def _observed(before: Reading, after: Reading) -> dict[str, Observed]:
    observed = {}
    for value, late in sorted(after.items()):
        early = before.get(value, HistogramReading({}))
        delta = {b: seen - early.buckets.get(b, 0.0) for b, seen in late.buckets.items()}
        observed[value] = Observed(
            int(delta.get(float("inf"), 0.0)),
            round((late.total_s - early.total_s) * 1000.0, 1),
            delta,
        )
    return observed


def gc_pauses_between(before: Reading, after: Reading) -> dict[str, dict[str, Any]]:
    """Per generation, the collections between two readings: how many, their total, and the
    upper bound of the bucket the longest fell in (`max_ms_at_most`, None if none)."""
    return {
        generation: {
            "collections": seen.count,
            "total_ms": seen.total_ms,
            "max_ms_at_most": seen.at_most_ms(1.0),
        }
        for generation, seen in _observed(before, after).items()
    }


def _spread(seen: Observed) -> dict[str, Any]:
    """The mean and the bucket bounds the p50, p90, p99 and longest fell under."""
    return {
        "mean_ms": round(seen.total_ms / seen.count, 2) if seen.count else None,
        **{
            f"{name}_ms_at_most": seen.at_most_ms(share)
            for name, share in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99), ("max", 1.0))
        },
    }


def refusals_between(before: Reading, after: Reading) -> dict[str, dict[str, Any]]:
    """Per status, the refusals the service timed between two readings: how many and their
    spread."""
    return {
        status: {"refusals": seen.count, **_spread(seen)}
        for status, seen in _observed(before, after).items()
    }


def loop_lag_between(before: Reading, after: Reading) -> dict[str, Any] | None:
    """The event loop's lateness sampled between two readings (`answer_event_loop_lag_seconds`):
    how many samples and their spread; None where the service exports none."""
    seen = _observed(before, after).get("")
    return {"samples": seen.count, **_spread(seen)} if seen is not None else None


def wire_summary(seen: list[Exchange]) -> dict[str, dict[str, Any]]:
    """Per response status, how many exchanges and the wire time from request to response
    start (ms): for a refusal its whole time in the service host, for a 200 stream the time to
    its headers (its sources come after)."""
    by_status: dict[str, list[float]] = {}
    for exchange in seen:
        by_status.setdefault(str(exchange.status), []).append(exchange.ms)
    return {
        status: {
            "count": len(times),
            **percentiles(times, (50, 90, 95, 99)),
            "max": round(max(times), 3),
        }
        for status, times in sorted(by_status.items())
    }


def on_the_wire(
    port: int, wanted: bool, run: Callable[[], dict[str, Any]]
) -> tuple[dict[str, Any], dict[str, Any] | str]:
    """`run()`'s result and, where permitted (root or CAP_NET_RAW), the wire times of the
    responses on `port` meanwhile; else the reason there are none."""
    if not wanted:
        return run(), "not asked for (--no-wire)"
    try:
        capture = LoopbackCapture(port)
    except PermissionError as exc:
        return run(), f"no capture: {exc} (needs root or CAP_NET_RAW)"
    with capture:
        result = run()
        time.sleep(0.5)  # the last responses' packets
    return result, wire_summary(exchanges(capture.packets))


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
    parser.add_argument("--questions", type=Path, default=SQUAD_DIR / "questions.jsonl")
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
        "--no-wire",
        dest="wire",
        action="store_false",
        help="do not time responses on the loopback interface (docs/benchmarks/wire_timing.py)",
    )
    add_service_options(parser)
    args = parser.parse_args(argv)

    env = service_environment(
        None,
        {"ANSWER_RERANKER_MODEL": "", "ANSWER_MAX_NEW_TOKENS": str(args.max_new_tokens)},
        dict(args.service_env),
    )
    scratch = Path(tempfile.mkdtemp(prefix="overload-soak-"))
    port = free_port()
    service = ServiceProcess(
        "overload",
        port=port,
        index_dir=args.index,
        sglang_url=args.sglang_url,
        env=env,
        scratch=scratch,
        extra_args=tuple(f"--experiment={knob}" for knob in args.experiment),
    )
    url = service.start(needs_reranker=False)
    try:
        pid = int((scratch / "service-overload.pid").read_text())
        overload_rate = args.goodput_rps * args.overload_factor
        ready = read_metrics(url)
        overload, overload_wire = on_the_wire(
            port,
            args.wire,
            lambda: _load(url, args, overload_rate, args.overload_s, scratch / "overload.json"),
        )
        overloaded = read_metrics(url)
        with Sampler(pid, args.sample_s) as sampler:
            soak = (
                _load(url, args, args.goodput_rps, args.soak_s, scratch / "soak.json")
                if args.soak_s > 0
                else {"requests": []}
            )
        soaked = read_metrics(url)
    finally:
        service.stop()
    soak_stats: dict[str, Any] = (
        {
            "rate_rps": args.goodput_rps,
            **overload_summary(soak["requests"], args.slo_ms),
            "client_schedule_lag_ms": _schedule_lag(soak),
            **soak_summary(sampler.samples),
            "service_refusal_ms": refusals_between(
                parse_refusals(overloaded), parse_refusals(soaked)
            ),
            "gc_pauses": gc_pauses_between(parse_gc_pauses(overloaded), parse_gc_pauses(soaked)),
            "loop_lag_ms": loop_lag_between(parse_loop_lag(overloaded), parse_loop_lag(soaked)),
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
            "client_schedule_lag_ms": _schedule_lag(overload),
            "wire_ms": overload_wire,
            "service_refusal_ms": refusals_between(
                parse_refusals(ready), parse_refusals(overloaded)
            ),
            "gc_pauses": gc_pauses_between(parse_gc_pauses(ready), parse_gc_pauses(overloaded)),
            "loop_lag_ms": loop_lag_between(parse_loop_lag(ready), parse_loop_lag(overloaded)),
        },
        "soak": soak_stats,
        "gc_pauses_start_up": gc_pauses_between({}, parse_gc_pauses(ready)),
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({**summary, "soak_trace": trace}, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
