"""Dense search: the faiss index's inner product with the query's embedding."""

from __future__ import annotations

from retrieval.errors import RetrievalError
from retrieval.index.loaded import LoadedIndex
from retrieval.passage import ScoredPassage
from retrieval.search.base import SearchConfig, SearchRequest, passages_of


class DenseSearcher:
    mode = "dense"
    needs_vector = True

    def __init__(self, index: LoadedIndex) -> None:
        self._index = index

    def rows(self, request: SearchRequest, k: int) -> list[tuple[int, float]]:
        if request.vector is None:
            raise RetrievalError("dense search needs the query vector")
        dense = self._index.dense
        return dense.search_rows(request.vector, k, request.depth, request.allowed)[0]

    def search(self, request: SearchRequest) -> list[ScoredPassage]:
        return passages_of(self._index, self.rows(request, request.k))


def build(index: LoadedIndex, config: SearchConfig) -> DenseSearcher:
    return DenseSearcher(index)
