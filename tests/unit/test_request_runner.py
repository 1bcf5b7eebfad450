"""The one runner over a whole request, driven with fake stages (issue 39): it runs each stage
under its slice in a span of its own, teaches the planner's model only of the planned stages,
and hands back the plan `budget/` makes of the result; through a pipeline of fakes, a request is
admitted or turned to a quote, a stage's cut changes the plan, the prompt is re-planned, and a
generated answer's stream up to its first token is a stage too. A stage added in one line (a
query rewrite) is run, spanned and searched with like the others; a follow-up is rewritten in a
`rewrite` span ahead of the answer cache, and its plan names the query searched."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from answer_service.pipeline.answer_pipeline import AnswerPipeline
from answer_service.pipeline.events import AnswerRequest, DoneEvent, PipelineEvent, PlanEvent
from answer_service.pipeline.planning import PlanningConfig, RequestPlanning
from answer_service.pipeline.stage_runner import StageRunner
from answer_service.runtime.caches import AnswerCache, SharedCache
from budget import CacheEstimator, Deadline
from budget.forms import QualityCurves
from budget.planner import StageName
from budget.stage import StageCut, StageResult
from retrieval.passage import ScoredPassage
from retrieval.query_rewrite import Turn
from retrieval.rerank.base import RerankRequest
from tests.builders import make_index, make_pipeline
from tests.fakes.scripted_generation import ScriptedGeneration, words
from tests.fakes.word_overlap_reranker import WordOverlapReranker
from tests.support import assert_stage_order

W = "http://worker"


class _Observer:
    def __init__(self) -> None:
        self.seen: list[tuple[str, float, float, str]] = []

    def observe(self, stage: StageName, work: float, elapsed_ms: float, worker: str = "") -> None:
        self.seen.append((stage, work, elapsed_ms, worker))


class _FakeStage:
    """Returns what it is given, taking `elapsed_ms` and reporting `cut` and `work`."""

    def __init__(
        self, name: str, elapsed_ms: float, work: float | None = None, cut: StageCut | None = None
    ) -> None:
        self.name = name
        self._result = (elapsed_ms, work, cut)
        self.deadlines: list[float] = []

    async def run(self, request: str, deadline: Deadline) -> StageResult[str]:
        elapsed_ms, work, cut = self._result
        self.deadlines.append(deadline.remaining_ms())
        return StageResult(request, elapsed_ms, work, cut, {"fake.size": len(request)})


def _runner() -> tuple[StageRunner, InMemorySpanExporter, _Observer]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    observer = _Observer()
    return StageRunner(provider.get_tracer("test"), observer), exporter, observer


def _plan(top_k: int = 3):  # type: ignore[no-untyped-def]
    # The fixed configuration: a rerank depth of 10 where there is a reranker.
    planning = RequestPlanning(PlanningConfig(enabled=False, fixed_rerank_depth=10), [W])
    return planning.start("a question", top_k, 20_000, 20_000, "standard", True, CacheEstimator())


async def test_the_runner_spans_a_stage_and_returns_the_plan_budget_makes_of_it() -> None:
    runner, exporter, observer = _runner()
    plan = _plan()
    embed = _FakeStage("embed", 7.5, work=3)
    result, after = await runner.run(embed, "query", Deadline.after_ms(1_000), plan)
    assert result.value == "query"
    assert after.actual.embed == 7.5
    assert plan.actual.embed == 0.0  # a new plan; the old one is kept as it was
    assert observer.seen == [("embed", 3, 7.5, "")]
    (span,) = exporter.get_finished_spans()
    assert span.name == "embed"
    assert span.attributes is not None
    assert span.attributes["fake.size"] == 5
    assert span.attributes["answer.stage.elapsed_ms"] == 7.5
    assert 0 < span.attributes["answer.stage.budget_ms"] <= 1_000  # type: ignore[operator]


async def test_a_cut_changes_the_knob_its_stage_sets_and_an_unplanned_stage_teaches_nothing() -> (
    None
):
    runner, exporter, observer = _runner()
    plan = _plan()
    assert plan.knobs.rerank_depth > 0
    rerank = _FakeStage("rerank", 40.0, work=10, cut=StageCut("rerank timed out", 0))
    _, plan = await runner.run(rerank, "q", Deadline.after_ms(1_000), plan)
    assert plan.knobs.rerank_depth == 0
    assert [(c.stage, c.reason, c.done) for c in plan.cuts] == [("rerank", "rerank timed out", 0)]
    # The generation re-plan: the prompt laid out with fewer passages than planned.
    assert plan.knobs.passages == 3
    prompt = _FakeStage("prompt", 3.0, work=1, cut=StageCut("first token predicted late", 1))
    _, plan = await runner.run(prompt, "q", Deadline.after_ms(1_000), plan)
    assert plan.knobs.passages == 1
    assert (plan.cuts[-1].stage, plan.cuts[-1].planned, plan.cuts[-1].done) == ("passages", 3, 1)
    assert plan.actual.prompt == 3.0
    passages = plan.knobs.passages
    rewrite = _FakeStage("rewrite", 2.0, work=1, cut=StageCut("kept the question", 0))
    _, plan = await runner.run(rewrite, "q", Deadline.after_ms(1_000), plan)
    assert plan.knobs.passages == passages  # a stage that sets no knob: its cut is recorded
    assert plan.cuts[-1].stage == "rewrite"
    assert [seen[0] for seen in observer.seen] == ["rerank", "prompt"]  # no model of "rewrite"
    assert exporter.get_finished_spans()[0].attributes["answer.degraded"] == "rerank timed out"  # type: ignore[index]


async def test_a_failing_stage_ends_its_span_with_the_error() -> None:
    runner, exporter, _ = _runner()

    class Broken:
        name = "search"

        async def run(self, request: str, deadline: Deadline) -> StageResult[str]:
            raise RuntimeError("index gone")

    with pytest.raises(RuntimeError, match="index gone"):
        await runner.run(Broken(), "q", Deadline.after_ms(1_000), _plan())
    (span,) = exporter.get_finished_spans()
    assert span.name == "search"
    assert not span.status.is_ok


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_index(tmp_path_factory.mktemp("runner"))


async def _answer(
    pipeline: AnswerPipeline, query: str, budget_ms: int = 5_000, **fields: object
) -> list[PipelineEvent]:
    request = AnswerRequest(query, budget_ms, 3, **fields)  # type: ignore[arg-type]
    prepared = await pipeline.prepare(request, Deadline.after_ms(budget_ms))
    return [event async for event in pipeline.events(prepared)]


def _spans(exporter: InMemorySpanExporter) -> list[str]:
    """The spans of the last request, in the order they started."""
    spans = sorted(exporter.get_finished_spans(), key=lambda s: s.start_time or 0)
    last = spans[-1] if spans[-1].name == "answer" else next(s for s in spans if s.name == "answer")
    trace_id = last.context.trace_id  # type: ignore[union-attr]
    return [s.name for s in spans if s.context and s.context.trace_id == trace_id]


async def test_a_generated_answer_runs_every_step_as_a_stage(index_dir: Path) -> None:
    generation = ScriptedGeneration(words("Green tea steeps for two minutes."))
    pipeline, exporter = make_pipeline(index_dir, workers=[generation], answer_mode="passages")
    events = await _answer(pipeline, "How long is green tea steeped?")
    done = events[-1]
    assert isinstance(done, DoneEvent)
    # Whole passages asked for: the prompt is sent as soon as they are final.
    assert_stage_order(_spans(exporter))
    assert done.stats.wasted_prefill_tokens == 0
    stages = done.stats.stages
    assert stages.first_token > 0
    assert stages.generate > 0
    assert stages.prompt > 0
    plan = next(e for e in events if isinstance(e, PlanEvent)).record
    assert plan.form == "passages"
    assert plan.worker == generation.base_url


async def test_a_quoted_answer_ends_with_the_quote_stage(index_dir: Path) -> None:
    generation = ScriptedGeneration(words("never asked"))
    pipeline, exporter = make_pipeline(index_dir, workers=[generation], answer_mode="quote")
    events = await _answer(pipeline, "How long is green tea steeped?")
    assert _spans(exporter) == [
        "answer",
        "embed",
        "search",
        "sentences",
        "evidence",
        "form",
        "quote",
    ]
    assert events[-1].stats.form == "quote"  # type: ignore[attr-defined]
    assert generation.prompts == []


async def test_admission_turns_a_request_no_generation_can_make_into_a_quote(
    index_dir: Path,
) -> None:
    generation = ScriptedGeneration(words("never asked"))
    pipeline, exporter = make_pipeline(
        index_dir,
        workers=[generation],
        answer_mode="auto",
        planning=PlanningConfig(enabled=True),
        # A model whose answers beat the quote: `auto` plans a generation first.
        form_quality=QualityCurves({"quote": (0.5,), "passages": (0.7, 0.8)}),
    )
    # 60 ms: the shipped priors put the smallest generated answer's first token past it.
    events = await _answer(pipeline, "How long is green tea steeped?", budget_ms=60)
    plan = next(e for e in events if isinstance(e, PlanEvent)).record
    assert plan.form == "quote"
    assert plan.form_reason == "no generation makes the budget: a quote"
    assert plan.knobs.rerank_depth == 0
    assert generation.prompts == []
    names = _spans(exporter)
    assert names[-1] == "quote"
    assert "form" not in names  # admission chose the form
    assert "slot" not in names


async def test_auto_is_planned_as_a_quote_where_the_quote_is_expected_to_answer_best(
    index_dir: Path,
) -> None:
    generation = ScriptedGeneration(words("never asked"))
    pipeline, exporter = make_pipeline(
        index_dir,
        workers=[generation],
        answer_mode="auto",
        planning=PlanningConfig(enabled=True),
        # The shipped curves for SmolLM2: the quote 0.82, generated forms at most 0.39.
    )
    events = await _answer(pipeline, "How long is green tea steeped?", budget_ms=3_000)
    plan = next(e for e in events if isinstance(e, PlanEvent)).record
    assert (plan.form, plan.form_reason) == ("quote", "auto: the quote is expected to answer best")
    assert plan.predicted_ms.first_token == plan.predicted_ms.prompt == 0.0  # none to pay for
    assert plan.floor_ms > 0  # still the smallest generated answer's, for /readyz
    assert generation.prompts == []
    names = _spans(exporter)
    assert names[-1] == "quote"
    assert "slot" not in names


async def test_a_cut_rerank_and_a_replanned_prompt_reach_the_plan_event(index_dir: Path) -> None:
    class SlowReranker(WordOverlapReranker):
        def rerank(self, request: RerankRequest) -> list[ScoredPassage]:
            time.sleep(1.5)
            return super().rerank(request)

    pipeline, _ = make_pipeline(
        index_dir,
        workers=[ScriptedGeneration(words("Tea steeps."))],
        planning=PlanningConfig(enabled=False, fixed_rerank_depth=5),
    )
    pipeline.swap_retriever(pipeline.retriever.with_reranker(SlowReranker()), None)
    events = await _answer(pipeline, "How long is green tea steeped?", budget_ms=600)
    plan = next(e for e in events if isinstance(e, PlanEvent)).record
    assert plan.initial.rerank_depth == 5
    assert plan.knobs.rerank_depth == 0
    assert [c.stage for c in plan.cuts] == ["rerank"]
    assert events[-1].stats.degraded  # type: ignore[attr-defined]


async def test_a_stage_added_in_one_line_is_run_spanned_and_searched_with(
    index_dir: Path,
) -> None:
    class Rewrite:
        """A query rewrite: what a follow-up question would be made standalone by."""

        name = "rewrite"

        async def run(self, request: str, deadline: Deadline) -> StageResult[str]:
            return StageResult(request.replace("it", "green tea"), 0.1)

    generation = ScriptedGeneration(words("Tea steeps."))
    pipeline, exporter = make_pipeline(index_dir, workers=[generation], query_stages=(Rewrite(),))
    events = await _answer(pipeline, "How long is it steeped?")
    names = _spans(exporter)
    assert names[:3] == ["answer", "rewrite", "embed"]
    assert "green tea" in generation.prompts[0]
    assert isinstance(events[-1], DoneEvent)
    assert events[-1].stats.outcome == "ok"


async def test_a_follow_up_is_rewritten_ahead_of_the_cache_and_searched_as_rewritten(
    index_dir: Path,
) -> None:
    generation = ScriptedGeneration(words("Tea steeps."))
    pipeline, exporter = make_pipeline(index_dir, workers=[generation])
    pipeline.answer_cache = AnswerCache(SharedCache(None, "a", ttl_s=60, capacity=8), "fp")
    history = (Turn("user", "How long is green tea steeped?"), Turn("assistant", "Two minutes."))
    events = await _answer(pipeline, "And black?", history=history)
    assert _spans(exporter)[:3] == ["answer", "rewrite", "cache"]
    plan = next(e for e in events if isinstance(e, PlanEvent))
    assert plan.searched_query.startswith("And black? ")
    assert "green" in plan.searched_query
    assert "tea" in plan.searched_query
    assert plan.searched_query in generation.prompts[0]
    # Without history nothing is rewritten: no span, the question searched as asked.
    exporter.clear()
    events = await _answer(pipeline, "How long is green tea steeped?")
    assert "rewrite" not in _spans(exporter)
    plan = next(e for e in events if isinstance(e, PlanEvent))
    assert plan.searched_query == "How long is green tea steeped?"
