"""Generation slots per SGLang worker, handed out by tenant tier (budget/tiers.py).

A request holds a slot of its worker from just before its prompt is sent until its first token
arrives (or it fails): prefill is what two cores cannot share without every prompt's first
token coming late, while decoding batches well. How many slots a worker has is what it was
measured to batch at warm-up (budget/concurrency.py: one on a CPU, more on a GPU), unless
configured. Requests waiting for a slot queue by tier with
weighted shares and aging. A waiter whose client goes away (its task is cancelled) leaves the
queue at once. The gate also tells the planner how many prompt tokens a worker must still
prefill before a new request's own: those holding its slots and those queued for them.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from budget.tiers import TierQueue

# Requests that may wait for a worker's slots; more are refused (the planner's admission
# usually refuses long before, but nothing else bounds the queue with it off).
DEFAULT_QUEUE_MAX = 32


class SlotQueueFullError(Exception):
    """`queue_max` requests already wait for this worker's slots."""

    def __init__(self, waiting: int) -> None:
        super().__init__(f"{waiting} requests are already waiting for a generation slot")
        self.waiting = waiting


@dataclass(slots=True)
class _Worker:
    capacity: int
    queue: TierQueue[int]
    waiters: dict[int, tuple[asyncio.Future[None], float]] = field(default_factory=dict)
    # Slots held, by ticket: the prompt tokens still to prefill (0 once the first token came).
    held: dict[int, float] = field(default_factory=dict)


@dataclass(slots=True)
class Slot:
    """A held generation slot; `release()` is idempotent and safe from any `finally`."""

    gate: GenerationGate
    worker: str
    ticket: int
    waited_ms: float
    released: bool = False

    def owe(self, tokens: float) -> None:
        """The prompt is laid out: this is what the worker will really prefill for it."""
        if not self.released:
            self.gate._owe(self.worker, self.ticket, tokens)

    def prefilled(self) -> None:
        """The first token came: the worker no longer owes this request prefill work."""
        self.release()

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.gate._release(self.worker, self.ticket)


class GenerationGate:
    """Not thread-safe: call it on the event loop only (its state changes there)."""

    def __init__(
        self,
        workers: Sequence[str],
        slots_per_worker: int,
        tier_weights: Mapping[str, float],
        max_wait_ms: float,
        queue_max: int = DEFAULT_QUEUE_MAX,
    ) -> None:
        if slots_per_worker < 1:
            raise ValueError("slots_per_worker must be >= 1")
        if queue_max < 0:
            raise ValueError("queue_max must be >= 0")
        self.tiers = dict(tier_weights)
        self.queue_max = queue_max
        self._workers = {
            url: _Worker(slots_per_worker, TierQueue(self.tiers, max_wait_ms=max_wait_ms))
            for url in workers
        }
        self._tickets = itertools.count()

    def capacity(self, worker: str) -> int:
        return self._workers[worker].capacity

    def set_capacity(self, worker: str, slots: int) -> None:
        """`worker` runs `slots` prefills at once from now on (what it was measured to batch);
        waiters take the new slots at once, and holders of slots beyond a smaller capacity
        keep them until they release."""
        if slots < 1:
            raise ValueError("a worker needs at least one slot")
        self._workers[worker].capacity = slots
        self._grant(worker)

    def pending_tokens(self, worker: str) -> float:
        """Prompt tokens `worker` must prefill before a request queued now gets its turn."""
        state = self._workers[worker]
        return sum(state.held.values()) + state.queue.waiting_cost()

    def requests_ahead(self, worker: str) -> float:
        """Requests `worker` takes before one queued now starts, in units of its slots (0
        when a slot is free)."""
        state = self._workers[worker]
        if len(state.held) < state.capacity and not len(state.queue):
            return 0.0
        return (len(state.held) + len(state.queue)) / state.capacity

    def prefilling_tokens(self, worker: str, slot: Slot) -> float:
        """Prompt tokens the worker is prefilling for the other holders of its slots."""
        held = self._workers[worker].held
        return sum(tokens for ticket, tokens in held.items() if ticket != slot.ticket)

    def least_loaded(self) -> str:
        return min(self._workers, key=self.pending_tokens)

    def waiting(self, worker: str) -> int:
        return len(self._workers[worker].queue)

    async def acquire(self, worker: str, tier: str, tokens: float) -> Slot:
        """A slot of `worker`, waiting by tier if all are held. Cancel the caller to give up
        (a client gone, a deadline passed): the request leaves the queue. Raises
        `SlotQueueFullError` when `queue_max` requests wait already."""
        state = self._workers[worker]
        ticket = next(self._tickets)
        loop = asyncio.get_running_loop()
        started_s = time.perf_counter()
        if len(state.held) < state.capacity and not len(state.queue):
            state.held[ticket] = tokens
            return Slot(self, worker, ticket, 0.0)
        if len(state.queue) >= self.queue_max:
            raise SlotQueueFullError(len(state.queue))
        future: asyncio.Future[None] = loop.create_future()
        state.queue.push(ticket, tier, cost=tokens)
        state.waiters[ticket] = (future, tokens)
        try:
            await future
        except BaseException:
            if state.queue.remove(ticket):
                state.waiters.pop(ticket, None)
            elif ticket in state.held:  # granted in the same tick it was cancelled
                self._release(worker, ticket)
            raise
        return Slot(self, worker, ticket, (time.perf_counter() - started_s) * 1000.0)

    def _owe(self, worker: str, ticket: int, tokens: float) -> None:
        held = self._workers[worker].held
        if ticket in held:
            held[ticket] = tokens

    def _release(self, worker: str, ticket: int) -> None:
        self._workers[worker].held.pop(ticket, None)
        self._grant(worker)

    def _grant(self, worker: str) -> None:
        """Free slots to the waiters next in line."""
        state = self._workers[worker]
        while len(state.held) < state.capacity:
            entry = state.queue.pop()
            if entry is None:
                return
            future, tokens = state.waiters.pop(entry.ticket)
            if future.done():  # cancelled, and its cleanup has not run yet
                continue
            state.held[entry.ticket] = tokens
            future.set_result(None)
