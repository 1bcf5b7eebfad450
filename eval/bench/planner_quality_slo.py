"""The planner's measure: quality within the SLO, Q_c(rate), the planner against every fixed
answer form on the same Poisson arrivals, in one run, on the full stack (real SGLang, SmolLM2).

    python -m eval.bench.planner_quality_slo --out docs/benchmarks/planner-quality-slo.json \\
        --rates 0.25,0.5,1,2 [--slos 3000,500] [--arrivals 300] \\
        [--configs passages-5,passages-3,passages-1,focused-2,quote,planner]

Configurations (each a separate `answer-service serve`; the fixed ones with `ANSWER_PLANNER=false`
and the answer form and passage count set): `passages-5`, `passages-3`, `passages-1` (the model
over whole passages), `focused-2` (over the best sentences of two passages), `quote` (no model);
`planner`: `ANSWER_PLANNER=true`, `ANSWER_MODE=auto`, up to 5 passages, the shipped form
quality. Quotes over the builtin reranker: `quote-d10`, `quote-d30` (depth fixed by the
experiment `fixed_rerank_depth`; `quote` is depth 0) against `planner-quote` (planner on).

The questions are those of one part of the committed SQuAD split (`--part`, the evaluation part
unless a development run names another), answerable ones, in one seeded order. A seeded `--removed-share` of their gold passages (one in five by default)
is taken out of the index every configuration uses, so about one arrival in five asks what the
corpus cannot answer: saying so is right. Every level has exactly `--arrivals` Poisson arrivals
(the same times and questions for every configuration; level i of n starts at question
i x len/n), each request carries `ttft_budget_ms` = the SLO, and SGLang's cache is flushed
before each level. Before a configuration's levels, `--warmup` questions of the
planner-training part are asked one at a time with a generous budget (never measured). Each
finished (SLO, configuration, rate) is checkpointed beside the output, so a rerun resumes. The
metrics are defined in `eval/lib/metrics.py`.

The result file's keys: docs/evaluation.md#result-files.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import logging
import random
import shlex
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from contextlib import aclosing
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

from eval.calibrate.citations import corpus_without
from eval.commands.main import index_of
from eval.lib.checkpoint import RunCheckpoint
from eval.lib.data import PARTS, SQUAD_DIR, squad_part_of
from eval.lib.latency_stats import LevelRun
from eval.lib.load_engine import (
    DedicatedClients,
    LoadConfig,
    RequestSlot,
    level_key,
    level_questions,
    poisson_arrivals,
    run_open_loop,
    send_request,
)
from eval.lib.metrics import Arrival, Gold, judged_level, level_quality, rate_comparison
from eval.lib.questions import Question, read_questions
from eval.lib.results import measured_at, write_result
from eval.lib.stack import (
    ServiceProcess,
    SGLangStack,
    add_stack_options,
    flush_cache,
    free_port,
    named,
    positive_numbers,
    service_environment,
)
from retrieval.embedder import DEFAULT_EMBEDDER, EmbedderConfig, SentenceTransformerEmbedder

logger = logging.getLogger(__name__)

T = TypeVar("T")

CACHE = Path.home() / ".cache" / "answer-service" / "bench"

# Arrivals per configuration and rate asked for by default.
ARRIVALS = 300
# The warm-up is there to get every code path (SGLang's first prefills above all) run once, so
# it is given the time to finish rather than the SLO.
WARMUP_BUDGET_MS = 30_000
WARMUP_TIMEOUT_S = 150.0


BUILTIN = (("ANSWER_RERANKER_MODEL", "builtin"),)


@dataclass(frozen=True, slots=True)
class Configuration:
    """One way to run the service: a fixed form and passage count, or the planner."""

    name: str
    planner: bool
    mode: str
    passages: int
    settings: tuple[tuple[str, str], ...] = ()
    # `serve --experiment` knobs: the rerank depth of a fixed configuration.
    experiment: tuple[str, ...] = ()

    @property
    def reranker(self) -> bool:
        return bool(dict(self.settings).get("ANSWER_RERANKER_MODEL"))

    def environment(self) -> dict[str, str]:
        return {
            "ANSWER_PLANNER": "true" if self.planner else "false",
            "ANSWER_MODE": self.mode,
            "ANSWER_DEFAULT_TOP_K": str(self.passages),
            "ANSWER_RERANKER_MODEL": "",
            **dict(self.settings),
        }


CONFIGURATIONS = {
    c.name: c
    for c in (
        Configuration("passages-5", False, "passages", 5),
        Configuration("passages-3", False, "passages", 3),
        Configuration("passages-1", False, "passages", 1),
        Configuration("focused-2", False, "focused", 2),
        Configuration("quote", False, "quote", 5),
        Configuration("planner", True, "auto", 5),
        # The quote family over the builtin reranker: fixed depths against the planner's.
        *(
            Configuration(f"quote-d{d}", False, "quote", 5, BUILTIN, (f"fixed_rerank_depth={d}",))
            for d in (10, 30)
        ),
        Configuration("planner-quote", True, "quote", 5, BUILTIN),
    )
}
DEFAULT_CONFIGS = "passages-5,passages-3,passages-1,focused-2,quote,planner"


@dataclass(frozen=True, slots=True)
class Workload:
    """The measured questions in their order, what makes each right, the warm-up questions and
    the gold passages taken out of the index."""

    questions: list[Question]
    golds: dict[str, Gold]
    warmup: list[Question]
    removed: set[str]


def workload(path: Path, seed: int, removed_share: float, warmup: int, part: str) -> Workload:
    every = [q for q in read_questions(path) if q.answers and q.gold_passage_id]
    measured = [q for q in every if squad_part_of(q.gold_passage_id or "") == part]
    random.Random(seed).shuffle(measured)
    passages = sorted({q.gold_passage_id for q in measured if q.gold_passage_id})
    rng = random.Random(seed)
    removed = set(rng.sample(passages, round(removed_share * len(passages))))
    golds = {q.question_id: Gold(q.answers, q.gold_passage_id in removed) for q in measured}
    training = [q for q in every if squad_part_of(q.gold_passage_id or "") == "planner_training"]
    return Workload(measured, golds, random.Random(seed).sample(training, warmup), removed)


def planned_arrivals(rate: float, arrivals: int, seed: int) -> tuple[float, list[float]]:
    """The level's duration holding exactly `arrivals` Poisson arrivals, and their offsets."""
    horizon = 3.0 * arrivals / rate + 60.0
    offsets = poisson_arrivals(rate, horizon, seed)
    while len(offsets) <= arrivals:
        horizon *= 2
        offsets = poisson_arrivals(rate, horizon, seed)
    duration = (offsets[arrivals - 1] + offsets[arrivals]) / 2.0
    planned = poisson_arrivals(rate, duration, seed)
    if len(planned) != arrivals:  # the same stream cut between two arrivals: cannot happen
        raise RuntimeError(f"{len(planned)} arrivals planned for {arrivals}")
    return duration, planned


