"""Search modes: each a `Searcher` behind one protocol, built from an opened index by a factory
registered under the mode's name.

A mode is one file with a class that honours `Searcher` and a `build` function, plus one line
in `SEARCH_MODES` (modes.py; or `register_mode` at run time, for a plugin or a test). Nothing outside
`retrieval/` decides anything by a mode's name: it asks the searcher (`needs_vector`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from retrieval.embedder import Vectors
from retrieval.errors import RetrievalError
from retrieval.index.ann import SearchDepth
from retrieval.index.loaded import LoadedIndex
from retrieval.index.vector_search import RowSet
from retrieval.passage import ScoredPassage
from retrieval.search.fusion import FusionConfig


@dataclass(frozen=True, slots=True)
class SearchRequest:
    query: str
    # The query's embedding, for modes that need one (`Searcher.needs_vector`).
    vector: Vectors | None
    k: int
    depth: SearchDepth | None = None
    # The rows the search may return (`filters.FilterTable.rows`), filtered inside the
    # search: the best k of them. None: every row.
    allowed: RowSet | None = None


class Searcher(Protocol):
    """Blocking and safe to call from several threads at once."""

    @property
    def mode(self) -> str: ...

    @property
    def needs_vector(self) -> bool: ...

    def search(self, request: SearchRequest) -> list[ScoredPassage]: ...


@dataclass(frozen=True, slots=True)
class SearchConfig:
    fusion: FusionConfig = field(default_factory=FusionConfig)
    # Candidates each list gives the fusion (at least the k asked for).
    fusion_depth: int = 50


class ModeUnavailableError(RetrievalError):
    """The index lacks what the mode needs (a lexical index, say)."""


SearcherFactory = Callable[[LoadedIndex, SearchConfig], Searcher]
"""Builds a mode's searcher over an index; raises `ModeUnavailableError` when it cannot."""


def passages_of(index: LoadedIndex, hits: list[tuple[int, float]]) -> list[ScoredPassage]:
    return [ScoredPassage(index.passage(row), score) for row, score in hits]
