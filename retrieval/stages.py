"""Retrieval's stages, each `run(request, deadline) -> StageResult` (budget/stage.py): embed the
query, search in one mode, rerank, score the sentences of what was found, read the best of them
where the scorer is in doubt, find the short answer in a quote. Their blocking work runs on the
retriever's bounded pool."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from budget import Deadline
from budget.planner import query_tokens
from budget.stage import AttributeValue, StageCut, StageResult
from retrieval.embedder import Embedder, Vectors
from retrieval.errors import RetrievalTimeoutError
from retrieval.index.loaded import LoadedIndex
from retrieval.passage import ScoredPassage
from retrieval.pool import StagePool
from retrieval.rerank.base import Reranker, RerankRequest
from retrieval.search.base import Searcher, SearchRequest
from retrieval.sentences.reader import Reader, ReadMix, reread, to_read
from retrieval.sentences.scorer import ScoredSentence, SentenceScorer
from retrieval.sentences.span import ShortFinder, ShortSpan


class EmbedStage:
    """The query's embedding. Work: the query's tokens (about four characters a token)."""

    name = "embed"

    def __init__(self, embedder: Embedder, pool: StagePool) -> None:
        self._embedder = embedder
        self._pool = pool

    async def run(self, request: str, deadline: Deadline) -> StageResult[Vectors]:
        timed = await self._pool.run(self.name, deadline, lambda: self._embedder.encode([request]))
        return StageResult(timed.value, timed.elapsed_ms, work=query_tokens(request))


class SearchStage:
    """One mode's search. Work: the candidates asked for."""

    name = "search"

    def __init__(self, searcher: Searcher, pool: StagePool, index_passages: int) -> None:
        self.searcher = searcher
        self._pool = pool
        self._index_passages = index_passages

    async def run(
        self, request: SearchRequest, deadline: Deadline
    ) -> StageResult[list[ScoredPassage]]:
        timed = await self._pool.run(self.name, deadline, lambda: self.searcher.search(request))
        return StageResult(
            timed.value,
            timed.elapsed_ms,
            work=request.k,
            attributes={
                "retrieval.mode": self.searcher.mode,
                "retrieval.k": request.k,
                "retrieval.index.passages": self._index_passages,
                "retrieval.results": len(timed.value),
                "retrieval.filtered": request.allowed is not None,
                **(
                    {"retrieval.allowed_passages": len(request.allowed)}
                    if request.allowed is not None
                    else {}
                ),
            },
        )


class RerankStage:
    """The reranker's order of the first candidates; when its slice runs out, the candidates
    in retrieval order with a cut (the stage's thread finishes in the background).
    Work: the candidates scored."""

    name = "rerank"

    def __init__(self, reranker: Reranker, pool: StagePool) -> None:
        self.reranker = reranker
        self._pool = pool

    async def run(
        self, request: RerankRequest, deadline: Deadline
    ) -> StageResult[list[ScoredPassage]]:
        candidates: Sequence[ScoredPassage] = request.candidates
        attributes: dict[str, AttributeValue] = {
            "rerank.model": self.reranker.name,
            "rerank.candidates": len(candidates),
            "rerank.top_n": request.top_n,
        }
        in_order = list(candidates[: request.top_n])
        if deadline.expired:
            cut = StageCut("rerank skipped: deadline already spent", 0)
            return StageResult(in_order, 0.0, cut=cut, attributes=attributes)
        try:
            timed = await self._pool.run(self.name, deadline, lambda: self.reranker.rerank(request))
        except RetrievalTimeoutError:
            cut = StageCut("rerank timed out: retrieval order", 0)
            return StageResult(in_order, deadline.elapsed_ms(), cut=cut, attributes=attributes)
        return StageResult(
            timed.value, timed.elapsed_ms, work=len(candidates), attributes=attributes
        )


@dataclass(frozen=True, slots=True)
class SentenceRequest:
    question: str
    vector: Vectors
    # The retrieved passages, best first, whose sentences are scored.
    passages: Sequence[ScoredPassage]


class SentenceStage:
    """The sentences of the retrieved passages, most likely to answer first (the sentence
    scorer: stored vectors, no model call). Work: the sentences scored."""

    name = "sentences"

    def __init__(self, scorer: SentenceScorer, index: LoadedIndex, pool: StagePool) -> None:
        self.scorer = scorer
        self._index = index
        self._pool = pool

    async def run(
        self, request: SentenceRequest, deadline: Deadline
    ) -> StageResult[list[ScoredSentence]]:
        rows = [(self._index.row_of(p.passage.passage_id), p.passage) for p in request.passages]
        timed = await self._pool.run(
            self.name, deadline, lambda: self.scorer.score(request.question, request.vector, rows)
        )
        best = timed.value[0].probability if timed.value else 0.0
        return StageResult(
            timed.value,
            timed.elapsed_ms,
            work=len(timed.value),
            attributes={"sentences.scored": len(timed.value), "sentences.best": round(best, 4)},
        )


