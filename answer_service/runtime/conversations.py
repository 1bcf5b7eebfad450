"""Conversations the Responses API continues (`previous_response_id`): each response's turns,
kept for an hour under its API key, in Redis when one is configured (shared by the replicas),
else in this process alone.

A response's entry holds the conversation up to and including it (the earlier turns, its
question and its answer, at most `MAX_TURNS`, the latest), so continuing it is one read. The
entry's key is the key id and the response id hashed together: another key asking for the same
response id reads a key that was never written and gets nothing, exactly as for an unknown or
expired id, so one key can never continue (or learn of) another key's conversation. With API
keys off every caller shares one space.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence

from answer_service.runtime.caches import SharedCache
from answer_service.runtime.redis_link import RedisLink
from retrieval.query_rewrite import Turn

# How long a response can be continued, and how many of its latest turns are kept.
TTL_S = 3600.0
MAX_TURNS = 50
_LOCAL_ENTRIES = 4096


class ConversationStore:
    def __init__(self, link: RedisLink | None, ttl_s: float = TTL_S) -> None:
        self._store = SharedCache(link, "conversation", ttl_s=ttl_s, capacity=_LOCAL_ENTRIES)

    @staticmethod
    def _key(key_id: str | None, response_id: str) -> str:
        return hashlib.sha256(f"{key_id or ''}\n{response_id}".encode()).hexdigest()

    async def turns(self, key_id: str | None, response_id: str) -> tuple[Turn, ...] | None:
        """The conversation up to and including `response_id`, oldest first; None when this
        key has no such response (unknown, expired, or another key's)."""
        data = await self._store.get(self._key(key_id, response_id))
        if data is None:
            return None
        return tuple(
            Turn("assistant" if r == "assistant" else "user", c) for r, c in json.loads(data)
        )

    async def remember(self, key_id: str | None, response_id: str, turns: Sequence[Turn]) -> None:
        """Keeps the conversation up to and including `response_id`; returns once Redis has
        it (or has failed: then this process's copy serves), so the response can be continued
        on any replica as soon as its client has it."""
        kept = [(t.role, t.content) for t in turns[-MAX_TURNS:]]
        self._store.put(self._key(key_id, response_id), json.dumps(kept).encode())
        await self._store.drain()
