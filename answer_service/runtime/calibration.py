"""The planner's stage models measured where the service runs, before it is ready.

The priors in `budget/planner.py` were measured on one kind of machine (2 CPU cores); on a GPU
or a faster CPU they overstate every stage, and requests the hardware could serve are refused.
At warm-up the service times each stage on the machine and model it serves: embedding queries
of a few lengths, searching at two depths, scoring the sentences of what was found, laying out
prompts of what was found with one to five passages, and on each
SGLang worker the first token of prompts of a few sizes that share no cached prefix. The stage
models then take those timings as their priors (`StageModels.settle`) and keep learning online
as before. Each worker's generation slots follow what it batches: uncached prompts sent 1, 2,
4, ... at once, for as long as each doubling still raises throughput (budget/concurrency.py).
The reranker loads after the service is ready; when it attaches, `calibrate_rerank` times it
at two depths the same way before requests are sent to it. A stage that could not be measured
keeps its shipped prior, and the log says which.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

from opentelemetry import trace

from answer_service.pipeline.planning import RequestPlanning
from answer_service.pipeline.probe import first_token_of, time_first_token
from answer_service.pipeline.stage_runner import StageRunner
from answer_service.pipeline.values import context_passages
from budget import Deadline
from budget.concurrency import SlotChoice, slots_from_timings
from budget.planner import PlanInput, query_tokens
from budget.stage import StageRun
from generation.client import GenerationClient
from generation.errors import GenerationError
from generation.prefix_order import PrefixTree
from generation.stages import PromptRequest, PromptStage
from retrieval.errors import RetrievalError
from retrieval.passage import Passage, ScoredPassage
from retrieval.rerank.base import RerankRequest
from retrieval.retriever import Retriever
from retrieval.stages import SentenceRequest

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class CalibrationConfig:
    enabled: bool = True
    # The search mode requests use (what is timed).
    mode: str = "hybrid"
    # Queries timed through embed, search and sentence scoring (built from the index's titles).
    queries: int = 6
    search_depths: tuple[int, ...] = (5, 20)
    # Candidates per rerank timed when a reranker attaches (on the deepest search's results).
    rerank_depths: tuple[int, ...] = (5, 20)
    # Passages per prompt whose layout is timed (on each query's first search results).
    prompt_passages: tuple[int, ...] = (1, 3, 5)
    # Prompt sizes (words of passage text) whose first token is timed on each worker.
    prompt_words: tuple[int, ...] = (30, 150, 450)
    # The whole calibration's bound; what is not measured by then keeps its prior.
    timeout_s: float = 60.0
    # Generation slots per worker from what it batches (budget/concurrency.py): prompts of
    # `slot_prompt_words` words sent 1, 2, 4, ... at once, up to `max_slots`; None: the
    # configured slots stand.
    max_slots: int | None = 16
    slot_prompt_words: int = 150
    slot_min_gain: float = 1.25


@dataclass(frozen=True, slots=True)
class Calibrated:
    # The typical time to a first token of the smallest plan on an idle worker.
    floor_ms: float
    # The stage models whose priors are now this machine's timings (`first_token@<worker>`
    # per worker); the others keep the shipped priors.
    stages: tuple[str, ...]


async def calibrate(
    planning: RequestPlanning,
    retriever: Retriever,
    workers: Sequence[GenerationClient],
    config: CalibrationConfig,
    prompts: PromptStage | None = None,
) -> Calibrated:
    """Time each stage here, make the timings the stage models' priors, and return the
    calibrated floor and the stages measured. `prompts`: the pipeline's prompt layout (None: the
    prompt stage keeps its prior)."""
    deadline = Deadline.after_ms(config.timeout_s * 1000.0)
    try:
        await asyncio.wait_for(
            _measure(planning, retriever, workers, config, deadline, prompts), config.timeout_s
        )
    except (TimeoutError, RetrievalError, GenerationError) as exc:
        logger.warning("stage calibration cut short, the rest keeps its prior error=%s", exc)
    settled = planning.models.settle()
    floor_ms = calibrated_floor_ms(planning)
    logger.info(
        "stages calibrated here settled=%s floor_ms=%.0f kept_prior=%s",
        ",".join(settled) or "none",
        floor_ms,
        ",".join(sorted(_unmeasured(settled, workers))) or "none",
    )
    return Calibrated(floor_ms, tuple(settled))


async def calibrate_rerank(
    planning: RequestPlanning, retriever: Retriever, config: CalibrationConfig
) -> bool:
    """Time `retriever`'s reranker here at each of `rerank_depths` on a few queries and make
    that the rerank model's prior; False (the shipped prior stands) when it could not be."""
    stage = retriever.rerank
    if stage is None:
        return False
    deadline = Deadline.after_ms(config.timeout_s * 1000.0)
    runner = _runner(planning)
    mode = retriever.serving_mode(config.mode)
    try:
        async with asyncio.timeout(config.timeout_s):
            for query in _queries(_sampled(retriever, min(config.queries, 3))):
                depth = max(config.rerank_depths)
                found = await retriever.retrieve(query, depth, deadline, mode=mode)
                for n in config.rerank_depths:
                    request = RerankRequest(query, found.passages[:n], min(n, 5), found.vector)
                    await runner.measure(stage, request, deadline)
    except (TimeoutError, RetrievalError) as exc:
        logger.warning("rerank calibration cut short, it keeps its prior error=%s", exc)
    settled = planning.models.model("rerank").settle()
    logger.info("rerank calibrated here=%s model=%s", settled, stage.reranker.name)
    return settled


