"""The in-process side of the caches: TTL and LRU eviction, the answer key, and what a cached
answer keeps."""

from __future__ import annotations

import numpy as np
import pytest

from answer_service.pipeline.attribution import Citation
from answer_service.pipeline.events import Source
from answer_service.runtime.caches import (
    AnswerCache,
    CachedAnswer,
    EmbeddingCache,
    SharedCache,
    TtlLru,
    fingerprint,
    normalized,
)


def test_entries_expire_and_the_least_recent_goes_first() -> None:
    now = [0.0]
    lru = TtlLru(capacity=2, ttl_s=10.0, clock=lambda: now[0])
    lru.put("a", b"1")
    lru.put("b", b"2")
    assert lru.get("a") == b"1"  # a is now the most recent
    lru.put("c", b"3")
    assert lru.get("b") is None
    assert lru.get("a") == b"1"
    now[0] = 10.0
    assert lru.get("a") is None
    assert lru.get("c") is None


def test_the_answer_key_ignores_case_spacing_and_closing_punctuation() -> None:
    assert normalized("  What is  MVCC?? ") == "what is mvcc"
    cache = AnswerCache(SharedCache(None, "answer", ttl_s=60, capacity=8), fingerprint({"i": 1}))
    assert cache.key("What is MVCC?", 5, "auto") == cache.key("what is  mvcc", 5, "auto")
    assert cache.key("What is MVCC?", 5, "auto") != cache.key("What is MVCC?", 4, "auto")
    # A quoted answer is not a generated one: the form is part of the key.
    assert cache.key("What is MVCC?", 5, "quote") != cache.key("What is MVCC?", 5, "passages")
    other = AnswerCache(cache.store, fingerprint({"i": 2}))  # another index
    assert other.key("What is MVCC?", 5, "auto") != cache.key("What is MVCC?", 5, "auto")


@pytest.mark.asyncio
async def test_a_cached_answer_comes_back_whole() -> None:
    answer = CachedAnswer(
        text="MVCC keeps row versions. [1]",
        sources=(Source(1, "p#0", "p", "MVCC", 0.5, "Each row..."),),
        citations=(Citation(0, 0, 24, (1,), 0.9, True),),
        completion_tokens=7,
        finish_reason="stop",
    )
    cache = AnswerCache(SharedCache(None, "answer", ttl_s=60, capacity=8), "f")
    cache.put("k", answer)
    assert await cache.get("k") == answer
    assert await cache.get("other") is None
    assert cache.store.hits == 1
    assert cache.store.misses == 1


@pytest.mark.asyncio
async def test_query_vectors_round_trip_as_float32() -> None:
    cache = EmbeddingCache(SharedCache(None, "embedding", ttl_s=60, capacity=8), "minilm")
    vector = np.arange(4, dtype=np.float32).reshape(1, 4) / 3
    cache.put("What is MVCC?", vector)
    back = await cache.get("What  is MVCC?")
    assert back is not None
    assert back.dtype == np.float32
    np.testing.assert_array_equal(back, vector)
    assert await cache.get("what is mvcc?") is None  # case matters to a cased embedder
