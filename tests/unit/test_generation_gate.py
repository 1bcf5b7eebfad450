"""Generation slots: capacity, order by tier, and a cancelled waiter leaving the queue."""

from __future__ import annotations

import asyncio

import pytest

from answer_service.pipeline.admission import GenerationGate, SlotQueueFullError

W = "http://worker"


def gate(slots: int = 1) -> GenerationGate:
    return GenerationGate([W], slots, {"premium": 3.0, "standard": 1.0}, max_wait_ms=60_000)


async def test_slots_are_handed_out_up_to_capacity_then_in_turn() -> None:
    g = gate(slots=2)
    first = await g.acquire(W, "standard", 100)
    second = await g.acquire(W, "standard", 200)
    assert g.pending_tokens(W) == 300
    third = asyncio.create_task(g.acquire(W, "standard", 50))
    await asyncio.sleep(0)
    assert not third.done()
    assert g.waiting(W) == 1
    assert g.pending_tokens(W) == 350  # held and queued both count for a new arrival
    first.prefilled()
    slot = await asyncio.wait_for(third, 1)
    assert slot.waited_ms >= 0
    assert g.pending_tokens(W) == 250
    assert g.prefilling_tokens(W, slot) == 200
    slot.owe(80)
    assert g.prefilling_tokens(W, second) == 80
    for held in (second, slot, slot):  # releasing twice is harmless
        held.release()
    assert g.pending_tokens(W) == 0


async def test_a_cancelled_waiter_leaves_the_queue_and_never_takes_a_slot() -> None:
    g = gate()
    holder = await g.acquire(W, "standard", 100)
    gone = asyncio.create_task(g.acquire(W, "standard", 500))
    stays = asyncio.create_task(g.acquire(W, "standard", 10))
    await asyncio.sleep(0)
    gone.cancel()  # the client went away
    with pytest.raises(asyncio.CancelledError):
        await gone
    assert g.waiting(W) == 1
    assert g.pending_tokens(W) == 110
    holder.release()
    slot = await asyncio.wait_for(stays, 1)
    assert g.pending_tokens(W) == 10
    slot.release()


async def test_premium_waiters_get_more_turns() -> None:
    g = gate()
    holder = await g.acquire(W, "standard", 1)
    order: list[str] = []

    async def one(tier: str) -> None:
        slot = await g.acquire(W, tier, 1)
        order.append(tier)
        await asyncio.sleep(0)
        slot.release()

    tasks = [asyncio.create_task(one(t)) for t in ["standard"] * 8 + ["premium"] * 8]
    await asyncio.sleep(0)
    holder.release()
    await asyncio.gather(*tasks)
    # While both tiers wait, premium gets three turns for each standard one.
    assert order[:8].count("premium") >= 5
    assert sorted(order) == sorted(["standard"] * 8 + ["premium"] * 8)


async def test_beyond_the_queue_cap_a_request_is_refused_at_once() -> None:
    g = GenerationGate([W], 1, {"standard": 1.0}, max_wait_ms=60_000, queue_max=1)
    holder = await g.acquire(W, "standard", 1)
    waiting = asyncio.create_task(g.acquire(W, "standard", 1))
    await asyncio.sleep(0)
    with pytest.raises(SlotQueueFullError, match="1 requests are already waiting"):
        await g.acquire(W, "standard", 1)
    assert g.waiting(W) == 1
    holder.release()
    (await asyncio.wait_for(waiting, 1)).release()


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="slots_per_worker"):
        GenerationGate([W], 0, {"a": 1.0}, 1000)
