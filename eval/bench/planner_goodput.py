"""The deadline planner's proof: goodput with a quality floor, fixed configurations against the
planner, side by side in one run, on the full stack (real SGLang on the CPU, SmolLM2).

    python -m eval.bench.planner_goodput --out docs/benchmarks/planner-goodput.json \\
        [--rates 0.1,0.2,0.3,0.45] [--duration-s 90] [--slo-ms 2000] \\
        [--configs deep,mid,shallow,planner] [--reranker MODEL_OR_FOLDER]

Configurations (each a separate `answer-service serve` with its own environment):
- `deep`: 5 passages, `mid`: 3, `shallow`: 1 (`ANSWER_PLANNER=false`);
- `planner`: `ANSWER_PLANNER=true`, up to 5 passages (admission quantile 0.9). The
  `planner_q50/_q60/_q75` and `planner_steady` variants went with the settings they set
  (issue 39; README.md, Changelog): their results stay in docs/benchmarks/.
No reranker weights can be had on these machines (../shared/notes/models-offline.md), so the
default configurations do not rerank; `deep_rerank` and `planner_rerank` add a rerank of 20
candidates with `--reranker` where a real one can be loaded.
Every answer is capped at `--max-new-tokens` (32). The service gets this process's environment
less its `ANSWER_` variables, plus the configuration's and any `--service-env KEY=VALUE`.

One SGLang worker serves every configuration. For each configuration: start the service, wait
for `/readyz` (and the reranker, where it is used), flush SGLang's cache, ask `--warmup`
questions one at a time with a generous budget (they are never measured), then sweep the
Poisson rates with the load engine (`eval/lib/load_engine.py`): the same arrival seed and the same seeded
question order for every configuration, each level on its own share of the questions,
`--cooldown-s` between levels. Every measured request carries `ttft_budget_ms` = the SLO. Each finished (configuration, rate) is
checkpointed beside the output, so a rerun resumes; a configuration whose levels are all done
is not started again. The metrics are defined in `eval/bench/quality_goodput.py`.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import logging
import os
import random
import shlex
import signal
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack, aclosing
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

from eval.bench.quality_goodput import (
    goodput_with_floor,
    level_summary,
    lowest_rate_quality,
    outcomes,
    quality_floor,
)
from eval.commands.answers import Question, read_questions
from eval.commands.main import index_of
from eval.lib.checkpoint import RunCheckpoint
from eval.lib.latency_stats import LevelRun, goodput_rps
from eval.lib.load_engine import (
    DedicatedClients,
    LoadConfig,
    LoadQuestion,
    RequestSlot,
    level_key,
    run_levels,
    send_request,
)
from eval.lib.paths import SQUAD_DIR
from eval.lib.results import write_result
from eval.lib.service_process import ServiceProcess, free_port
from generation.server.launch import SGLangServer, SGLangServerConfig, ensure_smollm2_model
from retrieval.embedder import DEFAULT_EMBEDDER, EmbedderConfig, SentenceTransformerEmbedder
from retrieval.rerank.base import DEFAULT_RERANKER

logger = logging.getLogger(__name__)

T = TypeVar("T")

WARMUP_BUDGET_MS = 30_000
WARMUP_TIMEOUT_S = 150.0

SQUAD = SQUAD_DIR


@dataclass(frozen=True, slots=True)
class ServiceConfig:
    """One way to run the service: fixed (`planner` False) or planned, with the passages and
    rerank depth it uses (fixed) or may use at most (planner); rerank depth 0 is no reranker,
    20 the service's own (its rerank depth is no longer a setting: README.md, Changelog)."""

    name: str
    planner: bool
    passages: int
    rerank_depth: int
    # Other `ANSWER_` settings of this configuration (a planner variant).
    settings: tuple[tuple[str, str], ...] = ()

    def environment(self, reranker: str, max_new_tokens: int) -> dict[str, str]:
        """The `ANSWER_` variables of this configuration."""
        return {
            "ANSWER_PLANNER": "true" if self.planner else "false",
            "ANSWER_DEFAULT_TOP_K": str(self.passages),
            "ANSWER_RERANKER_MODEL": reranker if self.rerank_depth else "",
            "ANSWER_MAX_NEW_TOKENS": str(max_new_tokens),
            **dict(self.settings),
        }


