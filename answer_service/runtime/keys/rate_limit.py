"""Per-API-key rate limits: a token bucket, atomic in Redis (one Lua script, Redis's own clock,
so every replica draws from the same bucket), or in this process while Redis is down (then each
replica limits alone, and a key may get up to replicas x its rate)."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from answer_service.runtime.keys.auth import ApiKey
from answer_service.runtime.redis_link import RedisLink

TOKEN_BUCKET = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local state = redis.call('HMGET', KEYS[1], 'tokens', 'at')
local tokens = tonumber(state[1])
local at = tonumber(state[2])
if tokens == nil or at == nil then
  tokens = burst
  at = now
end
tokens = math.min(burst, tokens + math.max(0, now - at) * rate / 1000)
local allowed = 0
local wait_ms = 0
if tokens >= cost then
  tokens = tokens - cost
  allowed = 1
else
  wait_ms = math.ceil((cost - tokens) * 1000 / rate)
end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'at', now)
redis.call('PEXPIRE', KEYS[1], math.ceil(burst * 1000 / rate) + 1000)
return {allowed, wait_ms}
"""


@dataclass(frozen=True, slots=True)
class Decision:
    allowed: bool
    retry_after_s: int
    shared: bool  # decided by the Redis bucket every replica shares


class LocalBuckets:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}
        self._lock = threading.Lock()

    def take(self, key: ApiKey, cost: float = 1.0) -> tuple[bool, float]:
        """(allowed, seconds until `cost` tokens are there)."""
        now = self._clock()
        with self._lock:
            tokens, at = self._buckets.get(key.key_id, (float(key.burst), now))
            tokens = min(float(key.burst), tokens + max(0.0, now - at) * key.rate_per_s)
            if tokens >= cost:
                self._buckets[key.key_id] = (tokens - cost, now)
                return True, 0.0
            self._buckets[key.key_id] = (tokens, now)
            return False, (cost - tokens) / key.rate_per_s


class RateLimiter:
    def __init__(self, link: RedisLink | None, local: LocalBuckets | None = None) -> None:
        self._link = link
        self._local = local or LocalBuckets()
        self._script = link.client.register_script(TOKEN_BUCKET) if link else None

    async def check(self, key: ApiKey) -> Decision:
        link, script = self._link, self._script
        if link is not None and script is not None and link.worth_trying():
            bucket = link.key(f"ratelimit:{key.key_id}")

            async def take() -> list[int]:
                result: list[int] = await script(keys=[bucket], args=[key.rate_per_s, key.burst, 1])
                return result

            result = await link.call("ratelimit", take)
            if result is not None:
                allowed, wait_ms = int(result[0]), int(result[1])
                return Decision(bool(allowed), max(1, math.ceil(wait_ms / 1000)), shared=True)
        allowed_here, wait_s = self._local.take(key)
        return Decision(allowed_here, max(1, math.ceil(wait_s)), shared=False)
