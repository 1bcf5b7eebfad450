"""The load engine of `answer-eval load`: drive `POST {url}/v1/answer` and time every stream.

Two ways to apply load, one level at a time:
- open loop (`run_open_loop`): Poisson arrivals at `rate_rps` for `duration_s` (exponential
  gaps from a seeded RNG, planned up front). An arrival is sent when its time comes, whatever is
  still outstanding, up to `max_in_flight`; arrivals over that cap are recorded as `dropped`
  (never sent). After the duration nothing more is sent and the outstanding requests are
  awaited, each bounded by `request_timeout_s`, so a level lasts at most
  `duration_s + request_timeout_s`;
- closed loop (`run_closed_loop`): `concurrency` workers, each sending its next request as soon
  as the previous one ends, until the duration is over.

`run_levels` runs a sweep, level by level, and checkpoints each finished level: a resumed run
does not repeat a level it finished. The questions keep one order (the file's, or a seeded
shuffle); level i of n starts at question i x len/n, so no level asks what an earlier level
asked (that answer would come from SGLang's prefix cache and flatter the later level).

Each request in flight holds a keep-alive connection of its own (`DedicatedClients`), so it
never queues for one on the client side. No redirects, no proxies from the environment: the
requests go to the given URL and nowhere else. Client TTFT runs from the moment a request is
handed to its client to the first `token` event. A `plan` event's choices (rerank depth,
passages, retrieval depth, cuts) and the `done` event's answer form are kept in the record; the
answer text (the `token` events joined) only with `LoadConfig.keep_answers`, for scoring. Other
events (`citation`, ...) are ignored. The statistics are in `eval/lib/latency_stats.py`.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol, TypeVar

import anyio.lowlevel
import httpx
import numpy as np
from tqdm import tqdm

from answer_service.cli.sse_client import iter_events
from eval.lib.checkpoint import RunCheckpoint
from eval.lib.latency_stats import LevelKind, LevelRun, RequestRecord, Status, counts
from eval.lib.load_events import DoneStats, PlanChoices
from eval.lib.questions import Question

logger = logging.getLogger(__name__)

T = TypeVar("T")

OnRecord = Callable[[RequestRecord], None]
EventHooks = Mapping[str, list[Callable[..., Any]]]


@dataclass(frozen=True, slots=True)
class LoadConfig:
    url: str
    duration_s: float
    request_timeout_s: float = 60.0
    max_in_flight: int = 256
    arrival_seed: int = 0
    ttft_budget_ms: int | None = None
    top_k: int | None = None
    # Sent with each request (quote, focused, passages, auto); None: the service's default.
    answer_mode: str | None = None
    cooldown_s: float = 0.0
    # Keep each answer's text in its record (to score it); off, the records stay small.
    keep_answers: bool = False

    @property
    def answer_url(self) -> str:
        return f"{self.url.rstrip('/')}/v1/answer"


def poisson_arrivals(rate_rps: float, duration_s: float, seed: int) -> list[float]:
    """Arrival offsets in [0, duration_s) of a Poisson process of `rate_rps`, reproducible from
    `seed` and the rate (each level of a sweep gets its own stream)."""
    rng = np.random.default_rng([seed, round(rate_rps * 1_000_000)])
    arrivals: list[float] = []
    now = 0.0
    while True:
        now += float(rng.exponential(1.0 / rate_rps))
        if now >= duration_s:
            return arrivals
        arrivals.append(now)


class HttpClients(Protocol):
    """Where a request gets the `httpx.AsyncClient` it is sent with."""

    def lease(self) -> AbstractAsyncContextManager[httpx.AsyncClient]: ...

    async def aclose(self) -> None: ...


def _client(config: LoadConfig, connections: int, **options: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        timeout=httpx.Timeout(config.request_timeout_s),
        limits=httpx.Limits(max_connections=connections, max_keepalive_connections=connections),
        follow_redirects=False,
        trust_env=False,
        **options,
    )


class DedicatedClients:
    """One single-connection client per request in flight, reused most recent first.

    httpcore 1.0.9's shared pool hands one idle HTTP/1.1 connection to every request queued in
    the same pass; the losers retry, and after a burst requests wait for seconds while the pool
    opens no new connection (encode/httpcore#1035, fixed in the pydantic/httpx2 fork by #1075).
    That wait would be counted as the service's TTFT. Here a request takes a client nobody
    else holds; the in-flight cap bounds how many there are. They share one TLS context.
    """

    def __init__(self, config: LoadConfig, event_hooks: EventHooks | None = None) -> None:
        self._config = config
        self._event_hooks = event_hooks
        self._idle: list[httpx.AsyncClient] = []
        self._all: list[httpx.AsyncClient] = []
        # Loading the CA bundle takes tens of ms: once, here, not in a first request's TTFT,
        # and only where TLS is used.
        self._tls = httpx.create_ssl_context(verify=config.answer_url.startswith("https://"))

    @asynccontextmanager
    async def lease(self) -> AsyncIterator[httpx.AsyncClient]:
        http = self._idle.pop() if self._idle else self._new()
        try:
            yield http
        finally:
            self._idle.append(http)

    def _new(self) -> httpx.AsyncClient:
        http = _client(self._config, 1, verify=self._tls, event_hooks=self._event_hooks)
        self._all.append(http)
        return http

    @property
    def size(self) -> int:
        """How many clients (so connections, at most) it has made."""
        return len(self._all)

    async def aclose(self) -> None:
        for http in self._all:
            await http.aclose()


async def warm_up() -> None:
    """Import what httpx imports on its first request (anyio's asyncio backend, tens of ms),
    so that cost does not land in the first request's TTFT."""
    await anyio.lowlevel.checkpoint()


@dataclass(frozen=True, slots=True)
class RequestSlot:
    """Where a request sits in its level: which level, which question, when it was due."""

    question: Question
    level_start_s: float
    rate_rps: float | None = None
    concurrency: int | None = None
    planned_offset_s: float | None = None

    def record(self, status: Status, at_s: float, **fields: Any) -> RequestRecord:
        return RequestRecord(
            question_id=self.question.question_id,
            status=status,
            start_offset_s=at_s - self.level_start_s,
            rate_rps=self.rate_rps,
            concurrency=self.concurrency,
            planned_offset_s=self.planned_offset_s,
            **fields,
        )


def _error_code(response: httpx.Response) -> str | None:
    try:
        body = response.json()
    except ValueError:
        return None
    error = body.get("error") if isinstance(body, dict) else None
    code = error.get("code") if isinstance(error, dict) else None
    return code if isinstance(code, str) else None


async def send_request(
    clients: HttpClients, config: LoadConfig, slot: RequestSlot
) -> RequestRecord:
    """One request, start to end of its stream, bounded by `request_timeout_s`; never raises
    for what the service or the network does (that becomes the record's status)."""
    body: dict[str, Any] = {"query": slot.question.question, "stream": True}
    if config.ttft_budget_ms is not None:
        body["ttft_budget_ms"] = config.ttft_budget_ms
    if config.top_k is not None:
        body["top_k"] = config.top_k
    if config.answer_mode is not None:
        body["answer_mode"] = config.answer_mode
    sent_s = time.perf_counter()
    token_times: list[float] = []
    http_status: int | None = None
    error_code: str | None = None
    done: DoneStats | None = None
    plan: PlanChoices | None = None
    answer: list[str] | None = [] if config.keep_answers else None
    status: Status = "ok"
    try:
        async with (
            asyncio.timeout(config.request_timeout_s),
            clients.lease() as http,
            http.stream("POST", config.answer_url, json=body) as response,
        ):
            http_status = response.status_code
            if response.status_code != 200:
                await response.aread()
                error_code = _error_code(response)
                retry = "retry-after" in response.headers
                status = "rejected" if response.status_code in (429, 503) and retry else "error"
            else:
                async for event in iter_events(response):
                    if event.event == "token":
                        token_times.append(time.perf_counter())
                        if answer is not None:
                            answer.append(str(event.data.get("text", "")))
                    elif event.event == "plan":
                        plan = PlanChoices.model_validate(event.data)
                    elif event.event == "error":
                        status, error_code = "error", str(event.data.get("code", "error"))
                    elif event.event == "done":
                        done = DoneStats.model_validate(event.data)
                if done is None and status == "ok":
                    status, error_code = "error", "stream_ended_without_done"
    except (TimeoutError, httpx.TimeoutException):
        status = "timeout"
    except httpx.HTTPError as exc:
        status, error_code = "error", type(exc).__name__
    except ValueError:  # a malformed event: bad JSON, a `done` or `plan` failing validation
        status, error_code = "error", "malformed_event"
    ended_s = time.perf_counter()
    kept = answer is not None and status == "ok"
    short = done.short_answer if kept and done and done.short_answer else None
    return slot.record(
        status,
        sent_s,
        http_status=http_status,
        error_code=error_code,
        client_ttft_ms=(token_times[0] - sent_s) * 1000.0 if token_times else None,
        server_ttft_ms=done.ttft_ms if done else None,
        e2e_ms=(ended_s - sent_s) * 1000.0,
        itl_ms=tuple((b - a) * 1000.0 for a, b in itertools.pairwise(token_times)),
        prompt_tokens=done.prompt_tokens if done else None,
        cached_tokens=done.cached_tokens if done else None,
        completion_tokens=done.completion_tokens if done else None,
        outcome=done.outcome if done else None,
        stages_ms=done.stages_ms() if done else (),
        passages_in_prompt=done.passages_in_prompt if done else None,
        form=done.form if done else None,
        wasted_prefill_tokens=done.wasted_prefill_tokens if done else None,
        answer="".join(answer) if answer is not None and kept else None,
        short_answer=None if short is None else str(short["text"]),
        **(plan.fields() if plan else {}),
    )


async def run_open_loop(
    clients: HttpClients,
    config: LoadConfig,
    questions: Sequence[Question],
    rate_rps: float,
    on_record: OnRecord | None = None,
) -> LevelRun:
    arrivals = poisson_arrivals(rate_rps, config.duration_s, config.arrival_seed)
    records: list[RequestRecord] = []
    in_flight = 0

    def keep(record: RequestRecord) -> None:
        records.append(record)
        if on_record is not None:
            on_record(record)

    async def one(slot: RequestSlot) -> None:
        nonlocal in_flight
        try:
            keep(await send_request(clients, config, slot))
        finally:
            in_flight -= 1

    start_s = time.perf_counter()
    async with asyncio.TaskGroup() as group:
        for number, planned_s in enumerate(arrivals):
            slot = RequestSlot(
                questions[number % len(questions)], start_s, rate_rps, None, planned_s
            )
            if (delay_s := start_s + planned_s - time.perf_counter()) > 0:
                await asyncio.sleep(delay_s)
            if in_flight >= config.max_in_flight:
                keep(slot.record("dropped", time.perf_counter()))
                continue
            in_flight += 1
            group.create_task(one(slot))
    return LevelRun(
        "rate", rate_rps, config.duration_s, time.perf_counter() - start_s, _ordered(records)
    )


async def run_closed_loop(
    clients: HttpClients,
    config: LoadConfig,
    questions: Sequence[Question],
    concurrency: int,
    on_record: OnRecord | None = None,
) -> LevelRun:
    records: list[RequestRecord] = []
    numbers = itertools.count()
    start_s = time.perf_counter()
    end_s = start_s + config.duration_s

    async def worker() -> None:
        while time.perf_counter() < end_s:
            question = questions[next(numbers) % len(questions)]
            slot = RequestSlot(question, start_s, None, concurrency)
            record = await send_request(clients, config, slot)
            records.append(record)
            if on_record is not None:
                on_record(record)

    async with asyncio.TaskGroup() as group:
        for _ in range(concurrency):
            group.create_task(worker())
    elapsed_s = time.perf_counter() - start_s
    return LevelRun("concurrency", concurrency, config.duration_s, elapsed_s, _ordered(records))


def _ordered(records: list[RequestRecord]) -> tuple[RequestRecord, ...]:
    return tuple(sorted(records, key=lambda r: r.start_offset_s))


def _status(key: str, tally: dict[str, int]) -> str:
    return " ".join([key, *(f"{status}={n}" for status, n in sorted(tally.items()))])


def level_questions(questions: Sequence[T], index: int, levels: int) -> list[T]:
    """Level `index` of `levels` starts on its own share: a question an earlier level asked
    would be answered from the prefix cache and flatter the later level."""
    start = index * (len(questions) // levels)
    return [*questions[start:], *questions[:start]]


def level_key(kind: LevelKind, level: float) -> str:
    return f"{kind}={level:g}"


async def _tick(bar: tqdm, base_s: float, duration_s: float, status: Callable[[], str]) -> None:
    """Move the bar with the level's clock, twice a second (not once per request)."""
    start_s = time.perf_counter()
    while True:
        bar.n = round(base_s + min(time.perf_counter() - start_s, duration_s), 1)
        bar.set_postfix_str(status(), refresh=False)
        bar.refresh()
        await asyncio.sleep(0.5)


async def run_levels(
    clients: HttpClients,
    config: LoadConfig,
    questions: Sequence[Question],
    kind: LevelKind,
    levels: Sequence[float],
    checkpoint: RunCheckpoint,
    *,
    progress: bool = True,
) -> list[LevelRun]:
    """Each level in turn (with `cooldown_s` between them); a level already in `checkpoint`
    is taken from it, and each level that finishes is recorded there."""
    runs: list[LevelRun] = []
    tally: dict[str, int] = {}

    def count(record: RequestRecord) -> None:
        tally[record.status] = tally.get(record.status, 0) + 1

    await warm_up()
    total_s = len(levels) * config.duration_s
    with tqdm(total=total_s, unit="s", desc="load", disable=not progress) as bar:
        for index, level in enumerate(levels):
            key = level_key(kind, level)
            if key in checkpoint.done:
                runs.append(LevelRun.from_json(checkpoint.done[key]))
                logger.info("level already measured, skipped level=%s", key)
                continue
            if config.cooldown_s > 0 and len(runs) > 0:
                await asyncio.sleep(config.cooldown_s)
            tally.clear()
            ticker = asyncio.create_task(
                _tick(
                    bar, index * config.duration_s, config.duration_s, partial(_status, key, tally)
                )
            )
            asked = level_questions(questions, index, len(levels))
            try:
                if kind == "rate":
                    run = await run_open_loop(clients, config, asked, level, count)
                else:
                    run = await run_closed_loop(clients, config, asked, int(level), count)
            finally:
                ticker.cancel()
                await asyncio.gather(ticker, return_exceptions=True)
                bar.set_postfix_str(_status(key, tally))
            checkpoint.record(key, run.to_json())
            logger.info(
                "level measured level=%s elapsed_s=%.1f %s", key, run.elapsed_s, counts(run.records)
            )
            runs.append(run)
        bar.n = total_s
        bar.refresh()
    return runs