async def _measure(
    load: LoadConfig,
    work: Workload,
    rates: Sequence[float],
    arrivals: int,
    checkpoint: RunCheckpoint,
    flush: Any,
) -> dict[float, LevelRun]:
    patient = replace(load, ttft_budget_ms=WARMUP_BUDGET_MS, request_timeout_s=WARMUP_TIMEOUT_S)
    runs: dict[float, LevelRun] = {}
    async with aclosing(DedicatedClients(load)) as clients:
        for question in work.warmup:
            slot = RequestSlot(Question(question.question_id, question.question), 0.0)
            record = await send_request(clients, patient, slot)
            logger.info("warm-up status=%s ttft_ms=%s", record.status, record.client_ttft_ms)
        for index, rate in enumerate(rates):
            key = level_key("rate", rate)
            if key in checkpoint.done:
                runs[rate] = LevelRun.from_json(checkpoint.done[key])
                continue
            duration, _ = planned_arrivals(rate, arrivals, load.arrival_seed)
            asked = [
                Question(q.question_id, q.question)
                for q in level_questions(work.questions, index, len(rates))
            ]
            flush()
            run = await run_open_loop(clients, replace(load, duration_s=duration), asked, rate)
            checkpoint.record(key, run.to_json())
            logger.info("level measured rate=%g elapsed_s=%.1f", rate, run.elapsed_s)
            runs[rate] = run
    return runs


