"""Generation slots from what the backend batches: prompts sent 1, 2, 4, ... at once at
warm-up, and the slots the most at once for which every doubling still raised throughput. A
backend that prefills one prompt at a time (a CPU) keeps one slot; one that batches (a GPU)
gets as many as were measured to pay."""

from __future__ import annotations

import asyncio

import pytest

from answer_service.pipeline.admission import GenerationGate
from answer_service.runtime.calibration import CalibrationConfig, measure_slots
from budget import Deadline
from budget.concurrency import slots_from_timings
from tests.fakes.scripted_generation import ScriptedGeneration, words


def test_a_backend_that_serialises_prefill_keeps_one_slot() -> None:
    # Two prompts at once take twice as long as one: no throughput gained.
    choice = slots_from_timings({1: 100.0, 2: 205.0})
    assert choice.slots == 1
    assert "under 1.25x" in choice.reason


def test_a_batching_backend_gets_the_most_that_still_paid() -> None:
    timings = {1: 100.0, 2: 105.0, 4: 115.0, 8: 140.0, 16: 330.0}
    choice = slots_from_timings(timings)
    assert choice.slots == 8  # 16 at once: 0.85x the throughput of 8
    assert choice.throughput[8] == pytest.approx(8 / 0.140)


def test_without_a_single_prompt_timed_there_is_one_slot() -> None:
    assert slots_from_timings({}).slots == 1
    assert slots_from_timings({2: 100.0, 4: 110.0}).slots == 1


def test_a_gain_of_one_would_always_pay_and_is_refused() -> None:
    with pytest.raises(ValueError, match="above 1"):
        slots_from_timings({1: 100.0}, min_gain=1.0)


async def test_raising_a_workers_capacity_lets_its_waiters_in() -> None:
    gate = GenerationGate(["w"], 1, {"standard": 1.0}, max_wait_ms=2_000)
    held = await gate.acquire("w", "standard", 10.0)
    waiting = [asyncio.create_task(gate.acquire("w", "standard", 10.0)) for _ in range(2)]
    await asyncio.sleep(0)
    assert gate.waiting("w") == 2
    gate.set_capacity("w", 3)
    slots = await asyncio.wait_for(asyncio.gather(*waiting), 1.0)
    assert gate.capacity("w") == 3
    assert gate.waiting("w") == 0
    for slot in [held, *slots]:
        slot.release()
    with pytest.raises(ValueError, match="at least one slot"):
        gate.set_capacity("w", 0)


CONFIG = CalibrationConfig(max_slots=8)


async def test_measuring_a_cpu_like_backend_gives_one_slot() -> None:
    backend = ScriptedGeneration(words("ok"), prefill_s=0.05, batches=False)
    choice = await measure_slots(backend, "some prompt words", CONFIG, Deadline.after_ms(30_000))
    assert choice.slots == 1
    assert set(choice.throughput) == {1, 2}  # stopped at the first doubling that did not pay


async def test_measuring_a_gpu_like_backend_gives_the_slots_it_batches() -> None:
    backend = ScriptedGeneration(words("ok"), prefill_s=0.05, batches=True)
    choice = await measure_slots(backend, "some prompt words", CONFIG, Deadline.after_ms(30_000))
    assert choice.slots == 8  # every doubling up to the most allowed paid
    assert set(choice.throughput) == {1, 2, 4, 8}
