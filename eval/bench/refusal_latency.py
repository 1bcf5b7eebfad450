"""How fast a refused request is refused while the SGLang worker is busy: side by side in one
run, the service's HTTP server (uvloop + httptools, the default, or asyncio + h11) and the
worker's CPU priority.

Admission refuses before retrieval, so a refusal is little work: HTTP, the planner's decision
and the error response, on a process sharing two cores with SGLang's scheduler and torch
threads. One SGLang worker (SmolLM2, CPU) and one `answer-service serve` per server kind in the
arms; `--concurrency` clients keep asking the measured arm's service questions with a generous
budget (SGLang is never idle and that service's loop is busy streaming), while probes, one
every `--probe-gap-ms`, ask it with a budget no plan can make and are refused. An arm is
`SERVER:NICE[:SWITCH_MS]`; the arms alternate (A B C, C B A, ...) for `--rounds`, every
thread of the worker's process group reniced to the arm's NICE; SWITCH_MS is the service's
interpreter switch interval (`serve --gil-switch-ms`; default Python's 5 ms). Per arm: the
probes' client-side latency to the full refusal, and the TTFT of the answers that started in
it.

    python -m eval.bench.refusal_latency --out docs/benchmarks/refusal-latency.json \\
        [--arms uvloop:0,asyncio:0,uvloop:10] [--rounds 4] [--probes 100]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import random
import sys
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from eval.commands.main import index_of
from eval.lib.latency_stats import percentiles
from eval.lib.paths import SQUAD_DIR
from eval.lib.questions import read_questions
from eval.lib.stack import ServiceProcess, free_port
from generation.server.launch import SGLangServer, SGLangServerConfig, ensure_smollm2_model
from retrieval.embedder import EmbedderConfig, SentenceTransformerEmbedder

SQUAD = SQUAD_DIR
# Below what even an idle worker takes to a first token: refused at admission (422).
PROBE_BUDGET_MS = 1
ANSWER_BUDGET_MS = 60_000
SERVERS = ("uvloop", "asyncio")


def renice_group(pgid: int, nice: int) -> int:
    """Set the nice value of every thread of every process in `pgid`; how many were set."""
    count = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.getpgid(int(entry)) != pgid:
                continue
            for tid in os.listdir(f"/proc/{entry}/task"):
                os.setpriority(os.PRIO_PROCESS, int(tid), nice)
                count += 1
        except (ProcessLookupError, FileNotFoundError, PermissionError):
            continue
    return count


class Background:
    """`concurrency` clients asking questions back to back; each answer's (start, TTFT)."""

    def __init__(self, url: str, questions: list[str], concurrency: int) -> None:
        self.url = url  # the arm being measured: switched between arms
        self.questions = itertools.cycle(questions)
        self.concurrency = concurrency
        self.answers: list[tuple[float, float | None, int]] = []

    async def run(self, stop: asyncio.Event) -> None:
        async with httpx.AsyncClient(timeout=120.0) as client:
            await asyncio.gather(*(self._client(client, stop) for _ in range(self.concurrency)))

    async def _client(self, client: httpx.AsyncClient, stop: asyncio.Event) -> None:
        while not stop.is_set():
            body = {"query": next(self.questions), "ttft_budget_ms": ANSWER_BUDGET_MS}
            started = time.perf_counter()
            response = await client.post(f"{self.url}/v1/answer", json={**body, "stream": False})
            ttft = response.json()["done"]["ttft_ms"] if response.status_code == 200 else None
            self.answers.append((started, ttft, response.status_code))


async def probe(client: httpx.AsyncClient, url: str, query: str) -> tuple[float, int, str]:
    body = {"query": query, "ttft_budget_ms": PROBE_BUDGET_MS, "stream": False}
    started = time.perf_counter()
    response = await client.post(f"{url}/v1/answer", json=body)
    elapsed_ms = (time.perf_counter() - started) * 1000.0
    code = response.json().get("error", {}).get("code", "") if response.status_code >= 400 else ""
    return elapsed_ms, response.status_code, code


@dataclass(frozen=True, slots=True)
class Arm:
    server: str
    nice: int
    # The service's interpreter switch interval (None: Python's 5 ms).
    switch_ms: float | None = None

    @property
    def service(self) -> str:
        """The service process this arm measures (one per server kind and switch interval)."""
        return self.server if self.switch_ms is None else f"{self.server}-switch{self.switch_ms:g}"

    @property
    def name(self) -> str:
        switch = "" if self.switch_ms is None else f":{self.switch_ms:g}"
        return f"{self.server}:{self.nice}{switch}"


def parse_arms(text: str) -> list[Arm]:
    arms = []
    for part in text.split(","):
        try:
            server, nice, *switch = part.split(":")
            if server not in SERVERS or len(switch) > 1:
                raise ValueError(part)
            arms.append(Arm(server, int(nice), float(switch[0]) if switch else None))
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"an arm is SERVER:NICE[:SWITCH_MS], SERVER in {SERVERS}: {part}"
            ) from None
    return arms