CONFIGS = {
    config.name: config
    for config in (
        ServiceConfig("deep", planner=False, passages=5, rerank_depth=0),
        ServiceConfig("mid", planner=False, passages=3, rerank_depth=0),
        ServiceConfig("shallow", planner=False, passages=1, rerank_depth=0),
        ServiceConfig("planner", planner=True, passages=5, rerank_depth=0),
        # Where a reranker with real weights can be loaded (--reranker), not on these machines:
        ServiceConfig("deep_rerank", planner=False, passages=5, rerank_depth=20),
        ServiceConfig("planner_rerank", planner=True, passages=5, rerank_depth=20),
    )
}
DEFAULT_CONFIGS = "deep,mid,shallow,planner"


def deepest_fixed(configs: Sequence[ServiceConfig]) -> ServiceConfig | None:
    """The fixed configuration doing the most work (rerank depth, then passages)."""
    fixed = [c for c in configs if not c.planner]
    return max(fixed, key=lambda c: (c.rerank_depth, c.passages), default=None)


def service_environment(
    base: dict[str, str], config: ServiceConfig, args: argparse.Namespace
) -> dict[str, str]:
    env = {key: value for key, value in base.items() if not key.startswith("ANSWER_")}
    # Each question is answered once per configuration: no answer may come from the cache.
    env["ANSWER_ANSWER_CACHE_TTL_S"] = "0"
    env.update(config.environment(args.reranker, args.max_new_tokens))
    env.update(args.service_env)
    return env


def split_questions(path: Path, seed: int, warmup: int) -> tuple[list[Question], list[Question]]:
    """(warm-up, measured): the answerable questions in one seeded order; the first `warmup`
    only warm the service up and are never measured."""
    questions = [q for q in read_questions(path) if q.answers]
    random.Random(seed).shuffle(questions)
    return questions[:warmup], questions[warmup:]


def flush_cache(url: str, tries: int = 60) -> None:
    """Empty SGLang's prefix cache (so no level starts on what an earlier one cached). SGLang
    answers 400 while it still holds requests (the tail of a level's last answers): try again
    once a second, and go on unflushed, saying so, after `tries`."""
    request = urllib.request.Request(f"{url}/flush_cache", method="POST")
    for _ in range(tries):
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                response.read()
            return
        except urllib.error.HTTPError as exc:
            if exc.code != 400:
                raise
        time.sleep(1.0)
    logger.warning("SGLang cache not flushed: requests still running after %d s", tries)


async def _measure(
    load: LoadConfig,
    warmup: Sequence[Question],
    questions: Sequence[LoadQuestion],
    rates: Sequence[float],
    checkpoint: RunCheckpoint,
) -> list[LevelRun]:
    # The warm-up is there to get every code path (SGLang's first prefills above all) run
    # once, so it is given the time to finish rather than the SLO.
    patient = replace(load, ttft_budget_ms=WARMUP_BUDGET_MS, request_timeout_s=WARMUP_TIMEOUT_S)
    async with aclosing(DedicatedClients(load)) as clients:
        statuses = []
        for question in warmup:
            slot = RequestSlot(LoadQuestion(question.question_id, question.question), 0.0)
            record = await send_request(clients, patient, slot)
            statuses.append(record.status)
            logger.info(
                "warm-up request status=%s ttft_ms=%s error=%s",
                record.status,
                record.client_ttft_ms,
                record.error_code,
            )
        if warmup and "ok" not in statuses:
            logger.warning("no warm-up request finished ok statuses=%s", statuses)
        return await run_levels(
            clients, load, questions, "rate", rates, checkpoint, progress=sys.stderr.isatty()
        )


