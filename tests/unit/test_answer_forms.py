"""The answer forms end to end in the pipeline, built from fakes over a real index: a quote
without the model, focused context, `auto` by measured curves and the time left, a budget no
generation can make, and the guards on a generated answer (loops, unsupported sentences)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from answer_service.pipeline.answer_pipeline import AnswerPipeline
from answer_service.pipeline.answer_stream import CitationConfig
from answer_service.pipeline.attribution import ABSTENTION
from answer_service.pipeline.events import (
    AnswerRequest,
    CitationEvent,
    DoneEvent,
    PipelineEvent,
    PlanEvent,
    SourcesEvent,
    TokenEvent,
)
from answer_service.pipeline.planning import PlanningConfig
from budget import Deadline
from budget.forms import QualityCurves
from tests.builders import make_index, make_pipeline
from tests.fakes.scripted_generation import ScriptedGeneration, words


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_index(tmp_path_factory.mktemp("forms"))


async def answer(
    pipeline: AnswerPipeline, query: str, *, budget_ms: int = 5_000, **request: object
) -> list[PipelineEvent]:
    prepared = await pipeline.prepare(
        AnswerRequest(query, budget_ms, 3, **request),  # type: ignore[arg-type]
        Deadline.after_ms(budget_ms),
    )
    return [event async for event in pipeline.events(prepared)]


def text_of(events: list[PipelineEvent]) -> str:
    return "".join(e.text for e in events if isinstance(e, TokenEvent))


def done_of(events: list[PipelineEvent]) -> DoneEvent:
    done = events[-1]
    assert isinstance(done, DoneEvent)
    return done


async def test_a_quote_is_the_sentence_that_answers_with_its_source(index_dir: Path) -> None:
    generation = ScriptedGeneration(words("never asked"))
    pipeline, exporter = make_pipeline(index_dir, workers=[generation], answer_mode="quote")
    events = await answer(pipeline, "Where is Mount Etna?")
    assert generation.prompts == []  # no model
    text = text_of(events)
    assert "Mount Etna is an active volcano on the island of Sicily" in text
    sources = next(e for e in events if isinstance(e, SourcesEvent)).sources
    (citation,) = [e.citation for e in events if isinstance(e, CitationEvent)]
    assert sources[citation.sources[0] - 1].doc_id == "volcano"
    assert (citation.start, citation.end) == (0, len(text))
    plan = next(e for e in events if isinstance(e, PlanEvent)).record
    assert (plan.mode, plan.form) == ("quote", "quote")
    stats = done_of(events).stats
    assert (stats.form, stats.finish_reason, stats.prompt_tokens) == ("quote", "quote", 0)
    assert stats.ttft_ms is not None
    assert "sentences" in {span.name for span in exporter.get_finished_spans()}


async def test_focused_context_gives_the_model_excerpts_not_passages(index_dir: Path) -> None:
    generation = ScriptedGeneration(words("Sicily."))
    pipeline, _ = make_pipeline(index_dir, workers=[generation], answer_mode="focused")
    events = await answer(pipeline, "Where is Mount Etna?")
    (prompt,) = generation.prompts
    assert "Mount Etna is an active volcano" in prompt
    stats = done_of(events).stats
    assert stats.form == "focused"
    sources = next(e for e in events if isinstance(e, SourcesEvent)).sources
    assert "volcano" in {s.doc_id for s in sources}


async def test_focused_takes_the_measured_best_number_of_excerpts(index_dir: Path) -> None:
    """The request's top_k is how many sources it may see; how many excerpts the model gets is
    the planner's choice by the measured curve (on a small model more answer worse)."""
    generation = ScriptedGeneration(words("Sicily."))
    pipeline, _ = make_pipeline(
        index_dir,
        workers=[generation],
        answer_mode="focused",
        planning=PlanningConfig(enabled=True),
        form_quality=QualityCurves({"quote": (0.9,), "focused": (0.6, 0.3, 0.2)}),
    )
    events = await answer(pipeline, "Where is Mount Etna?")
    stats = done_of(events).stats
    assert (stats.form, stats.passages_in_prompt) == ("focused", 1)
    plan = next(e for e in events if isinstance(e, PlanEvent)).record
    assert plan.form_reason.startswith("answer_mode focused asked for: 1 excerpt(s)")


async def test_auto_follows_the_measured_curves(index_dir: Path) -> None:
    generation = ScriptedGeneration(words("Sicily."))
    quoting, _ = make_pipeline(
        index_dir,
        workers=[generation],
        answer_mode="auto",
        form_quality=QualityCurves({"quote": (0.8,), "passages": (0.3, 0.4, 0.4)}),
    )
    events = await answer(quoting, "Where is Mount Etna?")
    assert done_of(events).stats.form == "quote"
    assert generation.prompts == []
    generating, _ = make_pipeline(
        index_dir,
        workers=[generation],
        answer_mode="auto",
        form_quality=QualityCurves({"quote": (0.2,), "passages": (0.5, 0.9, 0.9)}),
    )
    events = await answer(generating, "Where is Mount Etna?")
    stats = done_of(events).stats
    assert stats.form == "passages"
    assert stats.passages_in_prompt == 2  # the smallest context of the best quality
    plan = next(e for e in events if isinstance(e, PlanEvent)).record
    assert "quality" in plan.form_reason


