from __future__ import annotations

import pytest

from retrieval.search.fusion import FusionConfig, reciprocal_rank_fusion


def test_a_row_ranked_high_in_both_lists_wins() -> None:
    dense = [7, 3, 1, 9]
    lexical = [5, 3, 8, 7]
    fused = reciprocal_rank_fusion([dense, lexical], limit=10)
    assert fused[0][0] == 3  # second in both beats first in one
    assert fused[1][0] == 7  # first and fourth
    assert [score for _, score in fused] == sorted((score for _, score in fused), reverse=True)
    assert {row for row, _ in fused} == {1, 3, 5, 7, 8, 9}


def test_scores_are_weighted_reciprocal_ranks() -> None:
    fused = dict(reciprocal_rank_fusion([[1, 2], [2]], k=10, weights=[1.0, 3.0], limit=5))
    assert fused[1] == pytest.approx(1 / 11)
    assert fused[2] == pytest.approx(1 / 12 + 3 / 11)


def test_weights_shift_the_order() -> None:
    dense = [1, 2, 3]
    lexical = [3, 2, 1]
    equal = reciprocal_rank_fusion([dense, lexical], limit=3)
    assert [row for row, _ in equal] == [1, 3, 2]
    assert equal[0][1] == equal[1][1], "1 and 3 tie: first in one list, third in the other"
    dense_heavy = reciprocal_rank_fusion([dense, lexical], weights=[2.0, 1.0], limit=3)
    lexical_heavy = reciprocal_rank_fusion([dense, lexical], weights=[1.0, 2.0], limit=3)
    assert [row for row, _ in dense_heavy] == [1, 2, 3]
    assert [row for row, _ in lexical_heavy] == [3, 2, 1]


def test_a_zero_weight_list_is_left_out() -> None:
    fused = reciprocal_rank_fusion([[1, 2], [9, 2]], weights=[1.0, 0.0], limit=5)
    assert [row for row, _ in fused] == [1, 2]


def test_limit_is_respected() -> None:
    lists = [list(range(50)), list(range(49, -1, -1))]
    assert len(reciprocal_rank_fusion(lists, limit=7)) == 7
    assert reciprocal_rank_fusion(lists, limit=0) == []
    assert len(reciprocal_rank_fusion([[1, 2]], limit=10)) == 2


def test_ties_go_to_first_appearance_rank_by_rank() -> None:
    # 4 and 6 are both first in one list; 5 and 8 both second: equal scores in each pair.
    fused = reciprocal_rank_fusion([[4, 5], [6, 8]], limit=4)
    assert [row for row, _ in fused] == [4, 6, 5, 8]
    swapped = reciprocal_rank_fusion([[6, 8], [4, 5]], limit=4)
    assert [row for row, _ in swapped] == [6, 4, 8, 5]


def test_ties_are_exact_whatever_the_order_of_lists() -> None:
    lists = [[1, 2, 3], [2, 3, 1], [3, 1, 2]]
    fused = reciprocal_rank_fusion(lists, k=1, limit=3)
    assert len({score for _, score in fused}) == 1
    assert [row for row, _ in fused] == [1, 2, 3]
    assert fused == reciprocal_rank_fusion(lists, k=1, limit=3), "deterministic"


def test_a_row_repeated_in_one_list_counts_once() -> None:
    fused = dict(reciprocal_rank_fusion([[1, 1, 2]], k=0, limit=5))
    assert fused == {1: 1.0, 2: pytest.approx(1 / 3)}


def test_empty_inputs() -> None:
    assert reciprocal_rank_fusion([], limit=5) == []
    assert reciprocal_rank_fusion([[], []], limit=5) == []


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"weights": [1.0]}, "1 weights for 2 ranked lists"),
        ({"weights": [1.0, -1.0]}, "non-negative"),
        ({"weights": [1.0, float("nan")]}, "finite"),
        ({"k": -1}, "k must be"),
    ],
)
def test_bad_arguments_are_refused(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        reciprocal_rank_fusion([[1], [2]], limit=3, **kwargs)  # type: ignore[arg-type]


def test_fusion_config() -> None:
    config = FusionConfig(dense_weight=2.0, lexical_weight=0.5)
    assert config.weights == (2.0, 0.5)
    fused = reciprocal_rank_fusion([[1], [2]], k=config.rrf_k, weights=config.weights, limit=2)
    assert [row for row, _ in fused] == [1, 2]
    with pytest.raises(ValueError, match="unknown fusion method"):
        FusionConfig(method="sum")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="rrf_k"):
        FusionConfig(rrf_k=-1)
    with pytest.raises(ValueError, match="non-negative"):
        FusionConfig(lexical_weight=-0.5)
