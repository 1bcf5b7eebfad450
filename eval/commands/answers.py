"""`answer-eval answers`: ask every question end to end, then score the answers.

Questions come as JSONL with `_id`, `question`, `answers` (a list; empty means unanswerable)
and an optional `gold_passage_id` (a document id of the corpus). Each question is answered by
the same pipeline the service runs, in-process (`InProcessAnswering`) or through a running
service's `POST /v1/answer` stream (`HttpAnswering`), one request at a time by default so the
latencies are those of an idle service. A record per question goes to the run's checkpoint;
the metrics are computed from the records alone.

Metrics: `exact_match` and `f1` (official SQuAD normalisation; answerable questions),
`answer_recall` (a gold string appears in the answer; all three
scored without the `[n]` markers), `citation_precision` (over answers that
cite something) and `citation_recall` (over questions with a gold passage) where a citation is
a `citation` event's passage or an `[n]` marker mapped to the n-th source, `abstention_rate`
(unanswerable questions answered with "I do not know") and `false_abstention_rate`
(answerable ones), and TTFT percentiles as the client saw them.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Protocol

import httpx
import numpy as np
from tqdm import tqdm

from answer_service.cli.sse_client import iter_events
from answer_service.errors import ServiceError
from answer_service.pipeline.answer_pipeline import AnswerPipeline
from answer_service.pipeline.events import (
    AnswerRequest,
    CitationEvent,
    DoneEvent,
    ErrorEvent,
    SourcesEvent,
    TokenEvent,
)
from answer_service.runtime.components import Components
from answer_service.runtime.configs import SHIPPED, Experiment
from answer_service.runtime.settings import Settings
from budget import Deadline
from budget.forms import AnswerMode
from eval.lib.checkpoint import RunCheckpoint
from eval.lib.latency_stats import percentiles
from eval.lib.metrics import (
    abstains,
    answer_recall,
    citation_precision,
    citation_recall,
    cited_numbers,
    exact_match,
    f1,
    normalize_answer,
    strip_citations,
)
from eval.lib.questions import Question
from retrieval.sentences.splitter import split_sentences


@dataclass(frozen=True, slots=True)
class AnswerRecord:
    """One question's answer as the client saw it. `status`: ok, error (an `error` event or a
    failed request) or rejected (429/503 before the stream)."""

    question_id: str
    status: str
    answer: str
    source_doc_ids: tuple[str, ...]
    cited_doc_ids: tuple[str, ...]
    ttft_ms: float | None
    e2e_ms: float
    server_ttft_ms: float | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    error: str | None = None
    # How it was answered: the form (quote, focused, passages, abstain, sources_only), whether
    # from the answer cache, how generation ended, and its sentences (those the service could
    # not attribute to a source among them).
    form: str = ""
    from_cache: bool = False
    finish_reason: str = ""
    sentences: int = 0
    unsupported_sentences: int = 0

    @property
    def model_served(self) -> bool:
        """Answered by the model now (not a quote, the cache, an abstention or sources)."""
        return self.form in ("focused", "passages") and not self.from_cache

    @classmethod
    def of(cls, value: dict[str, Any]) -> AnswerRecord:
        return cls(
            **{
                **value,
                "source_doc_ids": tuple(value["source_doc_ids"]),
                "cited_doc_ids": tuple(value["cited_doc_ids"]),
            }
        )


class _Collector:
    """Builds an `AnswerRecord` from the events of one answer, timing them as they come."""

    def __init__(self, question_id: str) -> None:
        self.question_id = question_id
        self.started_s = time.perf_counter()
        self.parts: list[str] = []
        self.sources: list[str] = []
        self.cited: list[str] = []
        self.ttft_ms: float | None = None
        self.done: dict[str, Any] = {}
        self.error: str | None = None
        self.sentences = 0

    def sources_event(self, doc_ids: Sequence[str]) -> None:
        self.sources = list(doc_ids)

    def token(self, text: str) -> None:
        if self.ttft_ms is None:
            self.ttft_ms = (time.perf_counter() - self.started_s) * 1000.0
        self.parts.append(text)

    def citation(self, numbers: Sequence[int]) -> None:
        self.sentences += 1
        self.cited += [self.sources[n - 1] for n in numbers if 0 < n <= len(self.sources)]

    def record(self, status: str | None = None) -> AnswerRecord:
        answer = "".join(self.parts)
        sentences = self.sentences
        if not self.cited:
            self.citation(cited_numbers(answer))
            self.sentences = sentences
        return AnswerRecord(
            question_id=self.question_id,
            status=status or ("error" if self.error else "ok"),
            answer=answer,
            source_doc_ids=tuple(self.sources),
            cited_doc_ids=tuple(dict.fromkeys(self.cited)),
            ttft_ms=self.ttft_ms,
            e2e_ms=(time.perf_counter() - self.started_s) * 1000.0,
            server_ttft_ms=self.done.get("ttft_ms"),
            prompt_tokens=int(self.done.get("prompt_tokens", 0)),
            cached_tokens=int(self.done.get("cached_tokens", 0)),
            error=self.error,
            form=str(self.done.get("form", "")),
            from_cache=bool(self.done.get("from_cache", False)),
            finish_reason=str(self.done.get("finish_reason", "")),
            sentences=self.sentences,
            unsupported_sentences=int(self.done.get("unsupported_sentences", 0)),
        )


@dataclass(frozen=True, slots=True)
class Ask:
    """How every question of a run is asked."""

    budget_ms: int
    top_k: int
    # quote, focused, passages or auto; None: the service's default.
    answer_mode: AnswerMode | None = None


class AnsweringSource(Protocol):
    async def answer(self, question: Question, ask: Ask) -> AnswerRecord: ...


class InProcessAnswering:
    """The service's pipeline, called directly (no HTTP)."""

    def __init__(self, pipeline: AnswerPipeline) -> None:
        self._pipeline = pipeline

    async def answer(self, question: Question, ask: Ask) -> AnswerRecord:
        collector = _Collector(question.question_id)
        request = AnswerRequest(
            question.question, ask.budget_ms, ask.top_k, answer_mode=ask.answer_mode
        )
        try:
            prepared = await self._pipeline.prepare(request, Deadline.after_ms(ask.budget_ms))
        except ServiceError as exc:
            collector.error = f"{exc.code}: {exc.message}"
            return collector.record("rejected" if exc.status_code in (429, 503) else "error")
        try:
            async for event in self._pipeline.events(prepared):
                match event:
                    case SourcesEvent(sources=sources):
                        collector.sources_event([s.doc_id for s in sources])
                    case TokenEvent(text=text):
                        collector.token(text)
                    case CitationEvent(citation=citation):
                        collector.citation(citation.sources)
                    case ErrorEvent(code=code, message=message):
                        collector.error = f"{code}: {message}"
                    case DoneEvent(stats=stats):
                        collector.done = asdict(stats)
        finally:
            prepared.close_nowait()
        return collector.record()


