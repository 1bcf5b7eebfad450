"""Cache-aware prompt layout: the prefix trie, the three orders, and stable prompt bytes."""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest

from generation.prefix_order import PrefixTree, order_ids
from generation.prompt_layout import ContextPassage, build_prompt
from tests.fakes.word_template import WordTemplate


def _passages(ids: Sequence[str]) -> list[ContextPassage]:
    return [ContextPassage(n, pid, f"T{pid}", f"text of {pid}") for n, pid in enumerate(ids, 1)]


def test_longest_prefix_follows_only_wanted_passages() -> None:
    tree = PrefixTree()
    tree.insert(["a", "b", "c", "d"])
    tree.insert(["a", "x", "y"])
    assert tree.longest_prefix({"a", "b", "c", "z"}).passage_ids == ("a", "b", "c")
    assert tree.longest_prefix({"a", "x", "y", "b"}).passage_ids in (("a", "x", "y"),)
    assert tree.longest_prefix({"b", "c"}).passage_ids == ()  # must start at the root
    assert len(tree) == 6


def test_equal_lengths_prefer_the_most_recent() -> None:
    tree = PrefixTree()
    tree.insert(["a", "b"])
    tree.insert(["a", "c"])
    assert tree.longest_prefix({"a", "b", "c"}).passage_ids == ("a", "c")
    tree.insert(["a", "b"])
    assert tree.longest_prefix({"a", "b", "c"}).passage_ids == ("a", "b")


def test_eviction_keeps_the_tree_bounded_and_drops_the_oldest() -> None:
    tree = PrefixTree(max_nodes=50)
    tree.insert(["old", "1"])
    for i in range(40):
        tree.insert([f"p{i}", f"q{i}"])
    assert len(tree) <= 50
    assert tree.longest_prefix({"old", "1"}).passage_ids == ()
    assert tree.longest_prefix({"p39", "q39"}).passage_ids == ("p39", "q39")


def test_the_three_orders() -> None:
    tree = PrefixTree()
    tree.insert(["c", "a"])
    ranked = ["b", "a", "d", "c"]
    assert order_ids(ranked, "relevance").passage_ids == ("b", "a", "d", "c")
    assert order_ids(ranked, "stable").passage_ids == ("a", "b", "c", "d")
    cache_aware = order_ids(ranked, "cache_aware", tree)
    assert cache_aware.passage_ids == ("c", "a", "b", "d")
    assert cache_aware.continued == 2


@pytest.mark.parametrize("layout", ["stable", "cache_aware"])
def test_same_passages_give_the_same_bytes_whatever_their_rank(layout: str) -> None:
    ids = ["s1#0", "s2#0", "s3#0", "s4#0"]
    texts = set()
    tree = PrefixTree()
    for seed in range(5):
        shuffled = ids[:]
        random.Random(seed).shuffle(shuffled)
        prompt = build_prompt(
            "why?",
            _passages(shuffled),
            WordTemplate(),
            max_prompt_tokens=10_000,
            layout=layout,  # type: ignore[arg-type]
            tree=tree,
        )
        texts.add(prompt.text)
        assert [p.number for p in prompt.passages] == [1, 2, 3, 4]
    assert len(texts) == 1


def test_cache_aware_prompt_extends_the_remembered_prefix_and_estimates_it() -> None:
    tree = PrefixTree()
    template = WordTemplate()
    first = build_prompt(
        "q1?",
        _passages(["d", "b", "a"]),
        template,
        max_prompt_tokens=10_000,
        layout="cache_aware",
        tree=tree,
    )
    assert first.expected_cached_tokens == 0  # nothing sent yet
    assert [p.source_id for p in first.passages] == ["a", "b", "d"]
    second = build_prompt(
        "q2?",
        _passages(["c", "b", "a"]),
        template,
        max_prompt_tokens=10_000,
        layout="cache_aware",
        tree=tree,
    )
    # a, b continue the first prompt's sequence; c follows. The shared text is everything up
    # to the end of passage b, byte for byte.
    assert [p.source_id for p in second.passages] == ["a", "b", "c"]
    shared = first.text.index('<passage number="3"')
    assert second.text[:shared] == first.text[:shared]
    assert 0 < second.expected_cached_tokens < second.prompt_tokens
    assert second.expected_cached_tokens == template.count_tokens(second.text[:shared].rstrip())


def test_fitting_drops_the_lowest_ranked_not_the_last_in_layout() -> None:
    template = WordTemplate()
    ranked = _passages(["z", "y", "x"])  # best first; "x" is the worst but sorts first
    full = build_prompt("q?", ranked, template, max_prompt_tokens=10_000, layout="stable")
    budget = full.prompt_tokens - 1
    prompt = build_prompt("q?", ranked, template, max_prompt_tokens=budget, layout="stable")
    assert [p.source_id for p in prompt.passages] == ["y", "z"]
    assert prompt.dropped_passages == 1


def test_slack_lets_a_cached_passage_take_a_last_place() -> None:
    tree = PrefixTree()
    tree.insert(["b", "f", "a"])
    ranked = ["a", "b", "c", "d", "e", "f", "g"]  # best first; "f" is 6th
    # Without slack the prompt keeps the best five; only "b" can continue ["b", "f", ...].
    plain = order_ids(ranked, "cache_aware", tree, limit=5)
    assert plain.passage_ids == ("b", "a", "c", "d", "e")
    assert plain.continued == 1
    # With slack 1, "f" replaces the 5th-ranked "e": the remembered "b, f, a" is continued.
    slack = order_ids(ranked, "cache_aware", tree, limit=5, slack=1)
    assert slack.passage_ids == ("b", "f", "a", "c", "d")
    assert slack.continued == 3


