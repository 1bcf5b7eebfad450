"""The built-in search modes, by name: the one place a mode is registered."""

from __future__ import annotations

from retrieval.search import dense, hybrid, lexical
from retrieval.search.base import SearcherFactory

SEARCH_MODES: dict[str, SearcherFactory] = {
    "dense": dense.build,
    "lexical": lexical.build,
    "hybrid": hybrid.build,
}
