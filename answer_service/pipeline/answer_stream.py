"""What a prepared answer streams: `plan`, `sources`, then the answer's text as token deltas
with a `citation` after each finished sentence, then `done`; a failure mid-stream adds `error`
before `done`. An answer given without the model (a quote, the answer cache, an abstention,
sources only) streams the same events.

A generated answer is guarded as it streams: a degenerate loop (generation/guard.py) ends it,
the server's request aborted, with `finish_reason` "repetition". A sentence no source supports
is, by `unsupported`: `mark`ed (streamed, its citation says supported: false), `drop`ped (each
sentence is held until it is checked, an unsupported one never shown) or a `stop` (the answer
ends before it, `finish_reason` "unsupported").
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Literal

from opentelemetry.trace import Status, StatusCode

from answer_service.pipeline.attribution import (
    ABSTENTION,
    SUPPORT_THRESHOLD,
    Attributor,
    Citation,
)
from answer_service.pipeline.events import (
    CitationEvent,
    DoneEvent,
    ErrorEvent,
    PipelineEvent,
    PlanEvent,
    ShortAnswerEvent,
    SourcesEvent,
    TokenEvent,
)
from answer_service.pipeline.ports import AnswerStore
from answer_service.pipeline.prepared import Generation, PreparedAnswer
from answer_service.pipeline.stage_runner import StageRunner
from answer_service.pipeline.stages import FirstTokenRequest, FirstTokenStage
from answer_service.pipeline.values import error_event
from generation.client import TokenDelta
from generation.errors import GenerationError
from generation.guard import RepetitionGuard, Verdict
from retrieval.sentences.splitter import (
    SentenceSpan,
    SentenceStream,
    open_fence,
    split_sentences,
)

logger = logging.getLogger(__name__)

UnsupportedPolicy = Literal["mark", "drop", "stop"]


@dataclass(frozen=True, slots=True)
class CitationConfig:
    # Answer sentences cite the prompt passages covering this share of their terms.
    threshold: float = SUPPORT_THRESHOLD
    max_sources: int = 2
    unsupported: UnsupportedPolicy = "mark"
    # Stop a degenerate loop as it happens (generation/guard.py).
    loop_guard: bool = True


async def answer_events(
    prepared: PreparedAnswer,
    config: CitationConfig,
    store: AnswerStore | None,
    runner: StageRunner,
) -> AsyncIterator[PipelineEvent]:
    handle = prepared.handle
    yield PlanEvent(prepared.record, prepared.queries.searched)
    yield SourcesEvent(prepared.sources)
    if handle.outcome == "abstained":
        prepared.shown()
        yield TokenEvent(ABSTENTION)
    if (cached := prepared.cached) is not None:
        prepared.shown()
        yield TokenEvent(cached.text)
        for citation in cached.citations:
            yield CitationEvent(citation)
    if prepared.short_answer is not None:
        yield ShortAnswerEvent(prepared.short_answer)
    for event in _quote_events(prepared):
        yield event
    writer = _AnswerWriter(prepared, config)
    error: ErrorEvent | None = None
    generation = prepared.generation
    generate_started_s = time.perf_counter()
    try:
        if generation is not None:
            deltas = await _first_token(prepared, generation, runner)
            async for event in writer.events(generation, deltas):
                yield event
    except GenerationError as exc:
        error = error_event(exc)
        handle.outcome = "error"
        assert generation is not None
        generation.span.record_exception(exc)
        generation.span.set_status(Status(StatusCode.ERROR, error.message[:200]))
        logger.warning("generation failed trace_id=%s code=%s", prepared.trace_id, error.code)
    except BaseException:
        handle.outcome = "cancelled"
        raise
    finally:
        if generation is not None:
            handle.plan = handle.plan.streamed((time.perf_counter() - generate_started_s) * 1000.0)
        prepared.close_nowait()
    if error is not None:
        yield error
    stats = prepared.stats()
    cacheable = prepared.cacheable(stats, writer.emitted, writer.citations) if not error else None
    if store is not None and prepared.cache_key and cacheable is not None:
        store.put(prepared.cache_key, cacheable)
    yield DoneEvent(stats, prepared.short_answer)


async def _first_token(
    prepared: PreparedAnswer, generation: Generation, runner: StageRunner
) -> AsyncIterator[TokenDelta]:
    """The stream up to the model's first token, a stage of its own: when it comes the slot
    is free for the next prefill and the worker's first-token model learns its time. The
    deltas from the first on."""
    handle = prepared.handle
    deltas = aiter(generation.stream)
    first, handle.plan = await runner.run(
        FirstTokenStage(),
        FirstTokenRequest(deltas, generation.sent_s, generation.prefill_tokens),
        prepared.deadline,
        handle.plan,
        worker=generation.worker,
        parent=prepared.root,
    )
    handle.prefilled = True
    generation.slot.prefilled()
    return _from(first.value, deltas)


async def _from(
    first: TokenDelta | None, rest: AsyncIterator[TokenDelta]
) -> AsyncIterator[TokenDelta]:
    if first is None:
        return
    yield first
    async for delta in rest:
        yield delta


def _quote_events(prepared: PreparedAnswer) -> list[PipelineEvent]:
    """A quoted answer: each sentence as a token, then its citation (source n is the n-th
    passage in retrieval order, as the sources list them)."""
    events: list[PipelineEvent] = []
    text = ""
    for n, quoted in enumerate(prepared.quote):
        prepared.shown()
        piece = quoted.text if n == 0 else " " + quoted.text
        start = len(text) + (len(piece) - len(quoted.text))
        text += piece
        events.append(TokenEvent(piece))
        citation = Citation(
            n, start, len(text), (quoted.rank + 1,), round(quoted.probability, 4), True
        )
        events.append(CitationEvent(citation))
    return events


def _safe_end(text: str) -> int:
    """Where text can be sent up to now: all of it but the white space it ends with, sent
    once something follows it. After a sentence's closing mark a citation marker may still
    belong there; at the end of the answer (a model that writes line breaks until its token
    limit) nothing follows, and blank lines after the last word are not sent."""
    return len(text.rstrip())


def _closing_fence(shown: str) -> str:
    """What closes a code block the answer left open (a loop stopped inside it, the token
    limit reached in it), so that what follows it in a client is not rendered as code."""
    fence = open_fence(shown)
    return fence and ("" if shown.endswith("\n") else "\n") + fence


class _AnswerWriter:
    """Turns the model's stream into what the client gets: the guard, the citations, and the
    unsupported-sentence policy (which decides whether text is shown as it comes or a sentence
    at a time)."""

    def __init__(self, prepared: PreparedAnswer, config: CitationConfig) -> None:
        self._prepared = prepared
        self._handle = prepared.handle
        self._policy = config.unsupported
        self._config = config
        self.emitted = ""  # what the client has been sent
        self.citations: list[Citation] = []
        self._generated = ""
        self._held_from = 0  # where the generated text not yet sent starts

    async def events(
        self, generation: Generation, deltas: AsyncIterator[TokenDelta]
    ) -> AsyncIterator[PipelineEvent]:
        attributor = Attributor(
            [(p.number, f"{p.title}\n{p.text}") for p in generation.prompt.passages],
            threshold=self._config.threshold,
            max_sources=self._config.max_sources,
        )
        guard = RepetitionGuard(enabled=self._config.loop_guard)
        sentences = SentenceStream()
        async for delta in deltas:
            self._generated += delta.text
            for span in sentences.feed(delta.text):
                for event in self._finished(span, attributor, guard):
                    yield event
                if self._handle.stopped is not None:
                    break
            if self._handle.stopped is None and guard.feed(delta.text):
                self._stop("repetition", generation)
            if self._handle.stopped is not None:
                break
            if self._policy == "mark":
                for event in self._send_to(self._showable(sentences, guard)):
                    yield event
        if self._policy != "mark" and self._handle.stopped is not None:
            for event in self._if_nothing_shown():  # what was held back is not shown
                yield event
            return
        for span in sentences.finish():
            if self._handle.stopped is not None and self._policy != "mark":
                break
            checking = self._handle.stopped is None
            for event in self._finished(span, attributor, guard, checking=checking, last=True):
                yield event
        # What is left: a sentence cut short (shown unless it could be a repeat); white space
        # alone ends nothing and is not sent.
        tail = self._generated[self._held_from :]
        if self._policy == "mark" and tail.strip() and not guard.may_repeat(tail):
            for event in self._send_to(len(self._generated)):
                yield event
        for event in self._send(_closing_fence(self.emitted)):
            yield event
        for event in self._if_nothing_shown():
            yield event

    def _if_nothing_shown(self) -> list[PipelineEvent]:
        """An answer whose every sentence was held back as unsupported says it does not know,
        rather than nothing."""
        if self._policy == "mark" or self.emitted.strip() or not self._handle.sentences:
            return []
        if self._handle.stopped is None:
            self._handle.stopped = "unsupported"
        return self._send(ABSTENTION)

    def _showable(self, sentences: SentenceStream, guard: RepetitionGuard) -> int:
        """How far the mark policy may show the text as it comes: all of it but the white
        space after a sentence's last mark (its citation, decided when the next sentence
        starts, goes right after the mark) and a sentence still being written that could turn
        out to repeat one already said (held until it is decided: a repeat is never shown)."""
        end = _safe_end(self._generated)
        open_from = sentences.open_from
        # What is not yet decided may hold several units (a list's items before the blank
        # line that closes it): held from the first one that could be a repeat.
        for span in split_sentences(self._generated[open_from:]):
            if guard.may_repeat(self._generated[open_from + span.start : open_from + span.end]):
                # With the white space before it: a unit left out leaves no blank line behind.
                return min(end, _safe_end(self._generated[: open_from + span.start]))
        return end

    def _finished(
        self,
        span: SentenceSpan,
        attributor: Attributor,
        guard: RepetitionGuard,
        *,
        checking: bool = True,
        last: bool = False,
    ) -> list[PipelineEvent]:
        """A finished sentence's events: (its text and) its citation. `checking`: whether it
        may still stop the answer (not once the answer has ended); `last`: one of the
        sentences left when the stream ended, perhaps cut short. A sentence said before is
        left out (a last one that begins like one said before, too), and a loop ends the
        answer before it."""
        text = self._generated[span.start : span.end]
        generation = self._prepared.generation
        assert generation is not None
        verdict: Verdict = "repeat" if last and guard.may_repeat(text) else guard.sentence(text)
        if verdict == "loop" and checking:
            self._stop("repetition", generation)
        if verdict != "new":
            self._held_from = max(self._held_from, span.end)  # never shown
            return []
        citation = attributor.cite(span, text)
        supported = citation is None or citation.supported
        if citation is not None:
            self._handle.sentences += 1
        if citation is not None and not citation.supported:
            self._handle.unsupported_sentences += 1
        if self._policy == "mark":
            events = self._send_to(span.end)
        elif not supported:
            if self._policy == "stop" and checking:
                self._stop("unsupported", generation)
            self._held_from = span.end  # dropped: never shown
            return []
        else:
            events = self._send(self._generated[self._held_from : span.end])
            self._held_from = span.end
        if citation is not None:
            # Where the sentence is in what the client was sent (a sentence left out moves
            # the ones after it).
            shift = len(self.emitted) - span.end
            moved = dataclasses.replace(
                citation,
                sentence=len(self.citations),
                start=span.start + shift,
                end=span.end + shift,
            )
            self.citations.append(moved)
            events.append(CitationEvent(moved))
        return events

    def _send_to(self, end: int) -> list[PipelineEvent]:
        """Everything generated up to `end` not yet sent (the mark policy: all of it is)."""
        if end <= self._held_from:
            return []
        text = self._generated[self._held_from : end]
        self._held_from = end
        return self._send(text)

    def _send(self, text: str) -> list[PipelineEvent]:
        if not text:
            return []
        self._prepared.shown()
        self.emitted += text
        return [TokenEvent(text)]

    def _stop(self, reason: str, generation: Generation) -> None:
        """End the answer here and abort the server's request."""
        self._handle.stopped = reason
        generation.stream.close_nowait()
        logger.info("answer stopped trace_id=%s reason=%s", self._prepared.trace_id, reason)