def _identity(args: argparse.Namespace, config: ServiceConfig, index_dir: Path) -> dict[str, Any]:
    """What makes a measured level reusable (the rates are left out, as in `answer-eval load`)."""
    return {
        "command": "planner-goodput",
        "config": asdict(config),
        "questions": hashlib.sha256(args.questions.read_bytes()).hexdigest(),
        "index": str(index_dir),
        "seed": args.seed,
        "warmup": args.warmup,
        "arrival_seed": args.arrival_seed,
        "duration_s": args.duration_s,
        "slo_ms": args.slo_ms,
        "max_new_tokens": args.max_new_tokens,
        "request_timeout_s": args.request_timeout_s,
        "max_in_flight": args.max_in_flight,
        "reranker": args.reranker,
        "service_env": args.service_env,
    }


class Bench:
    """The run's processes: one SGLang worker, a service per configuration; `close` stops
    everything it started."""

    def __init__(self, args: argparse.Namespace, index_dir: Path, scratch: Path) -> None:
        self.args = args
        self.index_dir = index_dir
        self.scratch = scratch
        self.stack = ExitStack()
        self._sglang: SGLangServer | None = None

    def sglang_url(self) -> str:
        """SGLang's URL, started on first use (a fully checkpointed run starts nothing)."""
        if self._sglang is None:
            model_dir = ensure_smollm2_model(SGLangServerConfig().cache_dir)
            self._sglang = SGLangServer(
                SGLangServerConfig(
                    port=free_port(),
                    device="cpu",
                    model_dir=model_dir,
                    max_total_tokens=self.args.max_total_tokens,
                    cpu_threads=self.args.cpu_threads,
                    log_path=self.scratch / "sglang.log",
                )
            )
            self.stack.callback(self._sglang.stop)
            self._sglang.start()
        return self._sglang.url

    def measure(self, config: ServiceConfig, checkpoint: RunCheckpoint) -> list[LevelRun]:
        args = self.args
        rates: list[float] = args.rates
        if all(level_key("rate", rate) in checkpoint.done for rate in rates):
            return [LevelRun.from_json(checkpoint.done[level_key("rate", r)]) for r in rates]
        sglang_url = self.sglang_url()
        service = ServiceProcess(
            config.name,
            port=free_port(),
            index_dir=self.index_dir,
            sglang_url=sglang_url,
            env=service_environment(dict(os.environ), config, args),
            scratch=self.scratch,
        )
        try:
            url = service.start(needs_reranker=config.rerank_depth > 0)
            flush_cache(sglang_url)
            load = LoadConfig(
                url=url,
                duration_s=args.duration_s,
                request_timeout_s=args.request_timeout_s,
                max_in_flight=args.max_in_flight,
                arrival_seed=args.arrival_seed,
                ttft_budget_ms=round(args.slo_ms),
                cooldown_s=args.cooldown_s,
                keep_answers=True,
            )
            warmup, measured = split_questions(args.questions, args.seed, args.warmup)
            questions = [LoadQuestion(q.question_id, q.question) for q in measured]
            logger.info("measuring config=%s url=%s rates=%s", config.name, url, rates)
            return asyncio.run(_measure(load, warmup, questions, rates, checkpoint))
        finally:
            service.stop()

    def close(self) -> None:
        self.stack.close()