def _identity(args: argparse.Namespace, config: Configuration, slo_ms: float) -> dict[str, Any]:
    return {
        "command": "planner-quality-slo",
        "config": asdict(config),
        "slo_ms": slo_ms,
        "questions": hashlib.sha256(args.questions.read_bytes()).hexdigest(),
        "passages": hashlib.sha256(args.passages.read_bytes()).hexdigest(),
        "seed": args.seed,
        "part": args.part,
        "removed_share": args.removed_share,
        "arrivals": args.arrivals,
        "arrival_seed": args.arrival_seed,
        "warmup": args.warmup,
        "request_timeout_s": args.request_timeout_s,
        "max_in_flight": args.max_in_flight,
        "service_env": args.service_env,
    }


def measure(
    stack: SGLangStack,
    index_dir: Path,
    args: argparse.Namespace,
    config: Configuration,
    slo_ms: float,
    work: Workload,
    checkpoint: RunCheckpoint,
) -> dict[float, LevelRun]:
    if all(level_key("rate", rate) in checkpoint.done for rate in args.rates):
        return {r: LevelRun.from_json(checkpoint.done[level_key("rate", r)]) for r in args.rates}
    sglang = stack.url()
    service = ServiceProcess(
        f"{config.name}-{slo_ms:g}",
        port=free_port(),
        index_dir=index_dir,
        sglang_url=sglang,
        # Each arrival is answered once per configuration: none from the answer cache.
        env=service_environment(None, config.environment(), args.service_env),
        scratch=stack.scratch,
        extra_args=tuple(f"--experiment={k}" for k in (*args.experiment, *config.experiment)),
    )
    try:
        url = service.start(needs_reranker=config.reranker)
        load = LoadConfig(
            url=url,
            duration_s=0.0,
            request_timeout_s=args.request_timeout_s,
            max_in_flight=args.max_in_flight,
            arrival_seed=args.arrival_seed,
            ttft_budget_ms=round(slo_ms),
            keep_answers=True,
        )
        logger.info("measuring config=%s slo_ms=%g rates=%s", config.name, slo_ms, args.rates)
        return asyncio.run(
            _measure(load, work, args.rates, args.arrivals, checkpoint, lambda: flush_cache(sglang))
        )
    finally:
        service.stop()


def summarize_run(
    slo_ms: float,
    rates: Sequence[float],
    judged: dict[str, dict[float, list[Arrival]]],
    configs: Sequence[Configuration],
) -> dict[str, Any]:
    fixed = [c.name for c in configs if not c.planner]
    planner = next((c.name for c in configs if c.planner), None)
    comparison = {
        f"{rate:g}": {
            **rate_comparison({n: judged[n][rate] for n in judged}, fixed, planner),
            **{
                f"{c.name}_vs_best_fixed": rate_comparison(
                    {n: judged[n][rate] for n in judged}, fixed, c.name
                ).get("planner_vs_best_fixed")
                for c in configs
                if c.planner and c.name != planner
            },
        }
        for rate in rates
    }
    return {
        "slo_ms": slo_ms,
        "commit": measured_at(),
        "rates": list(rates),
        "configurations": {
            c.name: {
                "definition": asdict(c),
                "per_rate": {f"{r:g}": level_quality(judged[c.name][r]) for r in rates},
            }
            for c in configs
        },
        "comparison": comparison,
    }


