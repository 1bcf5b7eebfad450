"""Request summaries shared by every replica through one Redis stream.

Each replica appends its summaries (`XADD`, capped at `maxlen` entries); a dashboard reads the
last minutes of the stream (`XRANGE` from a time: stream ids are milliseconds). Publishing never
blocks a request: the write is a background task, and when too many are in flight (Redis slow or
down) summaries are dropped from the stream, counted, and still kept in this replica's memory.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import deque

from answer_service.runtime.observability.request_log import RequestSummary
from answer_service.runtime.redis_link import RedisLink

logger = logging.getLogger(__name__)


class SharedRequests:
    def __init__(self, link: RedisLink, *, maxlen: int = 20_000, max_in_flight: int = 64) -> None:
        self.link = link
        self.stream = link.key("requests")
        self.maxlen = maxlen
        self.max_in_flight = max_in_flight
        self.dropped = 0
        self._in_flight: set[asyncio.Task[None]] = set()
        # What this replica has read of the stream so far, and the last id read.
        self._mirror: deque[RequestSummary] = deque(maxlen=maxlen)
        self._last_id: bytes | None = None

    def publish(self, summary: RequestSummary) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop in this thread: keep it local
            self.dropped += 1
            return
        if len(self._in_flight) >= self.max_in_flight or not self.link.worth_trying():
            self.dropped += 1
            return
        task = loop.create_task(self._append(summary))
        self._in_flight.add(task)
        task.add_done_callback(self._in_flight.discard)

    async def _append(self, summary: RequestSummary) -> None:
        data = json.dumps(summary.to_json(), separators=(",", ":"))
        await self.link.call(
            "xadd",
            lambda: self.link.client.xadd(
                self.stream, {"s": data}, maxlen=self.maxlen, approximate=True
            ),
        )

    async def since(self, at: float) -> list[RequestSummary] | None:
        """Every replica's summaries that ended at or after `at`, oldest first; None when
        Redis cannot be read. Reads only what was added since the last call (a dashboard
        refreshes every second; the window holds minutes)."""
        start = f"({self._last_id.decode()}" if self._last_id else f"{int(at * 1000)}-0"
        entries = await self.link.call(
            "xrange",
            lambda: self.link.client.xrange(self.stream, min=start, max="+", count=self.maxlen),
        )
        if entries is None:
            return None
        for entry_id, fields in entries:
            self._last_id = entry_id
            try:
                self._mirror.append(RequestSummary.from_json(json.loads(fields[b"s"])))
            except (KeyError, TypeError, ValueError) as exc:
                logger.warning("skipping a malformed request summary error=%s", exc)
        while self._mirror and self._mirror[0].at < at:
            self._mirror.popleft()
        return [s for s in self._mirror if s.at >= at]

    async def drain(self) -> None:
        """Wait for the writes in flight (shutdown, tests)."""
        if self._in_flight:
            await asyncio.gather(*self._in_flight, return_exceptions=True)
