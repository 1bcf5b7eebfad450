"""The service's own routing over SGLang workers by passage prefix."""

from __future__ import annotations

import pytest

from generation.prefix_routing import PrefixRouter


def test_a_prompt_goes_where_its_prefix_was_sent() -> None:
    router = PrefixRouter(["w0", "w1"])
    first = router.choose(["a", "b"])
    router.tree(first).insert(["a", "b"])
    router.release(first)
    other = router.choose(["x", "y"])  # nothing cached anywhere: the other worker, in turn
    router.tree(other).insert(["x", "y"])
    router.release(other)
    assert other != first
    for _ in range(5):
        worker = router.choose(["b", "a", "c"])
        assert worker == first
        router.release(worker)
        worker = router.choose(["y", "x"])
        assert worker == other
        router.release(worker)


def test_with_adoption_a_prompt_goes_where_a_prefix_can_bring_its_passages() -> None:
    router = PrefixRouter(["w0", "w1"])
    router.tree("w0").insert(["x", "a", "b"])  # a, b behind another question's x
    router.tree("w1").insert(["a", "z"])
    plain = router.choose(["a", "b", "c"])
    router.release(plain)
    assert plain == "w1"  # without adoption only w1's "a" can be reused
    adopting = router.choose(["a", "b", "c"], foreign=1)
    router.release(adopting)
    assert adopting == "w0"  # x comes along: a and b are reused there
    # What counts is this prompt's passages reused, not the others brought along: with a, b
    # on both, neither wins for x (the choice rotates, as between idle workers).
    router.tree("w1").insert(["a", "b", "q"])
    tie = []
    for _ in range(2):
        tie.append(router.choose(["a", "b", "c"], foreign=1))
        router.release(tie[-1])
    assert set(tie) == {"w0", "w1"}


def test_load_imbalance_overrides_the_cache() -> None:
    router = PrefixRouter(["w0", "w1"], max_imbalance=1)
    router.tree("w0").insert(["a"])
    assert router.choose(["a"]) == "w0"
    assert router.choose(["a"]) == "w0"  # 2 vs 0 in flight would exceed the imbalance of 1
    assert router.in_flight("w0") == 2
    assert router.choose(["a"]) == "w1"
    router.release("w0")
    router.release("w0")
    assert router.in_flight("w0") == 0
    router.release("w0")  # never below zero
    assert router.in_flight("w0") == 0


def test_round_robin_ignores_the_cache() -> None:
    router = PrefixRouter(["w0", "w1", "w2"], policy="round_robin")
    router.tree("w0").insert(["a"])
    assert [router.choose(["a"]) for _ in range(4)] == ["w0", "w1", "w2", "w0"]


def test_ties_rotate_over_idle_workers() -> None:
    router = PrefixRouter(["w0", "w1"])
    chosen = []
    for _ in range(4):
        worker = router.choose(["new"])
        chosen.append(worker)
        router.release(worker)
    assert sorted(set(chosen)) == ["w0", "w1"]


@pytest.mark.parametrize("workers", [[], ["w", "w"]])
def test_invalid_worker_lists(workers: list[str]) -> None:
    with pytest.raises(ValueError, match="worker"):
        PrefixRouter(workers)
