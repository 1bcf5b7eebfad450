"""Who gets the next generation slot: weighted shares between tenant tiers, with aging.

Stride scheduling: each tier has a weight and a `pass` value that grows by `cost / weight` each
time one of its requests is served; the next slot goes to the waiting tier with the lowest pass,
so over time tiers are served in proportion to their weights. A tier that comes back from idle
starts at the lowest pass among the waiting tiers rather than at its old value, so it cannot
bank credit while idle. Aging bounds the wait: a request that has waited `max_wait_ms` goes
next whatever its tier, so a lower tier is slowed under load but never starved. Within a tier,
first come first served.

Pure: time comes from the clock passed in; the asyncio side (futures, cancellation) lives in
the service.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from budget.deadline import Clock, monotonic_clock

Ticket = TypeVar("Ticket", bound=Hashable)


@dataclass(frozen=True, slots=True)
class Waiting(Generic[Ticket]):
    ticket: Ticket
    tier: str
    cost: float
    since_s: float


@dataclass(slots=True)
class TierQueue(Generic[Ticket]):
    weights: Mapping[str, float]
    max_wait_ms: float = 2000.0
    clock: Clock = monotonic_clock
    _queues: dict[str, deque[Waiting[Ticket]]] = field(init=False)
    _pass: dict[str, float] = field(init=False)
    _tickets: dict[Ticket, Waiting[Ticket]] = field(init=False)

    def __post_init__(self) -> None:
        if not self.weights or any(w <= 0 for w in self.weights.values()):
            raise ValueError("tier weights must be positive and at least one tier given")
        if self.max_wait_ms <= 0:
            raise ValueError("max_wait_ms must be positive")
        self._queues = {tier: deque() for tier in self.weights}
        self._pass = dict.fromkeys(self.weights, 0.0)
        self._tickets = {}

    def __len__(self) -> int:
        return len(self._tickets)

    def __contains__(self, ticket: object) -> bool:
        return ticket in self._tickets

    def push(self, ticket: Ticket, tier: str, cost: float = 1.0) -> None:
        if tier not in self._queues:
            raise KeyError(f"unknown tier {tier!r}; tiers: {sorted(self._queues)}")
        if ticket in self._tickets:
            raise ValueError(f"ticket {ticket!r} is already waiting")
        if not self._queues[tier]:
            waiting = [self._pass[t] for t, q in self._queues.items() if q]
            if waiting:
                self._pass[tier] = max(self._pass[tier], min(waiting))
        entry = Waiting(ticket, tier, max(cost, 0.0), self.clock())
        self._queues[tier].append(entry)
        self._tickets[ticket] = entry

    def remove(self, ticket: Ticket) -> bool:
        """Drop a waiter (its client went away); False when it was not waiting."""
        entry = self._tickets.pop(ticket, None)
        if entry is None:
            return False
        self._queues[entry.tier].remove(entry)
        return True

    def pop(self) -> Waiting[Ticket] | None:
        """The waiter that gets the next slot, or None when nobody waits."""
        heads = [q[0] for q in self._queues.values() if q]
        if not heads:
            return None
        oldest = min(heads, key=lambda w: w.since_s)
        if (self.clock() - oldest.since_s) * 1000.0 >= self.max_wait_ms:
            chosen = oldest
        else:
            chosen = min(heads, key=lambda w: (self._pass[w.tier], w.since_s))
        self._queues[chosen.tier].popleft()
        del self._tickets[chosen.ticket]
        self._pass[chosen.tier] += chosen.cost / self.weights[chosen.tier]
        return chosen

    def waiting_cost(self) -> float:
        """The summed cost of everyone waiting (the planner's view of the queue)."""
        return sum(entry.cost for entry in self._tickets.values())
