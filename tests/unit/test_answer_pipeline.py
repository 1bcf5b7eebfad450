"""`AnswerPipeline` built from fakes that honour its protocols (a bag-of-words embedder over a
real faiss and BM25 index, a word template, a scripted generation client): the order of its
events, the plans that end without the model, the stage spans, the index a request keeps, and
a search mode added in one file plus its registration."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import NoReturn

import numpy as np
import numpy.typing as npt
import pytest

from answer_service.errors import ServiceError, StageTimeoutError, UpstreamUnavailableError
from answer_service.pipeline.answer_pipeline import AnswerPipeline
from answer_service.pipeline.events import (
    AnswerRequest,
    CitationEvent,
    DoneEvent,
    PipelineEvent,
    PlanEvent,
    SourcesEvent,
    TokenEvent,
)
from answer_service.pipeline.generation_steps import GenerationConfig
from answer_service.runtime.settings import Settings
from budget import Deadline
from budget.forms import AnswerMode
from generation.errors import SGLangUnavailableError
from generation.stages import PromptConfig
from retrieval.errors import RetrievalError
from retrieval.passage import ScoredPassage
from retrieval.retriever import Retriever
from retrieval.search.modes import register_mode, unregister_mode
from retrieval.sentences.reader import ReadMix
from retrieval.sentences.scorer import Candidate
from retrieval.stages import SentenceRequest
from tests.builders import DOCUMENTS, make_index, make_pipeline, slow_sentences
from tests.fakes import title_searcher
from tests.fakes.scripted_generation import ScriptedGeneration, words


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_index(tmp_path_factory.mktemp("pipeline"))


async def answer(pipeline: AnswerPipeline, query: str, **request: object) -> list[PipelineEvent]:
    fields: dict[str, object] = {"ttft_budget_ms": 5_000, "top_k": 3, **request}
    prepared = await pipeline.prepare(
        AnswerRequest(query, **fields),  # type: ignore[arg-type]
        Deadline.after_ms(float(fields["ttft_budget_ms"])),  # type: ignore[arg-type]
    )
    return [event async for event in pipeline.events(prepared)]


async def test_events_come_in_order_and_sources_are_what_the_model_saw(index_dir: Path) -> None:
    generation = ScriptedGeneration(words("Green tea steeps for two minutes."))
    pipeline, exporter = make_pipeline(index_dir, workers=[generation])
    events = await answer(pipeline, "How long is green tea steeped?", top_k=2)
    assert isinstance(events[0], PlanEvent)
    assert isinstance(events[1], SourcesEvent)
    assert isinstance(events[-1], DoneEvent)
    text = "".join(e.text for e in events if isinstance(e, TokenEvent))
    assert text == "Green tea steeps for two minutes."
    sources = events[1].sources
    assert [s.number for s in sources] == [1, 2]  # the prompt's numbering, and only its passages
    assert "tea#0" in {s.passage_id for s in sources}
    prompt = generation.prompts[0]
    for source in sources:
        assert f'<passage number="{source.number}" title="{source.title}">' in prompt
    (citation,) = [e.citation for e in events if isinstance(e, CitationEvent)]
    tea = next(s.number for s in sources if s.doc_id == "tea")
    assert citation.sources == (tea,)
    stats = events[-1].stats
    assert stats.outcome == "ok"
    assert stats.finish_reason == "stop"
    assert stats.passages_in_prompt == 2
    spans = {span.name: span for span in exporter.get_finished_spans()}
    assert {"answer", "embed", "search", "prompt", "generate"} <= set(spans)
    assert spans["search"].attributes["retrieval.mode"] == "hybrid"  # type: ignore[index]
    assert spans["prompt"].attributes["answer.prompt.passages"] == 2  # type: ignore[index]
    assert spans["answer"].attributes["answer.outcome"] == "ok"  # type: ignore[index]
    assert spans["generate"].attributes["gen_ai.usage.output_tokens"] == 6  # type: ignore[index]


async def test_a_copy_bias_raises_the_tokens_of_the_passages_the_model_is_given(
    index_dir: Path,
) -> None:
    """The copy bias: every token of the prompt's passages (the fake template's ids stand
    for their distinct words) goes to SGLang with the bias; without it, no logit_bias at all."""
    biased = ScriptedGeneration(words("Tea."))
    pipeline, _ = make_pipeline(
        index_dir,
        workers=[biased],
        generation=GenerationConfig(served_model="test/scripted", copy_bias={"passages": 3.0}),
        prompt=PromptConfig(vocabulary=True),
    )
    events = await answer(pipeline, "How long is green tea steeped?", top_k=2)
    sources = next(e for e in events if isinstance(e, SourcesEvent)).sources
    texts = [DOCUMENTS[s.doc_id][1] for s in sources]
    distinct = {word for text in texts for word in text.split()}
    (params,) = biased.params
    assert len(params.logit_bias) == len(distinct)
    assert {bias for _, bias in params.logit_bias} == {3.0}
    assert "logit_bias" in params.to_json()

    # A form the bias does not name gets none (here the focused excerpts).
    plain = ScriptedGeneration(words("Tea."))
    pipeline, _ = make_pipeline(
        index_dir,
        workers=[plain],
        answer_mode="focused",
        generation=GenerationConfig(served_model="test/scripted", copy_bias={"passages": 3.0}),
        prompt=PromptConfig(vocabulary=True),
    )
    events = await answer(pipeline, "How long is green tea steeped?", top_k=2)
    assert events[-1].stats.form == "focused"  # type: ignore[attr-defined]
    assert plain.params[0].logit_bias == ()
    assert "logit_bias" not in plain.params[0].to_json()


async def test_weak_evidence_is_answered_without_the_model(
    index_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whole passages asked for: their prompt went to the model before the sentences were
    scored (slowed here, as if the model were decoding meanwhile), so it is aborted and its
    prefill counted as wasted; no model text reaches the answer."""
    generation = ScriptedGeneration(words("never asked"))
    pipeline, _ = make_pipeline(index_dir, workers=[generation], abstain_below=None)
    slow_sentences(monkeypatch, pipeline, 0.2)
    events = await answer(pipeline, "Which orchestra recorded the Goldberg variations?")
    assert len(generation.prompts) == 1
    assert len(generation.aborted) == 1
    text = "".join(e.text for e in events if isinstance(e, TokenEvent))
    assert text.startswith("I do not know")
    assert "never" not in text
    done = events[-1]
    assert isinstance(done, DoneEvent)
    assert done.stats.outcome == "abstained"
    assert done.stats.wasted_prefill_tokens > 0
    assert done.stats.prompt_tokens == 0  # nothing the model said was used
    assert len(events[1].sources) == 3  # type: ignore[attr-defined]  # the closest, listed
    assert pipeline.planning.gate.requests_ahead(generation.base_url) == 0  # its slot is back


