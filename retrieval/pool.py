"""A bounded thread pool for retrieval's blocking calls (torch, faiss, bm25s), with deadlines.

A call that overruns its deadline raises `RetrievalTimeoutError`; its thread finishes the work
in the background (a running faiss or torch call cannot be interrupted), which is why the pool
is bounded: overload queues here instead of multiplying threads.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Generic, TypeVar

from budget import Deadline
from retrieval.errors import RetrievalTimeoutError

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Timed(Generic[T]):
    value: T
    elapsed_ms: float


class StagePool:
    def __init__(self, max_workers: int = 2, name: str = "retrieval") -> None:
        self._executor = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix=name)

    async def run(self, stage: str, deadline: Deadline, call: Callable[[], T]) -> Timed[T]:
        started_s = time.perf_counter()
        future = asyncio.get_running_loop().run_in_executor(self._executor, call)
        try:
            value = await asyncio.wait_for(future, timeout=deadline.remaining_s())
        except TimeoutError as exc:
            raise RetrievalTimeoutError(
                f"{stage} did not finish within {deadline.budget_ms:.0f} ms"
            ) from exc
        return Timed(value, (time.perf_counter() - started_s) * 1000.0)

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
