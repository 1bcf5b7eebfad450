"""The answer cache (ahead of retrieval) and the query-embedding cache: in Redis with a TTL,
shared by the replicas, and in a small in-process LRU that serves while Redis is down.

An answer is keyed by its normalised query, `top_k` and a fingerprint of everything else that
shapes it: the index (its corpus checksum and kind), the served model, the generation and
citation settings. A new index or model changes the fingerprint, so older answers are never
read again and expire with their TTL. Only complete answers are stored: greedy decoding
(temperature 0), no error, no cut and nothing degraded; a cut answer would repeat its cut for
the TTL. The passages a request may read (its filters within its key's collections) are part
of the key, and a hit whose sources the request may not read is a miss.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import numpy as np

from answer_service.pipeline.events import CachedAnswer
from answer_service.runtime.redis_link import RedisLink
from retrieval.embedder import Vectors

_SPACE = re.compile(r"\s+")


def normalized(query: str) -> str:
    """Case, spacing and closing punctuation set aside: the same question."""
    return _SPACE.sub(" ", query).strip().lower().rstrip("?!. ")


class TtlLru:
    def __init__(
        self, capacity: int, ttl_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._capacity = capacity
        self._ttl_s = ttl_s
        self._clock = clock
        self._items: OrderedDict[str, tuple[float, bytes]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: str) -> bytes | None:
        with self._lock:
            item = self._items.get(key)
            if item is None:
                return None
            if item[0] <= self._clock():
                del self._items[key]
                return None
            self._items.move_to_end(key)
            return item[1]

    def put(self, key: str, value: bytes) -> None:
        with self._lock:
            self._items[key] = (self._clock() + self._ttl_s, value)
            self._items.move_to_end(key)
            while len(self._items) > self._capacity:
                self._items.popitem(last=False)


class SharedCache:
    """Bytes by key: Redis (`<prefix><namespace>:<key>`, SET EX) while it answers, else this
    process's LRU. Writes go to both; the Redis write is a background task."""

    def __init__(
        self, link: RedisLink | None, namespace: str, *, ttl_s: float, capacity: int
    ) -> None:
        self._link = link
        self._namespace = namespace
        self.ttl_s = ttl_s
        self.local = TtlLru(capacity, ttl_s)
        self.hits = self.misses = 0
        self._writes: set[asyncio.Task[None]] = set()

    def _redis_key(self, key: str) -> str:
        assert self._link is not None
        return self._link.key(f"{self._namespace}:{key}")

    async def get(self, key: str) -> bytes | None:
        link = self._link
        value: bytes | None = None
        if link is not None and link.worth_trying():
            got = await link.call("get", lambda: link.client.get(self._redis_key(key)))
            value = got if isinstance(got, bytes) else None
            if not link.up:  # failed: this process's copy
                value = self.local.get(key)
        else:
            value = self.local.get(key)
        if value is None:
            self.misses += 1
        else:
            self.hits += 1
        return value

    def put(self, key: str, value: bytes) -> None:
        self.local.put(key, value)
        link = self._link
        if link is None or not link.worth_trying():
            return
        ttl_ms = max(1, int(self.ttl_s * 1000))

        async def write() -> None:
            await link.call("set", lambda: link.client.set(self._redis_key(key), value, px=ttl_ms))

        task = asyncio.get_running_loop().create_task(write())
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)

    async def drain(self) -> None:
        if self._writes:
            await asyncio.gather(*self._writes, return_exceptions=True)


class AnswerCache:
    def __init__(self, store: SharedCache, fingerprint: str) -> None:
        self.store = store
        self.fingerprint = fingerprint

    def key(
        self, query: str, top_k: int, form: str, scope: str = "", read: str | None = None
    ) -> str:
        """`scope`: the passages the request may read (its filter's key; "" for every one),
        so an answer is only ever served to requests that could read all it drew on. `query`
        is what was searched; `read`, where it differs, what the sentences were read against
        (a follow-up's own words): the answer depends on both."""
        material = f"{self.fingerprint}\n{top_k}\n{form}\n{normalized(query)}"
        if read is not None:  # its own labelled line: a normalised query holds no line break
            material += f"\nread\t{normalized(read)}"
        if scope:
            material += f"\n{scope}"
        return hashlib.sha256(material.encode()).hexdigest()

    async def get(self, key: str) -> CachedAnswer | None:
        data = await self.store.get(key)
        if data is None:
            return None
        try:
            return CachedAnswer.from_bytes(data)
        except (KeyError, TypeError, ValueError):  # written by another version: a miss
            return None

    def put(self, key: str, answer: CachedAnswer) -> None:
        self.store.put(key, answer.to_bytes())


def fingerprint(parts: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


class EmbeddingCache:
    """Query vectors (float32) by embedder and normalised query."""

    def __init__(self, store: SharedCache, embedder: str) -> None:
        self.store = store
        self.embedder = embedder

    def key(self, query: str) -> str:
        # Spacing only: case can change what a cased embedder makes of the query.
        text = _SPACE.sub(" ", query).strip()
        return hashlib.sha256(f"{self.embedder}\n{text}".encode()).hexdigest()

    async def get(self, query: str) -> Vectors | None:
        data = await self.store.get(self.key(query))
        if data is None or len(data) % 4:
            return None
        return np.frombuffer(data, dtype=np.float32).reshape(1, -1).copy()

    def put(self, query: str, vectors: Vectors) -> None:
        self.store.put(self.key(query), np.ascontiguousarray(vectors, dtype=np.float32).tobytes())