async def test_a_prompt_sent_ahead_is_aborted_when_the_decision_fails(
    index_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sentences fail after the prompt was sent: the request gets the retrieval error, and
    the model's request is aborted and its slot given back (nothing left running)."""
    generation = ScriptedGeneration(words("never read"))
    pipeline, _ = make_pipeline(index_dir, workers=[generation])

    async def failing(request: SentenceRequest, deadline: Deadline) -> object:
        await asyncio.sleep(0.2)
        raise RetrievalError("sentence vectors unreadable")

    monkeypatch.setattr(pipeline.retriever.sentences, "run", failing)
    with pytest.raises(ServiceError, match="sentence vectors unreadable"):
        await pipeline.prepare(
            AnswerRequest("How long is green tea steeped?", 5_000, 3), Deadline.after_ms(5_000)
        )
    assert len(generation.prompts) == 1
    assert len(generation.aborted) == 1
    assert pipeline.planning.gate.requests_ahead(generation.base_url) == 0


class _Unreachable(ScriptedGeneration):
    async def open_stream(self, *args: object, **kwargs: object) -> NoReturn:
        raise SGLangUnavailableError("connection refused")


async def test_a_prompt_that_could_not_be_sent_ahead_fails_only_an_answer_that_needs_it(
    index_dir: Path,
) -> None:
    """The model unreachable: an answer that needed it fails as it would have, but "I do not
    know" did not need the model and is still given."""
    down = _Unreachable(words("never"))
    pipeline, _ = make_pipeline(index_dir, workers=[down], abstain_below=1.01)
    events = await answer(pipeline, "How long is green tea steeped?")
    done = events[-1]
    assert isinstance(done, DoneEvent)
    assert (done.stats.outcome, done.stats.wasted_prefill_tokens) == ("abstained", 0)

    pipeline, _ = make_pipeline(index_dir, workers=[_Unreachable(words("never"))])
    with pytest.raises(UpstreamUnavailableError, match="connection refused"):
        await answer(pipeline, "How long is green tea steeped?")
    assert pipeline.planning.gate.requests_ahead(down.base_url) == 0


async def test_weak_evidence_sends_nothing_where_the_form_is_not_known_first(
    index_dir: Path,
) -> None:
    """Under `auto` (the form is chosen after the evidence) nothing is sent ahead: the
    abstention costs the model nothing."""
    generation = ScriptedGeneration(words("never asked"))
    pipeline, _ = make_pipeline(
        index_dir, workers=[generation], abstain_below=None, answer_mode="auto"
    )
    events = await answer(pipeline, "Which orchestra recorded the Goldberg variations?")
    assert generation.prompts == []
    done = events[-1]
    assert isinstance(done, DoneEvent)
    assert done.stats.outcome == "abstained"
    assert done.stats.wasted_prefill_tokens == 0


async def test_a_request_keeps_the_index_it_started_on(index_dir: Path, tmp_path: Path) -> None:
    """An index swapped in while a request waits for its generation slot: the request still
    lays its prompt out and lists its sources from the index it retrieved from (here a passage
    a remembered prefix brings along, which the new index does not hold)."""
    generation = ScriptedGeneration(words("Tea."))
    pipeline, _ = make_pipeline(index_dir, workers=[generation], prompt=PromptConfig(adopt=1))
    await answer(pipeline, "green tea coffee espresso", top_k=2)  # remembers [coffee, tea]
    held = await pipeline.planning.gate.acquire(generation.base_url, "standard", 0)
    task = asyncio.create_task(
        pipeline.prepare(
            AnswerRequest("tea steeped minutes Danube river", 5_000, 2), Deadline.after_ms(5_000)
        )
    )
    await asyncio.sleep(0.05)  # retrieved, now waiting for the slot
    assert not task.done()
    other = make_index(tmp_path, {"tea": DOCUMENTS["tea"], "river": DOCUMENTS["river"]})
    pipeline.swap_retriever(Retriever.open(other, pipeline.retriever.embedder), None)
    held.release()
    prepared = await task
    events = [event async for event in pipeline.events(prepared)]
    sources = next(e for e in events if isinstance(e, SourcesEvent)).sources
    assert (sources[0].passage_id, sources[0].score) == ("coffee#0", 0.0)  # adopted
    assert "coffee" in generation.prompts[-1].lower()


async def test_a_slot_that_comes_free_too_late_sends_nothing(index_dir: Path) -> None:
    """Requests queued together share a deadline: when the one holding the slot gives up, the
    next must not start a generation it has no time left to see a first token of."""
    generation = ScriptedGeneration(words("Tea."))
    pipeline, _ = make_pipeline(index_dir, workers=[generation])
    for _ in range(8):  # this worker takes 800 ms to any first token
        pipeline.planning.models.observe("first_token", 0.0, 800.0, generation.base_url)
    held = await pipeline.planning.gate.acquire(generation.base_url, "standard", 0)
    # Budget 500 ms: given up on at 2 s (x4); the slot comes free with ~500 ms left.
    task = asyncio.create_task(
        pipeline.prepare(AnswerRequest("tea steeped minutes", 500, 2), Deadline.after_ms(500))
    )
    await asyncio.sleep(1.5)
    assert not task.done()
    held.release()
    with pytest.raises(StageTimeoutError, match="came free too late"):
        await task
    assert generation.prompts == []
    assert pipeline.planning.gate.pending_tokens(generation.base_url) == 0


@pytest.fixture
def title_mode() -> Iterator[None]:
    register_mode("title", title_searcher.build)
    yield
    unregister_mode("title")


async def test_a_search_mode_added_in_one_file_serves_answers(
    index_dir: Path, title_mode: None
) -> None:
    assert Settings(retrieval_mode="title").retrieval_mode == "title"
    pipeline, exporter = make_pipeline(index_dir, mode="title")
    assert "title" in pipeline.retriever.modes()
    events = await answer(pipeline, "What about the moon?", top_k=1)
    assert [s.doc_id for s in events[1].sources] == ["moon"]  # type: ignore[attr-defined]
    spans = {span.name: span for span in exporter.get_finished_spans()}
    assert spans["search"].attributes["retrieval.mode"] == "title"  # type: ignore[index]
    # The mode needs no vector: it searches first; the query is embedded after, for the
    # sentence scorer.
    assert spans["search"].start_time < spans["embed"].start_time  # type: ignore[operator]


def test_an_unknown_search_mode_is_refused_by_the_settings() -> None:
    with pytest.raises(ValueError, match="retrieval_mode 'title'"):
        Settings(retrieval_mode="title")


class _Listener:
    def __init__(self) -> None:
        self.refusals: list[str] = []

    def answered(self, *_: object) -> None:
        pass

    def refused(self, *, trace_id: str, tier: str, code: str, budget_ms: float) -> None:
        self.refusals.append(code)


class _BrokenSearcher:
    mode = "broken"
    needs_vector = False

    def search(self, request: object) -> list[ScoredPassage]:
        raise ValueError("a bug in a search mode")


async def test_an_unexpected_error_before_streaming_counts_as_an_error(
    index_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Not as a cancellation: the request failed, and the log says with what."""
    register_mode("broken", lambda index, config: _BrokenSearcher())
    try:
        pipeline, exporter = make_pipeline(index_dir, mode="broken")
        listener = _Listener()
        pipeline.listener = listener
        with pytest.raises(ValueError, match="a bug"):
            await answer(pipeline, "anything")
    finally:
        unregister_mode("broken")
    assert listener.refusals == ["error"]
    assert "ValueError: a bug in a search mode" in caplog.text
    root = next(s for s in exporter.get_finished_spans() if s.name == "answer")
    assert root.attributes["answer.outcome"] == "ValueError"  # type: ignore[index]


class _CountingReader:
    """A reader that scores every sentence alike and counts the questions it read for."""

    name = "counting"

    def __init__(self) -> None:
        self.questions: list[str] = []

    def read(self, question: str, found: Sequence[Candidate]) -> npt.NDArray[np.float64]:
        self.questions.append(question)
        return np.zeros(len(found))


@pytest.mark.parametrize(("mode", "reads"), [("passages", False), ("quote", True)])
async def test_the_reader_reads_only_for_an_answer_made_of_sentences(
    index_dir: Path, mode: AnswerMode, reads: bool
) -> None:
    """The reader orders sentences; an answer over whole passages never uses that order, so it
    does not wait for it, while a quote reads once its form is chosen (a reader always in doubt
    here)."""
    reader = _CountingReader()
    always = ReadMix(depth=4, doubt=1.01, weight=1.0)
    pipeline, exporter = make_pipeline(index_dir, answer_mode=mode, reader=(reader, always))
    events = await answer(pipeline, "How long is green tea steeped?", top_k=2)
    assert events[-1].stats.form == mode  # type: ignore[union-attr]
    names = [span.name for span in exporter.get_finished_spans() if span.name != "answer"]
    assert reader.questions == (["How long is green tea steeped?"] if reads else [])
    assert ("read" in names) == reads
    if reads:
        assert names.index("form") < names.index("read") < names.index("quote")
