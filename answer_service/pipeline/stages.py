"""The request's own stages, beside retrieval's (retrieval/stages.py) and generation's
(generation/stages.py): the answer cache's lookup, the evidence that decides abstention, the
form choice, the quote, the wait for a generation slot, and the stream up to its first token.
Each is `run(request, deadline) -> StageResult` (budget/stage.py), run by the one `StageRunner`:
it times the stage, gives it a span and hands its result to `budget/` for the next plan."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

from answer_service.errors import OverloadedError, StageTimeoutError
from answer_service.pipeline.admission import Slot, SlotQueueFullError
from answer_service.pipeline.events import CachedAnswer
from answer_service.pipeline.forms import FormInput, FormPolicy
from answer_service.pipeline.planning import RequestPlanning
from answer_service.pipeline.ports import AnswerStore
from budget import Deadline
from budget.forms import FormChoice
from budget.stage import StageResult
from generation.client import TokenDelta
from retrieval.sentences.quote import QuoteConfig, QuotedSentence, select_quote
from retrieval.sentences.scorer import ScoredSentence


def _since_ms(started_s: float) -> float:
    return (time.perf_counter() - started_s) * 1000.0


class AnswerCacheStage:
    """A complete answer from the answer cache, or None. No planner model: a lookup."""

    name = "cache"

    def __init__(self, store: AnswerStore) -> None:
        self._store = store

    async def run(self, request: str, deadline: Deadline) -> StageResult[CachedAnswer | None]:
        started_s = time.perf_counter()
        async with asyncio.timeout(deadline.remaining_s()):
            hit = await self._store.get(request)
        return StageResult(
            hit, _since_ms(started_s), attributes={"answer.cache_hit": hit is not None}
        )


class EvidenceStage:
    """How likely the retrieved sentences are to answer (the answerable model's chance): what
    the plan's abstention decision reads. Given several readings of them (a follow-up's, for
    its own words and for the query searched), the strongest."""

    name = "evidence"

    def __init__(self, policy: FormPolicy) -> None:
        self._policy = policy

    async def run(
        self, request: Sequence[Sequence[ScoredSentence]], deadline: Deadline
    ) -> StageResult[float]:
        started_s = time.perf_counter()
        evidence = max(self._policy.evidence(reading) for reading in request)
        return StageResult(
            evidence, _since_ms(started_s), attributes={"answer.evidence": round(evidence, 4)}
        )


class FormStage:
    """The form that answers: the one asked for, or under `auto` the best expected quality
    whose predicted first token fits the time left (budget/forms.py chooses)."""

    name = "form"

    def __init__(self, policy: FormPolicy) -> None:
        self._policy = policy

    async def run(self, request: FormInput, deadline: Deadline) -> StageResult[FormChoice]:
        started_s = time.perf_counter()
        choice = self._policy.choose(request, deadline.remaining_ms())
        return StageResult(
            choice,
            _since_ms(started_s),
            attributes={"answer.form": choice.form, "answer.form.context": choice.context},
        )


@dataclass(frozen=True, slots=True)
class QuoteRequest:
    query: str
    sentences: Sequence[ScoredSentence]


class QuoteStage:
    """The sentences of the sources that answer, as they are quoted (none: nothing quotable)."""

    name = "quote"

    def __init__(self, config: QuoteConfig) -> None:
        self._config = config

    async def run(
        self, request: QuoteRequest, deadline: Deadline
    ) -> StageResult[tuple[QuotedSentence, ...]]:
        started_s = time.perf_counter()
        quote = tuple(select_quote(request.sentences, self._config, request.query))
        return StageResult(
            quote, _since_ms(started_s), attributes={"answer.quote.sentences": len(quote)}
        )


@dataclass(frozen=True, slots=True)
class SlotRequest:
    worker: str
    tier: str
    # The prompt tokens the plan expects the worker to prefill (its place in the queue).
    tokens: float


class SlotStage:
    """A generation slot on the worker, waited for by tier until the request's hard deadline;
    one that comes free too late for a first token is given back at once (requests queued
    together share a deadline: sending then would only start work SGLang is aborted from)."""

    name = "slot"

    def __init__(self, planning: RequestPlanning) -> None:
        self._planning = planning

    async def run(self, request: SlotRequest, deadline: Deadline) -> StageResult[Slot]:
        started_s = time.perf_counter()
        try:
            async with asyncio.timeout(deadline.remaining_s()):
                slot = await self._planning.gate.acquire(
                    request.worker, request.tier, request.tokens
                )
        except TimeoutError as exc:
            raise StageTimeoutError(
                "no generation slot came free before the request's deadline"
            ) from exc
        except SlotQueueFullError as exc:
            raise OverloadedError(
                f"{exc}; retry later", retry_after_s=self._planning.retry_after_s()
            ) from exc
        needed_ms = self._planning.planner.first_token_floor_ms(request.worker)
        if deadline.remaining_ms() < needed_ms:
            slot.release()
            raise StageTimeoutError(
                "the generation slot came free too late for a first token before the "
                f"request's deadline ({deadline.remaining_ms():.0f} ms left, ~{needed_ms:.0f} "
                "needed)"
            )
        return StageResult(
            slot, _since_ms(started_s), attributes={"answer.queue_wait_ms": slot.waited_ms}
        )


@dataclass(frozen=True, slots=True)
class FirstTokenRequest:
    deltas: AsyncIterator[TokenDelta]
    # When the prompt was sent, and the prefill work ahead of and including it (tokens).
    sent_s: float
    prefill_tokens: float


class FirstTokenStage:
    """The stream up to the model's first token (None: it ended without one). Its time counts
    from sending the prompt; work: the prefill ahead of and including it, which is what the
    first-token model of the worker learns from. The stream's own timeouts bound it."""

    name = "first_token"

    async def run(
        self, request: FirstTokenRequest, deadline: Deadline
    ) -> StageResult[TokenDelta | None]:
        first = await anext(request.deltas, None)
        return StageResult(first, _since_ms(request.sent_s), work=request.prefill_tokens)