def _runner(planning: RequestPlanning) -> StageRunner:
    """The requests' runner: each stage timed here teaches the planner's model of it as a
    request's would (the warm-up's spans go nowhere)."""
    return StageRunner(trace.NoOpTracer(), planning)


def _sampled(retriever: Retriever, count: int) -> list[Passage]:
    """`count` passages spread over the index."""
    index = retriever.index
    rows = range(0, len(index), max(1, len(index) // max(count, 1)))
    return [index.passage(row) for row in rows][:count]


def _queries(passages: Sequence[Passage]) -> list[str]:
    """Questions of growing length from the passages' own words."""
    out = []
    for number, passage in enumerate(passages):
        words = f"{passage.title} {passage.text}".split()[: 4 + 4 * number]
        out.append("What does " + " ".join(words) + " mean?")
    return out


def calibrated_floor_ms(planning: RequestPlanning, worker: str = "") -> float:
    """The idle floor of a typical request (a ten-word question, five sources, one passage to
    the model): what `ttft_budget_ms` must at least allow for a generated answer."""
    request = PlanInput(
        remaining_ms=0.0,
        query_tokens=query_tokens("a question of about ten words asked of the service"),
        max_passages=5,
        reranker=False,
        worker=worker or planning.gate.least_loaded(),
    )
    return planning.planner.idle_floor_ms(request)


async def _measure(
    planning: RequestPlanning,
    retriever: Retriever,
    workers: Sequence[GenerationClient],
    config: CalibrationConfig,
    deadline: Deadline,
    prompts: PromptStage | None,
) -> None:
    passages = _sampled(retriever, config.queries)
    mode = retriever.serving_mode(config.mode)
    run = _runner(planning).measure
    for query in _queries(passages):
        vector = (await run(retriever.embed, query, deadline)).value
        found: list[ScoredPassage] = []
        for depth in config.search_depths:
            result = await retriever.retrieve(
                query, depth, deadline, mode=mode, vector=vector, run=run
            )
            found = found or result.passages
        if found:
            await run(retriever.sentences, SentenceRequest(query, vector, found[:5]), deadline)
            if prompts is not None:
                await _time_prompts(run, prompts, query, found, config, deadline)
    text = " ".join(p.text for p in passages).split()
    for worker in workers:
        for size in config.prompt_words:
            await time_first_token(planning, worker, " ".join(text[:size]), deadline)
    if config.max_slots is not None:
        prompt = " ".join(text[: config.slot_prompt_words])
        for worker in workers:
            choice = await measure_slots(worker, prompt, config, deadline)
            planning.gate.set_capacity(worker.base_url, choice.slots)
            logger.info(
                "generation slots measured worker=%s slots=%d prompts_per_s=%s why=%s",
                worker.base_url,
                choice.slots,
                {n: round(t, 2) for n, t in choice.throughput.items()},
                choice.reason,
            )


async def _time_prompts(
    run: StageRun,
    prompts: PromptStage,
    query: str,
    found: Sequence[ScoredPassage],
    config: CalibrationConfig,
    deadline: Deadline,
) -> None:
    """The prompt layout of `found` with each of `prompt_passages` passages (a tree of its own,
    so no worker's remembered prefixes change)."""
    context = context_passages(found)
    for most in config.prompt_passages:
        if most > len(context):
            break
        await run(prompts, PromptRequest(query, context, most, PrefixTree()), deadline)


async def measure_slots(
    worker: GenerationClient, text: str, config: CalibrationConfig, deadline: Deadline
) -> SlotChoice:
    """How many prefills `worker` runs well at once: 1, 2, 4, ... uncached prompts of `text`
    sent together (the faster of two tries each), until a doubling stops paying."""
    assert config.max_slots is not None
    timings: dict[int, float] = {}
    at_once = 1
    while at_once <= config.max_slots:
        tries = [await _all_first_tokens_ms(worker, text, at_once, deadline) for _ in range(2)]
        timings[at_once] = min(tries)
        choice = slots_from_timings(timings, config.slot_min_gain)
        if choice.slots < at_once:
            return choice
        at_once *= 2
    return slots_from_timings(timings, config.slot_min_gain)


async def _all_first_tokens_ms(
    worker: GenerationClient, text: str, at_once: int, deadline: Deadline
) -> float:
    """Milliseconds until each of `at_once` uncached prompts sent together had a first token
    (not learned by the first-token model: each waited for the others)."""
    started_s = time.perf_counter()
    timed = await asyncio.gather(*(first_token_of(worker, text, deadline) for _ in range(at_once)))
    if any(t is None for t in timed):
        raise GenerationError("a prompt of the concurrency measurement had no first token")
    return (time.perf_counter() - started_s) * 1000.0


def _unmeasured(settled: Sequence[str], workers: Sequence[GenerationClient]) -> set[str]:
    wanted = {"embed", "search", "sentences", "prompt"}
    wanted |= {f"first_token@{w.base_url}" for w in workers}
    return wanted - set(settled)
