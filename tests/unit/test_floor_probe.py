"""The way back from a first-token model that learned a worker slower than it is: while the
idle floor refuses requests, the worker's first token is timed again (rate-limited), and once
the model has seen it fast the same budget is served by the model."""

from __future__ import annotations

from pathlib import Path

import pytest

from answer_service.errors import InvalidRequestError
from answer_service.pipeline.answer_pipeline import AnswerPipeline
from answer_service.pipeline.events import AnswerRequest, DoneEvent
from answer_service.pipeline.planning import PlanningConfig
from answer_service.pipeline.probe import FloorProbe
from budget import Deadline
from tests.builders import make_index, make_pipeline
from tests.fakes.scripted_generation import ScriptedGeneration, words


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_index(tmp_path_factory.mktemp("probe"))


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def ask(pipeline: AnswerPipeline, budget_ms: int) -> DoneEvent:
    prepared = await pipeline.prepare(
        AnswerRequest("How long is green tea steeped?", budget_ms, 3), Deadline.after_ms(budget_ms)
    )
    events = [event async for event in pipeline.events(prepared)]
    done = events[-1]
    assert isinstance(done, DoneEvent)
    return done


async def test_a_floor_learned_too_slow_is_probed_back_down(index_dir: Path) -> None:
    generation = ScriptedGeneration(words("Two minutes."))
    pipeline, _ = make_pipeline(
        index_dir, workers=[generation], planning=PlanningConfig(enabled=True)
    )
    clock = Clock()
    pipeline.floor_probe = FloorProbe(
        pipeline.planning, {generation.base_url: generation}, every_s=5.0, clock=clock
    )
    models = pipeline.planning.models
    for tokens in (60.0, 250.0, 700.0):  # a warm-up on a busy machine
        models.observe("first_token", tokens, 4_000.0 + tokens, generation.base_url)
    models.settle()

    with pytest.raises(InvalidRequestError, match="even an idle worker"):
        await ask(pipeline, 1_500)
    await pipeline.floor_probe.wait()
    (probe,) = generation.prompts  # one uncached prompt, no answer asked for
    assert "passage passage" in probe
    with pytest.raises(InvalidRequestError):  # within 5 s: no second probe
        await ask(pipeline, 1_500)
    await pipeline.floor_probe.wait()
    assert len(generation.prompts) == 1

    for _ in range(8):  # each refusal, 5 s apart, probes again
        clock.now += 5.0
        try:
            done = await ask(pipeline, 1_500)
        except InvalidRequestError:
            await pipeline.floor_probe.wait()
            continue
        break
    else:
        raise AssertionError("the floor never came back down")
    assert done.stats.outcome == "ok"
    assert done.stats.form == "passages"
    assert 2 <= len(generation.prompts) <= 9, "a probe for each refusal 5 s apart"