@contextlib.asynccontextmanager
async def in_process_answering(
    settings: Settings, experiment: Experiment = SHIPPED
) -> AsyncIterator[InProcessAnswering]:
    """The service's components built from `settings` (and an experiment's knobs) and warmed
    up (the reranker loaded where one is configured), as an answering source."""
    components = Components.create(settings, experiment)
    try:
        components.start_warm_up()
        await components.wait_ready(reranker=True)
        if components.pipeline is None:
            raise ServiceError(f"warm-up failed: {components.warm_up_error}")
        yield InProcessAnswering(components.pipeline)
    finally:
        await components.aclose()


class HttpAnswering:
    """A running service's `POST /v1/answer` stream."""

    def __init__(self, http: httpx.AsyncClient, url: str) -> None:
        self._http = http
        self._url = url.rstrip("/")

    async def answer(self, question: Question, ask: Ask) -> AnswerRecord:
        collector = _Collector(question.question_id)
        body: dict[str, Any] = {
            "query": question.question,
            "ttft_budget_ms": ask.budget_ms,
            "top_k": ask.top_k,
        }
        if ask.answer_mode is not None:
            body["answer_mode"] = ask.answer_mode
        async with self._http.stream("POST", f"{self._url}/v1/answer", json=body) as response:
            if response.status_code != 200:
                await response.aread()
                collector.error = f"HTTP {response.status_code}: {response.text[:200]}"
                rejected = response.status_code in (429, 503)
                return collector.record("rejected" if rejected else "error")
            async for event in iter_events(response):
                if event.event == "sources":
                    collector.sources_event([s["doc_id"] for s in event.data["sources"]])
                elif event.event == "token":
                    collector.token(event.data["text"])
                elif event.event == "citation":
                    collector.citation(event.data.get("sources", []))
                elif event.event == "error":
                    collector.error = f"{event.data['code']}: {event.data['message']}"
                elif event.event == "done":
                    collector.done = event.data
        return collector.record()


async def collect_answers(
    source: AnsweringSource,
    questions: Sequence[Question],
    checkpoint: RunCheckpoint,
    ask: Ask,
    *,
    concurrency: int = 1,
    progress: bool = True,
) -> list[AnswerRecord]:
    """Answer every question not in the checkpoint, `concurrency` at a time."""
    todo = [q for q in questions if q.question_id not in checkpoint.done]
    pending = iter(todo)
    with tqdm(
        total=len(questions),
        initial=len(questions) - len(todo),
        unit="question",
        desc="answers",
        disable=not progress,
    ) as bar:

        async def worker() -> None:
            for question in pending:
                record = await source.answer(question, ask)
                checkpoint.record(question.question_id, asdict(record))
                bar.update(1)

        await asyncio.gather(*(worker() for _ in range(max(1, concurrency))))
    return [AnswerRecord.of(checkpoint.done[q.question_id]) for q in questions]


def _mean(values: Sequence[float]) -> float | None:
    return round(float(np.mean(values)), 4) if values else None


