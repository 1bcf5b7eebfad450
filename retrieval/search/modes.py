"""The built-in search modes, by name: the one place a mode is registered."""

from __future__ import annotations

from retrieval.index.loaded import LoadedIndex
from retrieval.search import dense, hybrid, lexical
from retrieval.search.base import ModeUnavailableError, SearchConfig, Searcher, SearcherFactory

SEARCH_MODES: dict[str, SearcherFactory] = {
    "dense": dense.build,
    "lexical": lexical.build,
    "hybrid": hybrid.build,
}

_EXTRA_MODES: dict[str, SearcherFactory] = {}


def register_mode(mode: str, factory: SearcherFactory) -> None:
    """Add a search mode at run time (the built-in ones are listed in `SEARCH_MODES`)."""
    _EXTRA_MODES[mode] = factory


def unregister_mode(mode: str) -> None:
    _EXTRA_MODES.pop(mode, None)


def factories() -> dict[str, SearcherFactory]:
    return {**SEARCH_MODES, **_EXTRA_MODES}


def registered_modes() -> tuple[str, ...]:
    return tuple(factories())


def build_searchers(index: LoadedIndex, config: SearchConfig) -> dict[str, Searcher]:
    """Every registered mode this index can serve, by name."""
    searchers: dict[str, Searcher] = {}
    for mode, factory in factories().items():
        try:
            searchers[mode] = factory(index, config)
        except ModeUnavailableError:
            continue
    return searchers
