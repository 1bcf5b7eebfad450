"""Lexical search: BM25 over the same passages (built with the index by default)."""

from __future__ import annotations

from retrieval.index.bm25_index import BM25Index
from retrieval.index.loaded import LoadedIndex
from retrieval.passage import ScoredPassage
from retrieval.search.base import (
    ModeUnavailableError,
    SearchConfig,
    SearchRequest,
    passages_of,
)


class LexicalSearcher:
    mode = "lexical"
    needs_vector = False

    def __init__(self, index: LoadedIndex, bm25: BM25Index) -> None:
        self._index = index
        self._bm25 = bm25

    def rows(self, request: SearchRequest, k: int) -> list[tuple[int, float]]:
        allowed = None if request.allowed is None else request.allowed.mask
        return self._bm25.search(request.query, k, allowed)

    def search(self, request: SearchRequest) -> list[ScoredPassage]:
        return passages_of(self._index, self.rows(request, request.k))


def build(index: LoadedIndex, config: SearchConfig) -> LexicalSearcher:
    if index.lexical is None:
        raise ModeUnavailableError(f"the index at {index.directory} has no lexical index")
    return LexicalSearcher(index, index.lexical)
