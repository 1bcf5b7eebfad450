"""Every replica's arrivals, counted in a real Redis and read back by every replica; and the
figure goes away (None) while Redis is down, so the planner falls back to its own."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from answer_service.runtime.fleet_rate import FleetArrivals
from answer_service.runtime.redis_link import RedisLink
from tests.support import free_port

pytestmark = pytest.mark.integration


async def test_replicas_see_each_others_arrivals() -> None:
    prefix = f"test-{uuid.uuid4().hex[:8]}:"
    links = [RedisLink.from_url("redis://127.0.0.1:6379/0", prefix=prefix) for _ in range(2)]
    first, second = (FleetArrivals(link, window_s=2, refresh_s=0.1) for link in links)
    try:
        for _ in range(6):
            first.mark()
        for _ in range(4):
            second.mark()
        await first.drain()
        await second.drain()
        for _ in range(40):  # until their second is a whole one (the current one is left out)
            if await first.refresh() == pytest.approx(5.0):
                break
            await asyncio.sleep(0.05)
        assert first.per_second() == pytest.approx(5.0)  # 10 arrivals over a 2 s window
        assert await second.refresh() == pytest.approx(5.0)
        assert second.per_second() == pytest.approx(5.0)
    finally:
        for link in links:
            await link.aclose()


async def test_no_figure_while_redis_is_down() -> None:
    link = RedisLink.from_url(f"redis://127.0.0.1:{free_port()}/0", timeout_s=0.1)
    fleet = FleetArrivals(link, window_s=2, refresh_s=0.1)
    try:
        fleet.mark()
        await fleet.drain()
        assert await fleet.refresh() is None
        assert fleet.per_second() is None
        assert not link.up
    finally:
        await link.aclose()