def print_run(run: dict[str, Any]) -> None:
    print(f"TTFT SLO {run['slo_ms']:g} ms")
    print("config              rate   Q_c  attain recall abstain refused  forms")
    for name, result in run["configurations"].items():
        for rate, q in result["per_rate"].items():
            forms = " ".join(f"{f}:{s:.2f}" for f, s in q["mode_mix"].items())
            print(
                f"{name:18} {rate:>5} {q['quality_within_slo']:.3f}  {q['attainment']:.3f}"
                f"  {q['answer_recall'] or 0:.3f}  {q['abstention']:.3f}   {q['refused']:.3f}"
                f"  {forms}"
            )
    for rate, c in run["comparison"].items():
        gain = c.get("planner_vs_best_fixed") or {}
        print(
            f"rate {rate}: envelope {c['envelope']:.3f} ({c['best_fixed']}), oracle"
            f" {c['oracle']:.3f}, planner {c.get('planner', float('nan')):.3f}, gain"
            f" {gain.get('gain', float('nan')):+.3f}"
            f" [{gain.get('ci95_low', float('nan')):+.3f}, {gain.get('ci95_high', float('nan')):+.3f}]"
        )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m eval.bench.planner_quality_slo",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--rates", type=positive_numbers, required=True, help="Poisson rates, req/s"
    )
    parser.add_argument(
        "--slos", type=positive_numbers, default=positive_numbers("3000,500"), help="TTFT ms"
    )
    parser.add_argument("--arrivals", type=int, default=ARRIVALS, help="per configuration, rate")
    parser.add_argument(
        "--configs", type=named(CONFIGURATIONS), default=named(CONFIGURATIONS)(DEFAULT_CONFIGS)
    )
    parser.add_argument("--questions", type=Path, default=SQUAD_DIR / "questions.jsonl")
    parser.add_argument("--passages", type=Path, default=SQUAD_DIR / "passages.jsonl")
    parser.add_argument("--part", choices=PARTS, default="evaluation", help="questions measured")
    parser.add_argument("--seed", type=int, default=0, help="question order and removals")
    parser.add_argument("--removed-share", type=float, default=0.2, help="gold passages removed")
    parser.add_argument("--warmup", type=int, default=3, help="questions asked before a sweep")
    parser.add_argument("--arrival-seed", type=int, default=0)
    add_stack_options(parser)
    return parser


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    # Read now: the commit of the code this run loaded, whatever is committed while it runs.
    measured_at()
    args.service_env = dict(args.service_env)
    configs: list[Configuration] = args.configs
    work = workload(args.questions, args.seed, args.removed_share, args.warmup, args.part)
    corpus = corpus_without(args.passages, work.removed, CACHE / "corpora")
    embedder = SentenceTransformerEmbedder(EmbedderConfig(model=DEFAULT_EMBEDDER))
    index_dir = index_of(corpus, None, embedder)
    scratch = Path(tempfile.mkdtemp(prefix="planner-quality-slo-"))
    logger.info("logs of the servers in %s", scratch)
    stack = SGLangStack(scratch, args.max_total_tokens, args.cpu_threads)
    checkpoints = {
        (slo, c.name): RunCheckpoint(
            args.out.with_name(f"{args.out.name}.{slo:g}.{c.name}"), _identity(args, c, slo)
        )
        for slo in args.slos
        for c in configs
    }
    measured: dict[tuple[float, str], dict[float, LevelRun]] = {}
    started = time.perf_counter()
    try:
        for slo in args.slos:
            for config in configs:
                key = (slo, config.name)
                measured[key] = measure(stack, index_dir, args, config, slo, work, checkpoints[key])
    except BaseException:
        for checkpoint in checkpoints.values():
            checkpoint.close()
        raise
    finally:
        stack.close()
    runs, lines = [], []
    for slo in args.slos:
        judged = {
            c.name: {
                rate: judged_level(
                    measured[(slo, c.name)][rate].records,
                    planned_arrivals(rate, args.arrivals, args.arrival_seed)[1],
                    work.golds,
                    slo,
                )
                for rate in args.rates
            }
            for c in configs
        }
        runs.append(summarize_run(slo, args.rates, judged, configs))
        lines += [
            arrival.line(slo, name, rate)
            for name, by_rate in judged.items()
            for rate, arrivals in by_rate.items()
            for arrival in arrivals
        ]
    write_result(
        args.out,
        "planner-quality-slo",
        {
            "command_line": args.command_line,
            **{
                k: (str(v) if isinstance(v, Path) else v)
                for k, v in vars(args).items()
                if k not in ("configs", "command_line")
            },
            "configs": [asdict(c) for c in configs],
            "index": str(index_dir),
            "wall_s": round(time.perf_counter() - started, 1),
        },
        {
            "questions_file": str(args.questions),
            "part": args.part,
            "questions": len(work.questions),
            "removed_gold_passages": len(work.removed),
            "removed_questions": sum(g.removed for g in work.golds.values()),
        },
        {"slos": args.slos, "rates": args.rates, "arrivals": args.arrivals},
        {"runs": runs, "requests": lines},
    )
    for checkpoint in checkpoints.values():
        checkpoint.finish()
    return runs


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    args.command_line = shlex.join(
        [".venv/bin/python", "-m", "eval.bench.planner_quality_slo", *argv]
    )
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    logging.getLogger("faiss.loader").setLevel(logging.WARNING)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    for result in run(args):
        print_run(result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