def test_slack_never_drops_the_best_ranked() -> None:
    tree = PrefixTree()
    tree.insert(["f", "g", "h", "b"])
    ranked = ["a", "b", "c", "d", "e", "f", "g", "h"]
    order = order_ids(ranked, "cache_aware", tree, limit=5, slack=2)
    # "a", "b", "c" (the best limit - slack) must stay: the prefix is cut to make room.
    assert {"a", "b", "c"} <= set(order.passage_ids)
    assert order.passage_ids[:2] == ("f", "g")
    assert order.continued == 2
    assert len(order.passage_ids) == 5


def test_relevance_and_stable_take_the_best_limit() -> None:
    ranked = ["c", "a", "b"]
    assert order_ids(ranked, "relevance", limit=2).passage_ids == ("c", "a")
    assert order_ids(ranked, "stable", limit=2, slack=1).passage_ids == ("a", "c")


def test_a_prefix_may_bring_along_others_only_with_foreign_allowed() -> None:
    tree = PrefixTree()
    tree.insert(["x", "a", "b", "c", "y"])  # another question's prompt: "x" sorted first
    wanted = {"a", "b", "c", "d"}
    assert tree.longest_prefix(wanted).passage_ids == ()
    # The path must end on a wanted passage: "y" is not brought along.
    assert tree.longest_prefix(wanted, foreign=1).passage_ids == ("x", "a", "b", "c")
    tree.insert(["x", "z", "a"])
    # Most wanted passages first, then the fewest others: x, z, a holds one of them.
    assert tree.longest_prefix(wanted, foreign=2).passage_ids == ("x", "a", "b", "c")
    tree.insert(["a", "q", "b"])
    # a, q, b and x, a, b, c: three wanted beat two, whatever the others.
    assert tree.longest_prefix({"a", "b"}, foreign=1).passage_ids == ("a", "q", "b")
    assert tree.longest_prefix({"a", "b", "c"}, foreign=1).passage_ids == ("x", "a", "b", "c")


def test_adoption_takes_the_places_of_the_lowest_ranked() -> None:
    tree = PrefixTree()
    tree.insert(["x", "a", "b", "c", "y"])
    ranked = ["a", "b", "c", "d", "e"]  # best first
    plain = order_ids(ranked, "cache_aware", tree, limit=5)
    assert plain.passage_ids == ("a", "b", "c", "d", "e")
    assert (plain.continued, plain.adopted) == (0, ())
    adopted = order_ids(ranked, "cache_aware", tree, limit=5, adopt=1)
    # x comes along so that a, b, c are read from the cache; e, the lowest ranked, gives way.
    assert adopted.passage_ids == ("x", "a", "b", "c", "d")
    assert (adopted.continued, adopted.adopted) == (4, ("x",))
    # The best limit - adopt always stay: with a limit of 3 and adopt 1, a and b must be in.
    short = order_ids(ranked, "cache_aware", tree, limit=3, adopt=1)
    assert short.passage_ids == ("x", "a", "b")
    # Other layouts never adopt.
    assert order_ids(ranked, "stable", tree, limit=5, adopt=2).adopted == ()


def test_eviction_forgets_where_passages_were() -> None:
    tree = PrefixTree(max_nodes=20)
    tree.insert(["x", "a"])
    for i in range(30):
        tree.insert([f"p{i}", f"q{i}"])
    assert tree.longest_prefix({"a"}, foreign=1).passage_ids == ()
    assert tree.longest_prefix({"q29"}, foreign=1).passage_ids == ("p29", "q29")


def test_an_adopted_passage_is_looked_up_and_laid_out_like_any_other() -> None:
    tree = PrefixTree()
    template = WordTemplate()
    first = build_prompt(
        "q1?", _passages(["b", "aa", "c"]), template, max_prompt_tokens=10_000,
        layout="cache_aware", tree=tree,
    )  # fmt: skip
    index = {p.source_id: p for p in first.passages}

    def lookup(passage_id: str) -> ContextPassage | None:
        return index.get(passage_id)

    second = build_prompt(
        "q2?", _passages(["b", "c", "d"]), template, max_prompt_tokens=10_000,
        layout="cache_aware", tree=tree, adopt=1, lookup=lookup,
    )  # fmt: skip
    assert [p.source_id for p in second.passages] == ["aa", "b", "c"]
    assert second.adopted == ("aa",)
    shared = first.text.index("Question:")
    assert second.text[:shared] == first.text[:shared]  # the whole passage block is reused
    assert second.expected_cached_tokens == template.count_tokens(first.text[:shared].rstrip())
    # An adopted passage the index no longer holds: laid out without adoption.
    gone = build_prompt(
        "q3?", _passages(["b", "c", "d"]), template, max_prompt_tokens=10_000,
        layout="cache_aware", tree=tree, adopt=1, lookup=lambda _: None,
    )  # fmt: skip
    assert [p.source_id for p in gone.passages] == ["b", "c", "d"]
    assert gone.adopted == ()