async def test_a_budget_no_generation_can_make_gets_a_quote(index_dir: Path) -> None:
    generation = ScriptedGeneration(words("never asked"))
    pipeline, _ = make_pipeline(
        index_dir,
        workers=[generation],
        answer_mode="auto",
        planning=PlanningConfig(enabled=True),
    )
    # The first-token prior alone is over 100 ms: no generation fits 60 ms.
    events = await answer(pipeline, "Where is Mount Etna?", budget_ms=60)
    stats = done_of(events).stats
    assert stats.form == "quote"
    assert generation.prompts == []
    assert "Sicily" in text_of(events)


async def test_a_loop_is_stopped_and_the_request_aborted(index_dir: Path) -> None:
    loop = "Green tea steeps for two minutes. " * 40
    generation = ScriptedGeneration(words(loop.strip()))
    pipeline, _ = make_pipeline(index_dir, workers=[generation])
    events = await answer(pipeline, "How long is green tea steeped?")
    stats = done_of(events).stats
    assert stats.finish_reason == "repetition"
    assert len(generation.aborted) == 1
    assert text_of(events).strip() == "Green tea steeps for two minutes."


@pytest.mark.parametrize("policy", ["mark", "drop", "stop"])
async def test_a_repeated_sentence_is_never_shown_not_even_in_part(
    index_dir: Path, policy: str
) -> None:
    """A sentence said again later is left out, and the answer goes on; the citations point
    into what the client was sent."""
    said = (
        "Green tea steeps for two minutes. Espresso is brewed by forcing hot water. "
        "Green tea steeps for two minutes. Espresso uses ground coffee."
    )
    generation = ScriptedGeneration(words(said))
    pipeline, _ = make_pipeline(
        index_dir,
        workers=[generation],
        citations=CitationConfig(unsupported=policy),  # type: ignore[arg-type]
    )
    events = await answer(pipeline, "How long is green tea steeped and how is espresso brewed?")
    text = text_of(events)
    assert text.count("Green tea") == 1
    assert text.strip().endswith("Espresso uses ground coffee.")
    assert done_of(events).stats.finish_reason == "stop"
    for citation in (e.citation for e in events if isinstance(e, CitationEvent)):
        assert text[citation.start : citation.end] in said


async def test_a_repeated_list_item_is_never_shown(index_dir: Path) -> None:
    """A list's items are decided only when the list ends; one that repeats an item already
    said is held back until then, and left out."""
    said = (
        "Two ways:\n\n- Green tea steeps for two minutes in water.\n"
        "- Espresso is brewed by forcing hot water.\n\nAgain:\n\n"
        "- Milk is added afterwards to the cup.\n- Green tea steeps for two minutes in water."
    )
    generation = ScriptedGeneration(words(said))
    pipeline, _ = make_pipeline(index_dir, workers=[generation])
    events = await answer(pipeline, "How long is green tea steeped and how is espresso brewed?")
    text = text_of(events)
    assert text.count("Green tea steeps") == 1
    assert "Milk is added afterwards" in text


async def test_a_loop_stopped_inside_a_code_block_leaves_it_closed(index_dir: Path) -> None:
    """A small model loops inside a code block ("-D usermode=read-only -D usermode=..."); the
    guard stops it there, and the answer closes the block it left open."""
    said = (
        "Green tea steeps for two minutes. Run:\n\n```\nsteep " + "--minutes two --water hot " * 12
    )
    pieces = [piece for piece in re.split(r"(```|\n| )", said) if piece]
    generation = ScriptedGeneration(lambda _prompt: pieces)
    pipeline, _ = make_pipeline(index_dir, workers=[generation])
    events = await answer(pipeline, "How long is green tea steeped?")
    assert done_of(events).stats.finish_reason == "repetition"
    text = text_of(events)
    assert text.count("```") == 2
    assert text.endswith("\n```")


async def test_a_repeated_code_block_is_never_shown_not_even_its_fence(index_dir: Path) -> None:
    """A code block is one unit: one that repeats a block already said is held from its
    opening fence, so leaving it out leaves no fence open in what the client was sent (a
    small model given a manual writes the same example twice)."""
    block = "```\nCREATE INDEX CONCURRENTLY tea_idx ON tea (steeped);\n```"
    said = (
        f"Green tea steeps for two minutes. Index it with:\n\n{block}\n\n"
        f"Espresso is brewed by forcing hot water. You can also use:\n\n{block}\n\n"
    )
    # Streamed as a model's tokens come: a fence and each line break a delta of their own.
    pieces = [piece for piece in re.split(r"(```|\n| )", said) if piece]
    generation = ScriptedGeneration(lambda _prompt: pieces)
    pipeline, _ = make_pipeline(index_dir, workers=[generation])
    events = await answer(pipeline, "How long is green tea steeped and how is espresso brewed?")
    text = text_of(events)
    assert text.count("CREATE INDEX") == 1
    assert text.count("```") == 2
    assert "Espresso is brewed by forcing hot water." in text
    # Nor the blank line before the block left out (seen on the manual: an answer ending in
    # "You can also use the following command:" and blank lines).
    assert text.endswith("You can also use:"), repr(text[-40:])


