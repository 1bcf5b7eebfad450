"""A follow-up is searched as the rewrite makes it and read as it was asked (`Queries`): the
search finds the earlier turn's page through the carried words, while the sentence scorer, the
reader, abstention, the form and the quote weigh the follow-up's own words, so the quote answers
the follow-up rather than the question before it. The answer cache keys on both."""

from __future__ import annotations

from pathlib import Path

import pytest

from answer_service.pipeline.answer_pipeline import AnswerPipeline
from answer_service.pipeline.events import (
    AnswerRequest,
    DoneEvent,
    PipelineEvent,
    PlanEvent,
    Queries,
    TokenEvent,
)
from answer_service.pipeline.forms import FormConfig, FormPolicy, read_form_curves
from answer_service.pipeline.planning import PlanningConfig, RequestPlanning
from answer_service.pipeline.stages import EvidenceStage
from answer_service.runtime.caches import AnswerCache, SharedCache
from budget import Deadline
from budget.forms import AnswerMode
from budget.stage import StageResult
from retrieval.query_rewrite import Turn
from retrieval.sentences.quote import read_quote_config
from retrieval.sentences.scorer import ScoredSentence
from retrieval.stages import SentenceRequest
from tests.builders import make_index, make_pipeline, scored_page
from tests.fakes.scripted_generation import ScriptedGeneration, words

PAGES = {
    "vacuum": (
        "VACUUM FULL",
        "VACUUM FULL rewrites the whole table into a new file and returns the space of dead "
        "rows to the operating system. "
        "While it works, VACUUM FULL holds an ACCESS EXCLUSIVE lock on the table.",
    ),
    "analyze": ("ANALYZE", "ANALYZE collects statistics about the contents of tables."),
    "tea": ("Green tea", "Green tea is steeped for two minutes in water at 80 degrees."),
    "volcano": ("Volcanoes", "Mount Etna is an active volcano on the island of Sicily."),
}
FIRST = "Which command returns the space of dead rows to the operating system?"
FOLLOW_UP = "What lock does it hold?"


@pytest.fixture(scope="module")
def pages_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_index(tmp_path_factory.mktemp("pages"), PAGES)


class _Recording:
    """The retriever's sentence stage, recording the question each request is read with."""

    def __init__(self, inner: object) -> None:
        self._inner = inner
        self.name = "sentences"
        self.questions: list[str] = []

    async def run(
        self, request: SentenceRequest, deadline: Deadline
    ) -> StageResult[list[ScoredSentence]]:
        self.questions.append(request.question)
        return await self._inner.run(request, deadline)  # type: ignore[attr-defined,no-any-return]


async def _answer(
    pipeline: AnswerPipeline,
    query: str,
    history: tuple[Turn, ...] = (),
    mode: AnswerMode = "quote",
) -> list[PipelineEvent]:
    request = AnswerRequest(query, 5_000, 3, answer_mode=mode, history=history)
    prepared = await pipeline.prepare(request, Deadline.after_ms(5_000))
    try:
        return [event async for event in pipeline.events(prepared)]
    finally:
        prepared.close_nowait()


def _said(events: list[PipelineEvent]) -> str:
    return "".join(e.text for e in events if isinstance(e, TokenEvent))


HISTORY = (Turn("user", FIRST), Turn("assistant", "VACUUM FULL returns the space."))


async def test_a_follow_up_is_searched_with_carried_words_and_read_in_its_own(
    pages_dir: Path,
) -> None:
    pipeline, _ = make_pipeline(pages_dir, answer_mode="quote")
    recording = _Recording(pipeline.retriever.sentences)
    pipeline.retriever.sentences = recording  # type: ignore[assignment]
    events = await _answer(pipeline, FOLLOW_UP, HISTORY)
    plan = next(e for e in events if isinstance(e, PlanEvent))
    assert plan.searched_query.startswith(f"{FOLLOW_UP} ")
    assert "space" in plan.searched_query
    # Read with the entities "it" points back to (the answer named them), not the plain words;
    # scored for the searched query too, for abstention alone.
    assert recording.questions == [f"{FOLLOW_UP} VACUUM FULL", plan.searched_query]
    said = _said(events)
    assert "ACCESS EXCLUSIVE" in said
    assert "operating system" not in said


