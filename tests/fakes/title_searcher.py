"""A search mode in one file: passages whose title shares a word with the query. Honours
`Searcher` (retrieval/search/base.py); registered at run time by the tests that use it, to show
that a mode is a class, a factory and one registration."""

from __future__ import annotations

from retrieval.index.loaded import LoadedIndex
from retrieval.passage import ScoredPassage
from retrieval.search.base import SearchConfig, SearchRequest


class TitleSearcher:
    mode = "title"
    needs_vector = False

    def __init__(self, index: LoadedIndex) -> None:
        self._index = index

    def search(self, request: SearchRequest) -> list[ScoredPassage]:
        words = set(request.query.lower().split())
        hits = []
        for row in range(len(self._index)):
            passage = self._index.passage(row)
            shared = len(words & set(passage.title.lower().split()))
            if shared:
                hits.append(ScoredPassage(passage, float(shared)))
        return sorted(hits, key=lambda hit: -hit.score)[: max(request.k, 0)]


def build(index: LoadedIndex, config: SearchConfig) -> TitleSearcher:
    return TitleSearcher(index)