def summarize(
    runs: dict[str, list[LevelRun]],
    configs: Sequence[ServiceConfig],
    golds: dict[str, tuple[str, ...]],
    slo_ms: float,
) -> dict[str, Any]:
    """Per configuration its levels and goodput; the floor from the deepest fixed one."""
    levels = {
        name: [level_summary(run, slo_ms, golds) for run in sorted(found, key=lambda r: r.level)]
        for name, found in runs.items()
    }
    deepest = deepest_fixed(configs)
    floor_from: dict[str, Any] | None = None
    floor = None
    if deepest is not None and levels.get(deepest.name):
        rate, quality = lowest_rate_quality(levels[deepest.name])
        floor = quality_floor(quality)
        floor = None if floor is None else round(floor, 4)
        floor_from = {"config": deepest.name, "rate": rate, "quality_answered": quality}
    results: dict[str, Any] = {}
    for config in configs:
        mine = levels[config.name]
        attained = [(level["rate"], level["slo_attainment"]) for level in mine]
        results[config.name] = {
            "goodput_rps": goodput_with_floor(outcomes(mine), floor),
            "goodput_rps_slo_only": goodput_rps(attained),
            "definition": asdict(config),
            "levels": mine,
        }
    fixed_best = max(
        (results[c.name]["goodput_rps"] for c in configs if not c.planner), default=0.0
    )
    planner = results.get("planner", {}).get("goodput_rps")
    return {
        "floor": floor,
        "floor_from": floor_from,
        "configs": results,
        "planner_goodput_vs_best_fixed": (
            round(planner / fixed_best, 3) if planner is not None and fixed_best else None
        ),
    }


def print_table(summary: dict[str, Any], slo_ms: float) -> None:
    floor = summary["floor"]
    print(f"TTFT SLO {slo_ms:g} ms, quality floor {floor if floor is not None else '-'}")
    header = "config    rate  attain  q_ans  q_all  ok/sent  rej  err  p50_ms  p95_ms  psg  rrk"
    print(header)

    def cell(value: Any, spec: str) -> str:
        return "-" if value is None else format(value, spec)

    for name, result in summary["configs"].items():
        for lv in result["levels"]:
            print(
                f"{name:8} {lv['rate']:5g}  {cell(lv['slo_attainment'], '.3f'):>6}"
                f"  {cell(lv['quality_answered'], '.3f'):>5}  {cell(lv['quality_all'], '.3f'):>5}"
                f"  {lv['ok']:>3}/{lv['sent']:<3}  {lv['rejected']:>3}  {lv['errored']:>3}"
                f"  {cell(lv['ttft_p50_ms'], '.0f'):>6}  {cell(lv['ttft_p95_ms'], '.0f'):>6}"
                f"  {cell(lv['mean_plan_passages'], '.1f'):>3}"
                f"  {cell(lv['mean_plan_rerank_depth'], '.1f'):>3}"
            )
    for name, result in summary["configs"].items():
        print(
            f"goodput {name}: {result['goodput_rps']:g} req/s with the floor"
            f" ({result['goodput_rps_slo_only']:g} on the SLO alone)"
        )


def positive_numbers(text: str) -> list[float]:
    """`A,B,C` as sorted distinct positive numbers (an argparse type)."""
    values = sorted({float(part) for part in text.split(",") if part.strip()})
    if not values or values[0] <= 0:
        raise argparse.ArgumentTypeError(f"expected positive numbers: {text!r}")
    return values


def named(registry: Mapping[str, T]) -> Callable[[str], list[T]]:
    """An argparse type: `a,b` as the registry's entries of those names, in that order."""

    def parse(text: str) -> list[T]:
        names = [part.strip() for part in text.split(",") if part.strip()]
        unknown = [name for name in names if name not in registry]
        if unknown or not names:
            raise argparse.ArgumentTypeError(
                f"configurations are among {sorted(registry)}: {text!r}"
            )
        return [registry[name] for name in dict.fromkeys(names)]

    return parse


