"""The service's one Redis connection (`ANSWER_REDIS_URL`), and how it fails.

Every call is bounded by short socket timeouts. Redis is an accelerator and a meeting point for
replicas, never a dependency an answer waits on: when a call fails the link is marked down, the
caller falls back to its in-process path, the failure is logged once (not once per request),
and `/readyz` reports it until a call succeeds again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import redis.asyncio as aioredis
from redis.exceptions import RedisError

logger = logging.getLogger(__name__)

T = TypeVar("T")


class RedisLink:
    def __init__(
        self, client: aioredis.Redis, *, prefix: str = "answer:", retry_after_s: float = 1.0
    ) -> None:
        self.client = client
        # Keys of this deployment start with it, so deployments (and tests) can share a server.
        self.prefix = prefix
        self.retry_after_s = retry_after_s
        self.error: str | None = None
        self._failed_at_s = 0.0

    @classmethod
    def from_url(cls, url: str, *, prefix: str = "answer:", timeout_s: float = 0.25) -> RedisLink:
        client = aioredis.Redis.from_url(
            url,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            health_check_interval=30,
            decode_responses=False,
        )
        return cls(client, prefix=prefix)

    @property
    def up(self) -> bool:
        return self.error is None

    def worth_trying(self) -> bool:
        """Up, or down long enough ago to try again: optional work (a cache write, a shared
        summary) skips Redis while it is down instead of paying a timeout per request."""
        return self.up or time.monotonic() - self._failed_at_s >= self.retry_after_s

    def key(self, name: str) -> str:
        return f"{self.prefix}{name}"

    async def call(self, what: str, operation: Callable[[], Awaitable[T]]) -> T | None:
        """`operation()`, or None when Redis failed (then the link is down until a call
        succeeds)."""
        try:
            result = await operation()
        except (RedisError, OSError) as exc:
            self._failed(what, exc)
            return None
        if self.error is not None:
            logger.info("redis is back")
            self.error = None
        return result

    def _failed(self, what: str, exc: BaseException) -> None:
        if self.error is None:
            logger.warning(
                "redis unavailable, using in-process fallbacks op=%s error=%s",
                what,
                f"{type(exc).__name__}: {exc}",
            )
        self.error = f"{type(exc).__name__}: {exc}"[:300]
        self._failed_at_s = time.monotonic()

    async def ping(self) -> bool:
        async def ping() -> bool:
            return bool(await self.client.ping())  # type: ignore[misc]

        return bool(await self.call("ping", ping))

    async def aclose(self) -> None:
        await self.client.aclose()
