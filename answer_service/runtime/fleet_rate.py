"""The arrival rate of the whole fleet, so that the planner of each replica sees the load every
replica puts on the shared SGLang workers, not only its own.

Each replica counts its arrivals in per-second Redis counters (`INCR`, expiring after two
windows); a background task sums the last `window_s` seconds every `refresh_s` into
`per_second()`. Nothing waits on Redis on a request's path: the count is written in the
background, and the planner reads the last refreshed figure (None when Redis is down or the
figure is stale, and the planner then uses this replica's own rate).
"""

from __future__ import annotations

import asyncio
import logging
import time

from answer_service.runtime.redis_link import RedisLink

logger = logging.getLogger(__name__)


class FleetArrivals:
    def __init__(
        self,
        link: RedisLink,
        *,
        window_s: int = 30,
        refresh_s: float = 1.0,
        max_in_flight: int = 64,
    ) -> None:
        self.link = link
        self.window_s = window_s
        self.refresh_s = refresh_s
        self.max_in_flight = max_in_flight
        self._rate: float | None = None
        self._fresh_until = 0.0
        self._writes: set[asyncio.Task[None]] = set()

    def _key(self, second: int) -> str:
        return self.link.key(f"arrivals:{second}")

    def mark(self) -> None:
        """One arrival on this replica (counted in the background)."""
        if len(self._writes) >= self.max_in_flight or not self.link.worth_trying():
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        key = self._key(int(time.time()))
        ttl_s = 2 * self.window_s

        async def count() -> None:
            async def incr() -> None:
                async with self.link.client.pipeline(transaction=False) as pipe:
                    pipe.incr(key)
                    pipe.expire(key, ttl_s)
                    await pipe.execute()

            await self.link.call("arrivals", incr)

        task = loop.create_task(count())
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)

    async def refresh(self) -> float | None:
        """Sum the last `window_s` whole seconds (this one excluded: it is still counting)."""
        now = int(time.time())
        keys = [self._key(second) for second in range(now - self.window_s, now)]
        values = await self.link.call("arrivals", lambda: self.link.client.mget(keys))
        if values is None:
            self._rate = None
            return None
        self._rate = sum(int(v) for v in values if v is not None) / self.window_s
        self._fresh_until = time.monotonic() + 3 * self.refresh_s
        return self._rate

    def per_second(self) -> float | None:
        """The fleet's arrivals per second, or None when Redis has not told us lately."""
        return self._rate if time.monotonic() < self._fresh_until else None

    async def run(self) -> None:
        while True:
            await self.refresh()
            await asyncio.sleep(self.refresh_s)

    async def drain(self) -> None:
        if self._writes:
            await asyncio.gather(*self._writes, return_exceptions=True)