def assignment(text: str) -> tuple[str, str]:
    """`KEY=VALUE` (an argparse type)."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE: {text!r}")
    return key, value


def add_stack_options(parser: argparse.ArgumentParser) -> None:
    """The options of the stack a planner benchmark starts: request bounds, SGLang's cache and
    threads, and extra settings for every configuration's service."""
    parser.add_argument("--request-timeout-s", type=float, default=60.0)
    parser.add_argument("--max-in-flight", type=int, default=256)
    parser.add_argument("--max-total-tokens", type=int, default=16384, help="SGLang's KV cache")
    parser.add_argument("--cpu-threads", type=int, help="SGLang's torch threads (default: all)")
    parser.add_argument(
        "--service-env",
        type=assignment,
        action="append",
        default=[],
        help="KEY=VALUE for every configuration's service (repeatable)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m eval.bench.planner_goodput",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--rates", type=positive_numbers, default=positive_numbers("0.1,0.2,0.3,0.45")
    )
    parser.add_argument("--duration-s", type=float, default=90.0, help="seconds per level")
    parser.add_argument("--cooldown-s", type=float, default=10.0, help="pause between levels")
    parser.add_argument("--slo-ms", type=float, default=2000.0, help="TTFT objective")
    parser.add_argument("--configs", type=named(CONFIGS), default=named(CONFIGS)(DEFAULT_CONFIGS))
    parser.add_argument(
        "--reranker", default=DEFAULT_RERANKER, help="for deep_rerank and planner_rerank"
    )
    parser.add_argument("--questions", type=Path, default=SQUAD / "questions.jsonl")
    parser.add_argument("--passages", type=Path, default=SQUAD / "passages.jsonl")
    parser.add_argument("--index", type=Path, help="an index of --passages (else built)")
    parser.add_argument("--seed", type=int, default=0, help="shuffles the questions")
    parser.add_argument("--warmup", type=int, default=3, help="questions asked before a sweep")
    parser.add_argument("--arrival-seed", type=int, default=0)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    add_stack_options(parser)
    return parser


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Measure every configuration (resuming what the checkpoints hold), then summarize."""
    args.service_env = dict(args.service_env)
    configs: list[ServiceConfig] = args.configs
    embedder = SentenceTransformerEmbedder(EmbedderConfig(model=DEFAULT_EMBEDDER))
    index_dir = index_of(args.passages, args.index, embedder)
    scratch = Path(tempfile.mkdtemp(prefix="planner-goodput-"))
    logger.info("logs of the servers in %s", scratch)
    # One checkpoint per configuration, beside the output: `planner-goodput.json.deep.partial.jsonl`.
    checkpoints = {
        c.name: RunCheckpoint(
            args.out.with_name(f"{args.out.name}.{c.name}"), _identity(args, c, index_dir)
        )
        for c in configs
    }
    bench = Bench(args, index_dir, scratch)
    runs: dict[str, list[LevelRun]] = {}
    started = time.perf_counter()
    try:
        for config in configs:
            runs[config.name] = bench.measure(config, checkpoints[config.name])
    except BaseException:
        for checkpoint in checkpoints.values():
            checkpoint.close()
        raise
    finally:
        bench.close()
    warmup, measured = split_questions(args.questions, args.seed, args.warmup)
    golds = {q.question_id: q.answers for q in measured}
    summary = summarize(runs, configs, golds, args.slo_ms)
    records = {
        name: [r.to_json() for run in found for r in run.records] for name, found in runs.items()
    }
    asked = {r["question_id"] for found in records.values() for r in found}
    write_result(
        args.out,
        "planner-goodput",
        {
            **{
                k: (str(v) if isinstance(v, Path) else v)
                for k, v in vars(args).items()
                if k != "configs"
            },
            "configs": [asdict(c) for c in configs],
            "questions": str(args.questions),
            "passages": str(args.passages),
            "index": str(index_dir),
            "wall_s": round(time.perf_counter() - started, 1),
        },
        {
            "questions_file": str(args.questions),
            "questions": len(measured),
            "warmup_questions": len(warmup),
            "questions_asked": len(asked),
        },
        {
            "command_line": args.command_line,
            "slo_ms": args.slo_ms,
            "rates": args.rates,
            "duration_s": args.duration_s,
            "cooldown_s": args.cooldown_s,
            **summary,
        },
        {"requests": records},
    )
    for checkpoint in checkpoints.values():
        checkpoint.finish()
    return summary


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    args.command_line = shlex.join([".venv/bin/python", "-m", "eval.bench.planner_goodput", *argv])
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    logging.getLogger("faiss.loader").setLevel(logging.WARNING)
    # SIGTERM unwinds like Ctrl-C, so the service and SGLang started here are stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    summary = run(args)
    print_table(summary, args.slo_ms)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