def score_answers(questions: Sequence[Question], records: Sequence[AnswerRecord]) -> dict[str, Any]:
    """The metrics of a run (see the module docstring). Failed requests score 0 on quality; an
    abstention on an answerable question is a miss."""
    by_id = {r.question_id: r for r in records}
    answerable = [q for q in questions if q.answers and not q.gold_removed]
    removed = [q for q in questions if q.gold_removed]
    unanswerable = [q for q in questions if not q.answers and not q.gold_removed]
    with_gold = [q for q in questions if q.gold_passage_id]
    precisions = [
        p
        for q in with_gold
        if (p := citation_precision(by_id[q.question_id].cited_doc_ids, [q.gold_passage_id or ""]))
        is not None
    ]
    answer = {r.question_id: strip_citations(r.answer) for r in records}
    ok = [r for r in records if r.status == "ok"]
    model = [r for r in ok if r.model_served]
    words = [len(answer[r.question_id].split()) for r in ok if not abstains(r.answer)]
    prompt_tokens = sum(r.prompt_tokens for r in records)
    forms = sorted({r.form for r in ok})
    return {
        "exact_match": _mean([exact_match(answer[q.question_id], q.answers) for q in answerable]),
        "f1": _mean([f1(answer[q.question_id], q.answers) for q in answerable]),
        "answer_recall": _mean(
            [answer_recall(answer[q.question_id], q.answers) for q in answerable]
        ),
        "citation_precision": _mean(precisions),
        "citation_recall": _mean(
            [
                citation_recall(by_id[q.question_id].cited_doc_ids, [q.gold_passage_id or ""])
                or 0.0
                for q in with_gold
            ]
        ),
        "cited_share": _mean([float(bool(by_id[q.question_id].cited_doc_ids)) for q in questions]),
        "gold_in_sources": _mean(
            [float(q.gold_passage_id in by_id[q.question_id].source_doc_ids) for q in with_gold]
        ),
        "abstention_rate": _mean(
            [float(abstains(by_id[q.question_id].answer)) for q in unanswerable + removed]
        ),
        # With its gold passage removed a question is answered right by abstaining, or by an
        # answer that still holds the gold string (from another passage).
        "right_when_gold_removed": _mean(
            [
                float(
                    abstains(by_id[q.question_id].answer)
                    or answer_recall(answer[q.question_id], q.answers) > 0
                )
                for q in removed
            ]
        ),
        "false_abstention_rate": _mean(
            [
                float(abstains(by_id[q.question_id].answer))
                for q in answerable
                if by_id[q.question_id].status == "ok"
            ]
        ),
        # What the reader got: an answer that says a sentence twice. Beside it, how often the
        # loop guard had to stop one (its repeat was then never shown).
        "repetition_rate": _mean([float(repeats(r)) for r in ok]),
        "repetition_stopped_rate": _mean([float(r.finish_reason == "repetition") for r in ok]),
        "unsupported_sentence_rate": round(
            sum(r.unsupported_sentences for r in model) / sum(r.sentences for r in model), 4
        )
        if sum(r.sentences for r in model)
        else None,
        "words": {
            "median": statistics.median(words) if words else None,
            "p90": round(float(np.percentile(words, 90)), 1) if words else None,
            "max": max(words) if words else None,
        },
        "by_form": {
            form: {
                "answers": sum(r.form == form for r in ok),
                "answer_recall": _mean(
                    [
                        answer_recall(answer[q.question_id], q.answers)
                        for q in answerable
                        if by_id[q.question_id].form == form
                    ]
                ),
            }
            for form in forms
        },
        "from_cache": sum(r.from_cache for r in ok),
        # The first token as the client saw it: answers the model gave now apart from those
        # given without it (a quote, the cache, an abstention), whose first token says nothing
        # about generation.
        "ttft_ms": percentiles([r.ttft_ms for r in records if r.ttft_ms is not None]),
        "ttft_ms_model": percentiles([r.ttft_ms for r in model if r.ttft_ms is not None]),
        "ttft_ms_without_model": percentiles(
            [r.ttft_ms for r in ok if not r.model_served and r.ttft_ms is not None]
        ),
        "e2e_ms": percentiles([r.e2e_ms for r in ok]),
        "cached_token_share": round(sum(r.cached_tokens for r in records) / prompt_tokens, 4)
        if prompt_tokens
        else None,
        "ok": len(ok),
        "model_served": len(model),
        "errored": sum(r.status == "error" for r in records),
        "rejected": sum(r.status == "rejected" for r in records),
    }


def repeats(record: AnswerRecord) -> bool:
    """Whether the answer, as the reader got it, says a sentence (of four words or more)
    twice."""
    seen: set[tuple[str, ...]] = set()
    for span in split_sentences(record.answer):
        words = tuple(normalize_answer(record.answer[span.start : span.end]).split())
        if len(words) >= 4:
            if words in seen:
                return True
            seen.add(words)
    return False
