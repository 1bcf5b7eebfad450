"""Timing a worker's first token on demand: the warm-up's calibration, and the way back when
the first-token model says a worker is slower than it is.

A request whose budget is under the idle floor is refused before it reaches SGLang, so a
first-token model that learned a slow moment (a warm-up on a busy machine) would never see the
worker fast again. While the floor refuses, `FloorProbe` times one small uncached prompt on
that worker now and then (one request, one new token) and the model learns from it as from any
answer; a few probes bring the floor back to what the worker does.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Mapping

from answer_service.pipeline.planning import RequestPlanning
from budget import Deadline
from generation.client import GenerationClient, SamplingParams, StreamTimeouts
from generation.errors import GenerationError

# Words of the probes' prompts, in turn: prefills of several sizes, so the model sees its slope
# again as well as its intercept.
PROBE_WORDS = (30, 150, 450)


async def time_first_token(
    planning: RequestPlanning, worker: GenerationClient, text: str, deadline: Deadline
) -> float | None:
    """One uncached prompt (a fresh nonce first, so no cached prefix applies) to its first
    token; the first-token model learns its prefill size and time, which is returned."""
    timed = await first_token_of(worker, text, deadline)
    if timed is None:
        return None
    elapsed_ms, uncached = timed
    planning.observe("first_token", float(uncached), elapsed_ms, worker.base_url)
    return elapsed_ms


async def first_token_of(
    worker: GenerationClient, text: str, deadline: Deadline
) -> tuple[float, int] | None:
    """Milliseconds to the first token of `text` as an uncached prompt (a fresh nonce first),
    and the tokens the worker prefilled for it; None when no token came."""
    prompt = f"[{uuid.uuid4().hex}] {text}\nSummary:"
    sent_s = time.perf_counter()
    stream = await worker.open_stream(
        prompt, SamplingParams(max_new_tokens=1), StreamTimeouts(deadline)
    )
    elapsed_ms = None
    try:
        async for _ in stream:
            if elapsed_ms is None:
                elapsed_ms = (time.perf_counter() - sent_s) * 1000.0
    finally:
        stream.close_nowait()
    result = stream.result
    if result is None or elapsed_ms is None:
        return None
    return elapsed_ms, max(result.prompt_tokens - result.cached_tokens, 0)


class FloorProbe:
    """At most one probe per worker every `every_s` seconds, in the background."""

    def __init__(
        self,
        planning: RequestPlanning,
        workers: Mapping[str, GenerationClient],
        every_s: float = 5.0,
        timeout_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._planning = planning
        self._workers = workers
        self._every_s = every_s
        self._timeout_s = timeout_s
        self._clock = clock
        self._last: dict[str, float] = {}
        self._sent: dict[str, int] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def refused(self, worker: str) -> bool:
        """The floor refused a request for `worker`: probe it unless one ran lately. Whether a
        probe was started."""
        client = self._workers.get(worker)
        now = self._clock()
        if client is None or now - self._last.get(worker, -self._every_s) < self._every_s:
            return False
        self._last[worker] = now
        sent = self._sent[worker] = self._sent.get(worker, -1) + 1
        words = PROBE_WORDS[sent % len(PROBE_WORDS)]
        task = asyncio.get_running_loop().create_task(self._probe(client, words))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return True

    async def wait(self) -> None:
        """Until the probes under way have finished (tests, shutdown)."""
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _probe(self, client: GenerationClient, words: int) -> None:
        text = " ".join(["passage"] * words)
        deadline = Deadline.after_ms(self._timeout_s * 1000.0)
        try:
            await asyncio.wait_for(
                time_first_token(self._planning, client, text, deadline), self._timeout_s
            )
        except (TimeoutError, GenerationError):
            return  # the next refusal tries again