async def test_line_breaks_a_model_writes_until_its_token_limit_are_not_sent(
    index_dir: Path,
) -> None:
    """Seen on the manual: a focused answer ended "You can also use the following
    command:" and four blank lines, the model writing line breaks until its limit. White
    space goes out only once something follows it."""
    said = "Green tea steeps for two minutes. You can also use:" + "\n" * 6
    pieces = [piece for piece in re.split(r"(\n| )", said) if piece]
    generation = ScriptedGeneration(lambda _prompt: pieces)
    pipeline, _ = make_pipeline(index_dir, workers=[generation])
    events = await answer(pipeline, "How long is green tea steeped?")
    assert text_of(events).endswith("You can also use:")


async def test_an_answer_cut_short_while_repeating_shows_none_of_the_repeat(
    index_dir: Path,
) -> None:
    said = "Green tea steeps for two minutes. Espresso is brewed by forcing hot water. Green tea"
    generation = ScriptedGeneration(words(said))
    pipeline, _ = make_pipeline(index_dir, workers=[generation])
    events = await answer(pipeline, "How long is green tea steeped and how is espresso brewed?")
    assert text_of(events).count("Green tea") == 1


@pytest.mark.parametrize(
    ("policy", "shown", "finish"),
    [
        ("mark", "Green tea steeps for two minutes. Bananas grow on trees in Peru.", "stop"),
        ("drop", "Green tea steeps for two minutes.", "stop"),
        ("stop", "Green tea steeps for two minutes.", "unsupported"),
    ],
)
async def test_an_unsupported_sentence_is_marked_dropped_or_stops_the_answer(
    index_dir: Path, policy: str, shown: str, finish: str
) -> None:
    said = "Green tea steeps for two minutes. Bananas grow on trees in Peru."
    generation = ScriptedGeneration(words(said))
    pipeline, _ = make_pipeline(
        index_dir,
        workers=[generation],
        citations=CitationConfig(unsupported=policy),  # type: ignore[arg-type]
    )
    events = await answer(pipeline, "How long is green tea steeped?")
    assert text_of(events).strip() == shown
    stats = done_of(events).stats
    assert stats.finish_reason == finish
    assert stats.unsupported_sentences == 1
    citations = [e.citation for e in events if isinstance(e, CitationEvent)]
    text = text_of(events)
    for citation in citations:
        assert text[citation.start : citation.end] in said
    assert citations[0].supported


@pytest.mark.parametrize("policy", ["drop", "stop"])
async def test_an_answer_with_nothing_supported_left_says_it_does_not_know(
    index_dir: Path, policy: str
) -> None:
    generation = ScriptedGeneration(words("Bananas grow on trees in Peru. Apples are blue."))
    pipeline, _ = make_pipeline(
        index_dir,
        workers=[generation],
        citations=CitationConfig(unsupported=policy),  # type: ignore[arg-type]
    )
    events = await answer(pipeline, "How long is green tea steeped?")
    assert text_of(events) == ABSTENTION
    stats = done_of(events).stats
    assert stats.finish_reason == "unsupported"
    assert stats.unsupported_sentences >= 1
    assert not [e for e in events if isinstance(e, CitationEvent)]


async def test_a_streaming_client_that_prints_markers_as_they_come_puts_them_right(
    index_dir: Path,
) -> None:
    """Each citation comes right after the token that ends its sentence, so a client that
    writes ` [n]` when a citation arrives writes it after the sentence's mark, not at the start
    of the next line (the `ask` command does this)."""
    said = "Green tea steeps for two minutes.\nEspresso is brewed by forcing hot water."
    pieces = [
        "Green tea steeps",
        " for two minutes",
        ".\n",
        "Espresso is",
        " brewed by forcing hot water.",
    ]
    generation = ScriptedGeneration(lambda _prompt: pieces)
    pipeline, _ = make_pipeline(index_dir, workers=[generation])
    events = await answer(pipeline, "How long is green tea steeped and how is espresso brewed?")
    printed = ""
    for event in events:
        if isinstance(event, TokenEvent):
            printed += event.text
        elif isinstance(event, CitationEvent) and event.citation.sources:
            printed += "".join(f" [{n}]" for n in event.citation.sources)
    assert printed.replace(" [1]", "").replace(" [2]", "").replace(" [3]", "") == said
    first, second = printed.split("\n")
    assert first.startswith("Green tea steeps for two minutes. [")
    assert second.startswith("Espresso is brewed")
    assert second.rstrip().endswith("]")