async def measure(
    urls: dict[str, str], pgid: int, questions: list[str], args: argparse.Namespace
) -> dict[str, Any]:
    arms: list[Arm] = args.arms
    background = Background(urls[arms[0].service], questions, args.concurrency)
    stop = asyncio.Event()
    load = asyncio.create_task(background.run(stop))
    await asyncio.sleep(args.settle_s)  # the queue fills
    order = [arms if r % 2 == 0 else arms[::-1] for r in range(args.rounds)]
    probes: dict[Arm, list[tuple[float, int, str]]] = {a: [] for a in arms}
    windows: dict[Arm, list[tuple[float, float]]] = {a: [] for a in arms}
    async with httpx.AsyncClient(timeout=30.0) as client:
        for url in urls.values():
            await probe(client, url, questions[0])  # connections kept alive for every probe
        for arm in itertools.chain.from_iterable(order):
            renice_group(pgid, arm.nice)
            background.url = url = urls[arm.service]
            await asyncio.sleep(args.settle_s)
            started = time.perf_counter()
            for k in range(args.probes):
                probes[arm].append(await probe(client, url, questions[k % len(questions)]))
                await asyncio.sleep(args.probe_gap_ms / 1000.0)
            windows[arm].append((started, time.perf_counter()))
    stop.set()
    await load
    renice_group(pgid, 0)
    results = {}
    for arm in arms:
        answers = [
            (ttft, status)
            for started, ttft, status in background.answers
            if any(a <= started < b for a, b in windows[arm])
        ]
        results[arm.name] = {
            "server": arm.server,
            "sglang_nice": arm.nice,
            "gil_switch_ms": arm.switch_ms if arm.switch_ms is not None else 5.0,
            "probes": len(probes[arm]),
            "refusal_ms": percentiles([ms for ms, _, _ in probes[arm]]),
            "refusal_statuses": sorted({f"{status} {code}" for _, status, code in probes[arm]}),
            "answers": len(answers),
            "answers_ok": sum(status == 200 for _, status in answers),
            "answer_ttft_ms": percentiles([t for t, _ in answers if t is not None]),
        }
    return results


def run_summary(args: argparse.Namespace, arms: dict[str, Any], argv: list[str]) -> dict[str, Any]:
    """What the run writes: its command and settings, and the measured arms."""
    return {
        "command": " ".join([".venv/bin/python", "-m", "eval.bench.refusal_latency", *argv]),
        "config": {
            **{k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
            "arms": [arm.name for arm in args.arms],
        },
        "probe_budget_ms": PROBE_BUDGET_MS,
        "arms": arms,
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--index", type=Path, default=None, help="default: built in the cache")
    parser.add_argument("--passages", type=Path, default=SQUAD / "passages.jsonl")
    parser.add_argument("--questions", type=Path, default=SQUAD / "questions.jsonl")
    parser.add_argument(
        "--arms", type=parse_arms, default=parse_arms("uvloop:0,asyncio:0,uvloop:10")
    )
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--probes", type=int, default=100, help="per arm and round")
    parser.add_argument("--probe-gap-ms", type=float, default=100.0)
    parser.add_argument("--concurrency", type=int, default=3, help="answers kept in flight")
    parser.add_argument("--settle-s", type=float, default=3.0)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    embedder = SentenceTransformerEmbedder(EmbedderConfig())
    index_dir = index_of(args.passages, args.index, embedder)
    questions = [q.question for q in read_questions(args.questions) if q.answers]
    random.Random(args.seed).shuffle(questions)
    scratch = Path(tempfile.mkdtemp(prefix="refusal-latency-"))
    env = {key: value for key, value in os.environ.items() if not key.startswith("ANSWER_")}
    env.update(
        ANSWER_RERANKER_MODEL="",
        ANSWER_MAX_NEW_TOKENS=str(args.max_new_tokens),
        ANSWER_ANSWER_CACHE_TTL_S="0",
    )
    with ExitStack() as stack:
        sglang = SGLangServer(
            SGLangServerConfig(
                port=free_port(),
                device="cpu",
                model_dir=ensure_smollm2_model(SGLangServerConfig().cache_dir),
                log_path=scratch / "sglang.log",
            )
        )
        stack.callback(sglang.stop)
        sglang.start()
        pgid = int(sglang.pid_path.read_text())
        urls = {}
        for arm in {arm.service: arm for arm in args.arms}.values():
            switch = () if arm.switch_ms is None else ("--gil-switch-ms", f"{arm.switch_ms:g}")
            service = ServiceProcess(
                arm.service,
                port=free_port(),
                index_dir=index_dir,
                sglang_url=sglang.url,
                env=env,
                scratch=scratch,
                extra_args=("--server", arm.server, *switch),
            )
            stack.callback(service.stop)
            urls[arm.service] = service.start(needs_reranker=False)
        arms = asyncio.run(measure(urls, pgid, questions, args))
    summary = run_summary(args, arms, argv or sys.argv[1:])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
