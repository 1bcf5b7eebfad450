"""`answer-eval load`: latency under load against a running service's `POST /v1/answer`.

    answer-eval load --url URL --questions FILE --rate R --duration S --slo-ms T --out F.json
    answer-eval load --url URL --questions FILE --rates 0.5,1,2,4 --cooldown-s 10 ...  (sweep)
    answer-eval load --url URL --questions FILE --concurrency 1,4,16 ...  (closed loop)

Open loop sends Poisson arrivals at each rate; closed loop keeps C requests in flight. Each
finished level is checkpointed, so rerunning an interrupted command skips the levels it has.
The definitions of the metrics are in `eval/lib/latency_stats.py`.

The result file's keys: docs/evaluation.md#result-files.

`status` is one of ok, error, rejected (429/503 with Retry-After), timeout, dropped (over the
client's in-flight cap, never sent).
"""

from __future__ import annotations

import argparse
import hashlib
from collections.abc import Callable
from contextlib import aclosing
from pathlib import Path
from typing import Any

from budget.forms import MODES as ANSWER_MODES
from eval.lib.checkpoint import RunCheckpoint
from eval.lib.latency_stats import LevelKind, sweep_metrics
from eval.lib.load_engine import DedicatedClients, LoadConfig, run_levels
from eval.lib.questions import read_load_questions
from eval.lib.results import write_result


def _positive(kind: Callable[[str], float]) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from exc
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be > 0: {text!r}")
        return value

    return parse


def _listed(kind: Callable[[str], float]) -> Callable[[str], list[float]]:
    one = _positive(kind)

    def parse(text: str) -> list[float]:
        return [one(part) for part in text.split(",") if part.strip()]

    return parse


def add_load_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    load = commands.add_parser(
        "load", help="TTFT/ITL/e2e percentiles, SLO attainment and goodput under load"
    )
    load.add_argument("--url", required=True, help="the service's base URL; nothing else is asked")
    load.add_argument("--questions", type=Path, required=True, help="JSONL: _id + question|text")
    levels = load.add_mutually_exclusive_group(required=True)
    levels.add_argument("--rate", type=_positive(float), help="open loop: Poisson requests/s")
    levels.add_argument("--rates", type=_listed(float), help="open-loop sweep: R1,R2,...")
    levels.add_argument("--concurrency", type=_listed(int), help="closed loop: C (or C1,C2,...)")
    load.add_argument("--duration", type=_positive(float), default=60.0, help="seconds per level")
    load.add_argument("--slo-ms", type=_positive(float), required=True, help="TTFT objective")
    load.add_argument("--out", type=Path, required=True)
    load.add_argument("--request-timeout-s", type=_positive(float), default=60.0)
    load.add_argument("--max-in-flight", type=_positive(int), default=256)
    load.add_argument("--cooldown-s", type=float, default=0.0, help="pause between levels")
    load.add_argument("--seed", type=int, help="shuffle the questions (default: file order)")
    load.add_argument("--arrival-seed", type=int, default=0, help="seeds the Poisson arrivals")
    load.add_argument("--ttft-budget-ms", type=int, help="sent with each request")
    load.add_argument("--top-k", type=int, help="sent with each request")
    load.add_argument(
        "--answer-mode",
        choices=ANSWER_MODES,
        help="sent with each request (default: the service's)",
    )
    load.add_argument(
        "--keep-answers", action="store_true", help="keep each answer's text in its record"
    )
    load.set_defaults(run=_load)


def _levels(args: argparse.Namespace) -> tuple[LevelKind, list[float]]:
    if args.concurrency:
        return "concurrency", [float(int(c)) for c in args.concurrency]
    return "rate", args.rates if args.rates else [args.rate]


def _identity(args: argparse.Namespace, kind: LevelKind) -> dict[str, Any]:
    """What makes a finished level reusable. The list of levels is left out, so an interrupted
    sweep can be resumed (or extended) with other levels and keep the ones it has."""
    return {
        "command": "load",
        "kind": kind,
        "url": args.url,
        "questions": hashlib.sha256(args.questions.read_bytes()).hexdigest(),
        "seed": args.seed,
        "arrival_seed": args.arrival_seed,
        "duration_s": args.duration,
        "request_timeout_s": args.request_timeout_s,
        "max_in_flight": args.max_in_flight,
        "ttft_budget_ms": args.ttft_budget_ms,
        "top_k": args.top_k,
        "answer_mode": args.answer_mode,
        "keep_answers": args.keep_answers,
    }


async def _load(args: argparse.Namespace) -> int:
    kind, levels = _levels(args)
    questions = read_load_questions(args.questions, args.seed)
    config = LoadConfig(
        url=args.url,
        duration_s=args.duration,
        request_timeout_s=args.request_timeout_s,
        max_in_flight=args.max_in_flight,
        arrival_seed=args.arrival_seed,
        ttft_budget_ms=args.ttft_budget_ms,
        top_k=args.top_k,
        answer_mode=args.answer_mode,
        cooldown_s=args.cooldown_s,
        keep_answers=args.keep_answers,
    )
    identity = _identity(args, kind)
    checkpoint = RunCheckpoint(args.out, identity)
    try:
        async with aclosing(DedicatedClients(config)) as clients:
            runs = await run_levels(clients, config, questions, kind, levels, checkpoint)
    except BaseException:
        checkpoint.close()
        raise
    metrics = sweep_metrics(runs, args.slo_ms)
    records = [record for run in runs for record in run.records]
    write_result(
        args.out,
        "load",
        {
            **identity,
            "questions_file": str(args.questions),
            "levels": levels,
            "slo_ms": args.slo_ms,
            "cooldown_s": args.cooldown_s,
        },
        {
            "questions_file": str(args.questions),
            "questions": len(questions),
            "questions_asked": len({r.question_id for r in records if r.status != "dropped"}),
        },
        metrics,
        {"requests": [record.to_json() for record in records]},
    )
    checkpoint.finish()
    _print(kind, metrics)
    return 0


def _print(kind: LevelKind, metrics: dict[str, Any]) -> None:
    for level in metrics["rates" if kind == "rate" else "concurrency"]:
        ttft = level["ttft_ms"]
        attained = level["slo_attainment"]
        print(
            f"{kind} {level[kind]:g}: attainment {attained if attained is None else f'{attained:.3f}'}"
            f"  ttft p50 {ttft.get('p50', '-')} p99 {ttft.get('p99', '-')} ms"
            f"  ok {level['ok']} rejected {level['rejected']} errored {level['errored']}"
            f" timeouts {level['timeouts']} dropped {level['dropped_by_client']}"
        )
    print(f"goodput {metrics['goodput_rps']:g} requests/s at TTFT <= {metrics['slo_ms']:g} ms")
