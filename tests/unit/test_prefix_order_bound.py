"""The replay of layouts against a cache that forgets nothing (eval/bench/prefix_order_bound.py)."""

from __future__ import annotations

from eval.bench.prefix_order_bound import Replay, Retrieved, replay


def test_a_prompt_reuses_the_system_prompt_then_passages_while_their_sequence_was_sent() -> None:
    cache = Replay({"a": 100, "b": 200, "c": 300}, system_tokens=50, question_tokens=20)
    assert cache.reusable(["a", "b"], "q?") == 50
    cache.send(["a", "b"], "q?")
    assert cache.reusable(["a", "b"], "q?") == 50 + 100 + 200 + 20  # the same prompt again
    assert cache.reusable(["a", "b"], "other?") == 350
    assert cache.reusable(["a", "c"], "q?") == 150
    assert cache.reusable(["b", "a"], "q?") == 50  # only from the first passage on
    assert cache.total(["a", "c"]) == 50 + 400 + 20


def test_layouts_replayed_on_a_stream_sharing_passages() -> None:
    tokens = dict.fromkeys("xabcd", 100)
    stream = [
        Retrieved("q1?", ("b", "x", "a")),  # laid out a, b, x (stable); relevance b, x, a
        Retrieved("q2?", ("d", "a", "b")),  # shares a, b
        Retrieved("q3?", ("a", "b", "x")),  # the first set again, another question
    ]
    relevance = replay(stream, tokens, 0, "relevance", top_k=3, question_tokens=0)
    cache_aware = replay(stream, tokens, 0, "cache_aware", top_k=3, question_tokens=0)
    # relevance: q2 and q3 start with passages never sent first: nothing reused.
    assert relevance["cached_token_share"] == 0.0
    # cache-aware: q2 reuses a, b (200 of 300), q3 all three: 500 of 900.
    assert cache_aware["cached_token_share"] == round(500 / 900, 4)
    assert cache_aware["requests_another_order_reuses_more"] == 0
    adopting = replay(stream, tokens, 0, "cache_aware", top_k=3, adopt=1, question_tokens=0)
    assert adopting["cached_token_share"] == cache_aware["cached_token_share"]
    # From the third request on (stable order): its passages all reused, its question not.
    warm = replay(stream, tokens, 0, "stable", top_k=3, warm_up=2, question_tokens=20)
    assert warm["cached_token_share_after_warm_up"] == round(300 / 320, 4)
