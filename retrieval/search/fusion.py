"""Fusing ranked lists of passage rows (dense, lexical) into one ranking.

Reciprocal rank fusion (Cormack, Clarke and Büttcher, SIGIR 2009): a row scores
`sum over lists of weight / (k + rank)`, rank counted from 1, over the lists it appears in.
Only ranks matter, so scores on different scales (inner products, BM25) need no calibration.
Pure code: the standard library only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

FusionMethod = Literal["rrf"]


@dataclass(frozen=True, slots=True)
class FusionConfig:
    """How the dense and the lexical lists are fused; `weights` gives them in that order."""

    method: FusionMethod = "rrf"
    rrf_k: int = 60
    dense_weight: float = 1.0
    lexical_weight: float = 1.0

    def __post_init__(self) -> None:
        if self.method != "rrf":
            raise ValueError(f"unknown fusion method {self.method!r}")
        if self.rrf_k < 0:
            raise ValueError("rrf_k must be non-negative")
        _check_weights((self.dense_weight, self.lexical_weight))

    @property
    def weights(self) -> tuple[float, float]:
        return (self.dense_weight, self.lexical_weight)


def _check_weights(weights: Sequence[float]) -> None:
    for weight in weights:
        if not (math.isfinite(weight) and weight >= 0.0):
            raise ValueError(f"weights must be finite and non-negative, got {weight}")


def reciprocal_rank_fusion(
    ranked_lists: Sequence[Sequence[int]],
    *,
    k: int = 60,
    weights: Sequence[float] | None = None,
    limit: int,
) -> list[tuple[int, float]]:
    """The best `limit` rows of the fused ranking, as (row, fused score), best first.

    Each list is best first; a row repeated within one list counts at its best rank only. A
    list of weight 0 is left out, so its rows appear only if another list has them.

    Ties (equal fused scores) go to the row that appears first when the lists are read rank
    by rank: every list's first row in list order, then every list's second row, and so on.
    Scores are summed exactly (`math.fsum`), so the order of lists never perturbs a tie.
    """
    if weights is None:
        weights = [1.0] * len(ranked_lists)
    if len(weights) != len(ranked_lists):
        raise ValueError(f"{len(weights)} weights for {len(ranked_lists)} ranked lists")
    _check_weights(weights)
    if k < 0:
        raise ValueError("k must be non-negative")
    if limit <= 0:
        return []
    contributions = _contributions(ranked_lists, weights, k)
    fused = [(row, math.fsum(parts)) for row, parts in contributions.items()]
    # sorted() is stable and `contributions` is in order of first appearance: that breaks ties.
    fused.sort(key=lambda item: -item[1])
    return fused[:limit]


def _contributions(
    ranked_lists: Sequence[Sequence[int]], weights: Sequence[float], k: int
) -> dict[int, list[float]]:
    """Each row's terms `weight / (k + rank)`, keyed in order of first appearance rank by rank."""
    lists = [rows for rows, weight in zip(ranked_lists, weights, strict=True) if weight > 0.0]
    kept = [weight for weight in weights if weight > 0.0]
    seen: list[set[int]] = [set() for _ in lists]
    contributions: dict[int, list[float]] = {}
    depth = max((len(rows) for rows in lists), default=0)
    for rank in range(1, depth + 1):
        for rows, weight, seen_here in zip(lists, kept, seen, strict=True):
            if rank > len(rows) or rows[rank - 1] in seen_here:
                continue
            row = rows[rank - 1]
            seen_here.add(row)
            contributions.setdefault(row, []).append(weight / (k + rank))
    return contributions
