"""How fast the load generator itself can go: `eval/lib/load_engine.py` against a trivial SSE endpoint.

The endpoint answers every `POST /v1/answer` at once with `sources`, a few `token` events and
`done` (a bare ASGI app, so the server costs as little as it can), under uvicorn in a separate
process: server and client compete for the machine's cores as they would on a small host. At
each rate the engine runs open loop for the duration, as `answer-eval load` does, and the
result says what rate it achieved, how late it sent requests against its Poisson plan
(scheduling lag: actual send time minus planned arrival time), the TTFT it measured (the floor
of what it can measure: the endpoint itself takes no time) and how much CPU it used. Each rate
runs twice, side by side: with the engine's `DedicatedClients` (one connection per request in
flight, the default) and with `SharedClient` (one `httpx.AsyncClient` pool for all requests).

    python -m eval.bench.load_overhead --out docs/benchmarks/load-generator-overhead.json

`max_rate_p99_lag_under_10ms` is the highest rate whose p99 scheduling lag stayed under 10 ms
with every request answered: the rate up to which the generator is not the bottleneck.
`other_processes_cpu_pct` says how much of the machine other processes took meanwhile; on a
shared machine run it under `chrt -r 10` (real-time round robin, inherited by the server) so
the two compete for the cores with each other rather than with the neighbours.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import aclosing, contextmanager
from pathlib import Path
from typing import Any, Literal

import httpx

from eval.lib.latency_stats import level_metrics
from eval.lib.load_engine import (
    DedicatedClients,
    HttpClients,
    LoadConfig,
    SharedClient,
    run_open_loop,
    warm_up,
)
from eval.lib.questions import Question
from eval.lib.results import write_result
from eval.lib.stack import free_port

Message = dict[str, Any]
LAG_LIMIT_MS = 10.0
TOKENS = 8
WARM_UP_RPS, WARM_UP_S = 50.0, 2.0
Clients = Literal["dedicated", "shared"]
KINDS: tuple[Clients, ...] = ("dedicated", "shared")


def _event(name: str, data: dict[str, Any]) -> bytes:
    return f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()


_DONE = {
    "outcome": "ok",
    "ttft_ms": 0.0,
    "prompt_tokens": 100,
    "cached_tokens": 0,
    "completion_tokens": TOKENS,
    "timings_ms": {"embed": 0.0, "search": 0.0, "rerank": 0.0, "prompt": 0.0, "generate": 0.0},
}
_CHUNKS = [
    _event("sources", {"sources": []}),
    *(_event("token", {"text": f" t{n}"}) for n in range(TOKENS)),
    _event("done", _DONE),
]


async def trivial_app(
    scope: Message,
    receive: Callable[[], Awaitable[Message]],
    send: Callable[[Message], Awaitable[None]],
) -> None:
    """`POST /v1/answer`: the whole stream at once, one chunk per event; 404 for the rest."""
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body", False):
        pass
    if scope["path"] != "/v1/answer":
        await send({"type": "http.response.start", "status": 404, "headers": []})
        await send({"type": "http.response.body", "body": b""})
        return
    headers = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    for chunk in _CHUNKS:
        await send({"type": "http.response.body", "body": chunk, "more_body": True})
    await send({"type": "http.response.body", "body": b""})


@contextmanager
def _server() -> Iterator[tuple[str, int]]:
    """uvicorn serving `trivial_app` in its own process; yields its URL and process id."""
    port = free_port()
    command = [sys.executable, "-m", "uvicorn", "eval.bench.load_overhead:trivial_app"]
    options = ["--port", str(port), "--log-level", "warning", "--lifespan", "off"]
    process = subprocess.Popen([*command, *options, "--no-access-log"])
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(url, timeout=1)
                break
            except httpx.TransportError:
                if time.monotonic() > deadline or process.poll() is not None:
                    raise RuntimeError("the trivial endpoint did not start") from None
                time.sleep(0.1)
        yield url, process.pid
    finally:
        process.terminate()
        process.wait(timeout=10)


def _cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of a process (Linux `/proc`; None elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _machine_busy_s() -> float | None:
    """CPU seconds all cores spent busy since boot (Linux `/proc/stat`; None elsewhere)."""
    try:
        ticks = [int(t) for t in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except OSError:
        return None
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def _share(before: float | None, after: float | None, wall_s: float) -> float | None:
    """CPU seconds per wall second, in percent of one core."""
    return None if before is None or after is None else round(100 * (after - before) / wall_s, 1)


def _clients(kind: Clients, config: LoadConfig) -> HttpClients:
    if kind == "shared":
        return SharedClient(config, config.max_in_flight)
    return DedicatedClients(config)


async def _measure(
    url: str, server_pid: int, rate: float, duration_s: float, kind: Clients
) -> dict[str, Any]:
    config = LoadConfig(url=url, duration_s=duration_s, request_timeout_s=10.0)
    questions = [Question(str(n), f"question {n}") for n in range(100)]
    async with aclosing(_clients(kind, config)) as clients:
        load_before = os.getloadavg()[0]
        server_before, machine_before = _cpu_s(server_pid), _machine_busy_s()
        cpu_before, wall_before = time.process_time(), time.perf_counter()
        run = await run_open_loop(clients, config, questions, rate)
        client_cpu_s = time.process_time() - cpu_before
        wall_s = time.perf_counter() - wall_before
        server_after, machine_after = _cpu_s(server_pid), _machine_busy_s()
    metrics = level_metrics(run, slo_ms=1000.0)
    client_cpu = round(100 * client_cpu_s / wall_s, 1)
    server_cpu = _share(server_before, server_after, wall_s)
    machine_cpu = _share(machine_before, machine_after, wall_s)
    others = None
    if machine_cpu is not None and server_cpu is not None:
        others = round(max(0.0, machine_cpu - client_cpu - server_cpu), 1)
    return {
        "arrivals": metrics["arrivals"],
        "ok": metrics["ok"],
        "failed": metrics["arrivals"] - metrics["ok"],
        "offered_rps": metrics["offered_rps"],
        "achieved_rps": round(metrics["ok"] / duration_s, 2),
        "schedule_lag_ms": metrics.get("schedule_lag_ms", {}),
        "client_cpu_pct": client_cpu,
        "client_cpu_ms_per_request": round(1000 * client_cpu_s / max(1, metrics["sent"]), 3),
        "server_cpu_pct": server_cpu,
        "other_processes_cpu_pct": others,
        "ttft_ms": _pick(metrics["ttft_ms"]),
        "e2e_ms": _pick(metrics["e2e_ms"]),
        "load_average_1m_before": round(load_before, 2),
    }


def _pick(summary: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in summary.items() if k in ("p50", "p99")}


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    return None if not numerator or not denominator else round(numerator / denominator, 2)


async def _run(rates: list[float], duration_s: float) -> list[dict[str, Any]]:
    results = []
    await warm_up()
    with _server() as (url, pid):
        await _measure(url, pid, WARM_UP_RPS, WARM_UP_S, "dedicated")  # lazy imports; dropped
        for rate in rates:
            result: dict[str, Any] = {"rate": rate}
            for kind in KINDS:
                result[kind] = measured = await _measure(url, pid, rate, duration_s, kind)
                lag = measured["schedule_lag_ms"]
                print(
                    f"rate {rate:g} {kind}: achieved {measured['achieved_rps']} rps, lag p50/p99 "
                    f"{lag.get('p50')}/{lag.get('p99')} ms, TTFT p50/p99 "
                    f"{measured['ttft_ms'].get('p50')}/{measured['ttft_ms'].get('p99')} ms, "
                    f"CPU % of a core: client {measured['client_cpu_pct']}, server "
                    f"{measured['server_cpu_pct']}, others {measured['other_processes_cpu_pct']}"
                )
            result["ttft_p99_shared_over_dedicated"] = _ratio(
                result["shared"]["ttft_ms"].get("p99"), result["dedicated"]["ttft_ms"].get("p99")
            )
            results.append(result)
    return results


def _sustained(results: list[dict[str, Any]], kind: Clients) -> float:
    good = [
        r["rate"]
        for r in results
        if r[kind]["failed"] == 0
        and r[kind]["schedule_lag_ms"].get("p99", float("inf")) < LAG_LIMIT_MS
    ]
    return max(good, default=0.0)


_POLICIES = {os.SCHED_OTHER: "SCHED_OTHER", os.SCHED_FIFO: "SCHED_FIFO", os.SCHED_RR: "SCHED_RR"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rates", default="25,50,100,200,300,400,600,800")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per rate")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    rates = [float(r) for r in args.rates.split(",")]
    results = asyncio.run(_run(rates, args.duration))
    sustained = {kind: _sustained(results, kind) for kind in KINDS}
    write_result(
        args.out,
        "load_overhead",
        {
            "rates": rates,
            "duration_s": args.duration,
            "tokens_per_answer": TOKENS,
            "cpus": os.cpu_count(),
            "niceness": os.nice(0),
            "scheduling_policy": _POLICIES.get(os.sched_getscheduler(0), "other"),
            "lag_limit_ms": LAG_LIMIT_MS,
        },
        {},
        {"rates": results, "max_rate_p99_lag_under_10ms": sustained},
    )
    print(f"highest rate with p99 scheduling lag < {LAG_LIMIT_MS:g} ms: {sustained} rps")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
