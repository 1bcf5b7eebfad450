"""What the pipeline needs from the runtime, as small protocols: the answer and embedding caches
(Redis with an in-process fallback, answer_service/runtime/caches.py) and whoever wants every
finished or refused request (metrics, the dashboard's log). The runtime implements them; tests
hand in their own."""

from __future__ import annotations

from typing import Protocol

from answer_service.pipeline.events import AnswerStats, CachedAnswer, PlanRecord
from retrieval.embedder import Vectors


class AnswerStore(Protocol):
    def key(
        self, query: str, top_k: int, form: str, scope: str = "", read: str | None = None
    ) -> str:
        """`scope`: what the request may read (its filter's key), part of the key. `query`: the
        query searched; `read`: the one read where it differs (a follow-up's own words)."""
        ...

    async def get(self, key: str) -> CachedAnswer | None: ...

    def put(self, key: str, answer: CachedAnswer) -> None: ...


class EmbeddingStore(Protocol):
    async def get(self, query: str) -> Vectors | None: ...

    def put(self, query: str, vectors: Vectors) -> None: ...


class AnswerListener(Protocol):
    def answered(self, stats: AnswerStats, plan: PlanRecord) -> None: ...

    def refused(self, *, trace_id: str, tier: str, code: str, budget_ms: float) -> None: ...