@dataclass(frozen=True, slots=True)
class ReadRequest:
    question: str
    # The sentence stage's ranking, best first.
    sentences: Sequence[ScoredSentence]


class ReadStage:
    """The first pass reordered by the reader (retrieval/sentences/reader.py), which reads the
    scorer's best few sentences where the scorer is in doubt. Where its slice is shorter than
    reading is expected to take (its own running mean per sentence read), it does not start;
    where a read outlasts the slice, the first pass with a cut (the thread finishes in the
    background). Work: the sentences read."""

    name = "read"
    # Before any read is timed: a sentence pair through a MiniLM-sized encoder on two cores.
    PRIOR_MS_PER_SENTENCE = 20.0

    def __init__(self, reader: Reader, mix: ReadMix, pool: StagePool) -> None:
        self.reader = reader
        self.mix = mix
        self._pool = pool
        self._ms_per_sentence = self.PRIOR_MS_PER_SENTENCE

    def expected_ms(self, sentences: int) -> float:
        return sentences * self._ms_per_sentence

    async def run(
        self, request: ReadRequest, deadline: Deadline
    ) -> StageResult[list[ScoredSentence]]:
        first = list(request.sentences)
        wanted = len(to_read(first, self.mix))
        attributes: dict[str, AttributeValue] = {
            "read.model": self.reader.name,
            "read.asked": wanted,
        }
        left_ms, needed_ms = deadline.remaining_ms(), self.expected_ms(wanted)
        if not wanted or left_ms < needed_ms:
            # The scorer is sure (or nothing is quotable), or there is no time: its order.
            unread, _ = reread(first, self.mix, None)
            reason = f"read skipped: {left_ms:.0f} ms left, ~{needed_ms:.0f} ms needed"
            cut = StageCut(reason, 0) if wanted else None
            return StageResult(unread, 0.0, cut=cut, attributes={**attributes, "read.sentences": 0})

        def call() -> tuple[list[ScoredSentence], int]:
            return reread(first, self.mix, lambda found: self.reader.read(request.question, found))

        try:
            timed = await self._pool.run(self.name, deadline, call)
        except RetrievalTimeoutError:
            unread, _ = reread(first, self.mix, None)
            cut = StageCut("read timed out: the scorer's order", 0)
            return StageResult(unread, deadline.elapsed_ms(), cut=cut, attributes=attributes)
        ranked, read = timed.value
        if read:
            observed = timed.elapsed_ms / read
            self._ms_per_sentence += 0.2 * (observed - self._ms_per_sentence)
        return StageResult(
            ranked, timed.elapsed_ms, work=read, attributes={**attributes, "read.sentences": read}
        )


@dataclass(frozen=True, slots=True)
class ShortAnswerRequest:
    question: str
    # The quoted sentence, as it is sent.
    sentence: str


class ShortAnswerStage:
    """The short answer inside a quoted sentence (retrieval/sentences/span.py): one encoder
    pass over (question, sentence). Not planned: where the time is gone it gives none (a cut),
    and the quote is sent without it. Work: none (one pass, whatever the question)."""

    name = "short_answer"

    def __init__(self, finder: ShortFinder, pool: StagePool) -> None:
        self.finder = finder
        self._pool = pool

    async def run(
        self, request: ShortAnswerRequest, deadline: Deadline
    ) -> StageResult[ShortSpan | None]:
        if deadline.remaining_ms() <= 0:
            return StageResult(None, 0.0, cut=StageCut("short answer skipped: no time left", 0))
        try:
            timed = await self._pool.run(
                self.name, deadline, lambda: self.finder.find(request.question, request.sentence)
            )
        except RetrievalTimeoutError:
            cut = StageCut("short answer timed out", 0)
            return StageResult(None, deadline.elapsed_ms(), cut=cut)
        found = timed.value
        attributes: dict[str, AttributeValue] = {"short_answer.found": found is not None}
        if found is not None:
            attributes["short_answer.score"] = round(found.score, 4)
        return StageResult(found, timed.elapsed_ms, attributes=attributes)