async def test_a_question_alone_is_searched_and_read_alike(pages_dir: Path) -> None:
    pipeline, _ = make_pipeline(pages_dir, answer_mode="quote")
    recording = _Recording(pipeline.retriever.sentences)
    pipeline.retriever.sentences = recording  # type: ignore[assignment]
    events = await _answer(pipeline, FIRST)
    plan = next(e for e in events if isinstance(e, PlanEvent))
    assert plan.searched_query == FIRST
    assert recording.questions == [FIRST]
    assert "operating system" in _said(events)


def _from_cache(events: list[PipelineEvent]) -> bool:
    done = events[-1]
    assert isinstance(done, DoneEvent)
    return done.stats.from_cache


async def test_a_follow_up_is_cached_under_what_it_searched_and_what_it_read(
    pages_dir: Path,
) -> None:
    # Generated answers are the ones cached; the model is asked the follow-up as searched.
    generation = ScriptedGeneration(words("It holds an ACCESS EXCLUSIVE lock."))
    pipeline, _ = make_pipeline(pages_dir, workers=[generation], answer_mode="passages")
    pipeline.answer_cache = AnswerCache(SharedCache(None, "a", ttl_s=60, capacity=8), "fp")
    followed = await _answer(pipeline, FOLLOW_UP, HISTORY, mode="passages")
    searched = next(e for e in followed if isinstance(e, PlanEvent)).searched_query
    assert searched in generation.prompts[0]
    assert not _from_cache(followed)
    assert _from_cache(await _answer(pipeline, FOLLOW_UP, HISTORY, mode="passages"))
    # The searched words asked alone are searched alike but read whole: not the follow-up's.
    assert not _from_cache(await _answer(pipeline, searched, mode="passages"))


def test_the_answer_key_holds_the_read_query_only_where_it_differs() -> None:
    cache = AnswerCache(SharedCache(None, "answer", ttl_s=60, capacity=8), "fp")
    searched = f"{FOLLOW_UP} returns space dead rows operating system"
    plain = cache.key(searched, 5, "quote")
    assert cache.key(searched, 5, "quote", read=None) == plain
    assert cache.key(searched, 5, "quote", read=FOLLOW_UP) != plain
    assert cache.key(searched, 5, "quote", read=FOLLOW_UP) != cache.key(
        searched, 5, "quote", read="What lock?"
    )
    # The read query is its own line, before the scope: no query or scope can forge it.
    scoped = cache.key(searched, 5, "quote", "c=*|p=|t=", read=FOLLOW_UP)
    assert scoped != cache.key(searched, 5, "quote", f"read\t{FOLLOW_UP}\nc=*|p=|t=")


def test_queries_of_a_question_alone_are_not_split() -> None:
    assert not Queries.of("What is MVCC?").split
    assert Queries("What lock? VACUUM", "What lock?").split


async def test_the_evidence_of_a_follow_up_is_its_stronger_reading() -> None:
    # Its own words may say little ("stop one of them"); the searched query's reading counts.
    planning = RequestPlanning(PlanningConfig(enabled=False), ["http://worker"])
    policy = FormPolicy(FormConfig(quote=read_quote_config()), planning, read_form_curves())
    stage = EvidenceStage(policy)
    text = "pg_cancel_backend cancels the current query. It returns true."
    weak = scored_page(text, {"pg_cancel": 0.05})
    strong = scored_page(text, {"pg_cancel": 0.9})
    alone = await stage.run([weak], Deadline.after_ms(100))
    both = await stage.run([weak, strong], Deadline.after_ms(100))
    assert alone.value == pytest.approx(0.05)
    assert both.value == pytest.approx(0.9)
