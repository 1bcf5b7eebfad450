"""Hybrid search: the dense and the lexical lists, each `fusion_depth` deep, fused by
reciprocal rank (`fusion.py`). A filtered search filters both lists inside their searches, so
the fusion sees only allowed rows, each list as deep as unfiltered."""

from __future__ import annotations

from retrieval.index.loaded import LoadedIndex
from retrieval.passage import ScoredPassage
from retrieval.search import dense, lexical
from retrieval.search.base import SearchConfig, SearchRequest, passages_of
from retrieval.search.fusion import reciprocal_rank_fusion


class HybridSearcher:
    mode = "hybrid"
    needs_vector = True

    def __init__(
        self,
        index: LoadedIndex,
        dense_side: dense.DenseSearcher,
        lexical_side: lexical.LexicalSearcher,
        config: SearchConfig,
    ) -> None:
        self._index = index
        self._dense = dense_side
        self._lexical = lexical_side
        self._config = config

    def search(self, request: SearchRequest) -> list[ScoredPassage]:
        depth = max(request.k, self._config.fusion_depth)
        lists = [self._dense.rows(request, depth), self._lexical.rows(request, depth)]
        fusion = self._config.fusion
        hits = reciprocal_rank_fusion(
            [[row for row, _ in ranked] for ranked in lists],
            k=fusion.rrf_k,
            weights=fusion.weights,
            limit=request.k,
        )
        return passages_of(self._index, hits)


def build(index: LoadedIndex, config: SearchConfig) -> HybridSearcher:
    return HybridSearcher(index, dense.build(index, config), lexical.build(index, config), config)
