"""Which SGLang worker gets a prompt, decided by the service from the passages it will send.

With several workers each holds its own prefix cache, so a prompt should go where its passage
sequence was sent before. `PrefixRouter` keeps one `PrefixTree` per worker (what was sent
there) and the number of requests in flight on each. `prefix` routing sends a prompt to the
worker holding the longest prefix of its passages among the workers whose load is within
`max_imbalance` requests of the least loaded (so one popular prefix cannot pile every request
onto one worker); ties go to the less loaded worker, then in turn. `round_robin` ignores the
cache (the baseline).

Unlike sglang-router's `cache_aware` policy, which matches request *characters* and sends a
request matching less than its threshold to its first worker, this matches whole passages:
the unit the prompt layout reorders.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Collection, Sequence
from typing import Literal

from generation.prefix_order import PrefixTree

RoutingPolicy = Literal["prefix", "round_robin"]


class PrefixRouter:
    def __init__(
        self,
        workers: Sequence[str],
        *,
        policy: RoutingPolicy = "prefix",
        max_imbalance: int = 2,
        max_nodes: int = 20_000,
    ) -> None:
        if not workers:
            raise ValueError("at least one worker is needed")
        if len(set(workers)) != len(workers):
            raise ValueError("workers must be distinct")
        self.workers = tuple(workers)
        self.policy = policy
        self._max_imbalance = max(max_imbalance, 0)
        self._trees = {worker: PrefixTree(max_nodes) for worker in workers}
        self._in_flight = dict.fromkeys(workers, 0)
        self._turn = itertools.count()
        self._lock = threading.Lock()
        # Workers that refused a connection, and until when (monotonic s) to avoid them.
        self._down_until: dict[str, float] = {}

    def tree(self, worker: str) -> PrefixTree:
        return self._trees[worker]

    def in_flight(self, worker: str) -> int:
        return self._in_flight[worker]

    def mark_down(self, worker: str, for_s: float) -> None:
        """Route around `worker` for `for_s` seconds (it refused a connection)."""
        with self._lock:
            self._down_until[worker] = time.monotonic() + for_s

    def is_down(self, worker: str) -> bool:
        return self._down_until.get(worker, 0.0) > time.monotonic()

    def choose(self, passage_ids: Collection[str], *, foreign: int = 0) -> str:
        """The worker for a prompt of these passages, counted in flight until `release`.
        Workers marked down are passed over while another is up. `foreign`: the places the
        layout may give to passages a remembered prefix brings along (its `adopt`)."""
        with self._lock:
            turn = next(self._turn)
            now = time.monotonic()
            up = [w for w in self.workers if self._down_until.get(w, 0.0) <= now]
            workers = up or list(self.workers)
            if self.policy == "round_robin" or len(workers) == 1:
                worker = workers[turn % len(workers)]
            else:
                least = min(self._in_flight[w] for w in workers)
                eligible = [w for w in workers if self._in_flight[w] <= least + self._max_imbalance]
                n = len(self.workers)
                own = set(passage_ids)

                def reusable(w: str) -> int:  # this prompt's passages the worker may hold
                    path = self._trees[w].longest_prefix(own, foreign=foreign).passage_ids
                    return sum(pid in own for pid in path)

                worker = max(
                    eligible,
                    key=lambda w: (
                        reusable(w),
                        -self._in_flight[w],
                        -((self.workers.index(w) - turn) % n),
                    ),
                )
            self._in_flight[worker] += 1
            return worker

    def release(self, worker: str) -> None:
        with self._lock:
            self._in_flight[worker] = max(self._in_flight[worker] - 1, 0)
