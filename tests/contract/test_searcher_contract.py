"""The `Searcher` contract (retrieval/search/base.py), for every registered mode over a real
faiss and BM25 index, and for the one-file mode of the fakes."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from retrieval.errors import RetrievalError
from retrieval.index.loaded import LoadedIndex
from retrieval.search.base import SearchConfig, Searcher, SearchRequest
from retrieval.search.modes import factories
from tests.builders import make_index
from tests.fakes import title_searcher
from tests.fakes.hash_embedder import HashEmbedder

MODES = [*factories(), "title"]


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> LoadedIndex:
    directory = make_index(tmp_path_factory.mktemp("searcher"))
    embedder = HashEmbedder()
    return LoadedIndex.open(directory, embedder=embedder.name, dimension=embedder.dimension)


@pytest.fixture(params=MODES)
def searcher(request: pytest.FixtureRequest, index: LoadedIndex) -> Searcher:
    if request.param == "title":
        return title_searcher.build(index, SearchConfig())
    return factories()[request.param](index, SearchConfig())


def _request(searcher: Searcher, query: str, k: int) -> SearchRequest:
    vector = HashEmbedder().encode([query]) if searcher.needs_vector else None
    return SearchRequest(query, vector, k)


def test_at_most_k_distinct_passages_best_first(searcher: Searcher) -> None:
    hits = searcher.search(_request(searcher, "the green tea of the moon", 3))
    assert 0 < len(hits) <= 3
    ids = [hit.passage.passage_id for hit in hits]
    assert len(set(ids)) == len(ids)
    scores = [hit.score for hit in hits]
    assert scores == sorted(scores, reverse=True)


def test_the_passage_that_matches_comes_first(searcher: Searcher) -> None:
    (first, *_) = searcher.search(_request(searcher, "Volcanoes Mount Etna Sicily", 2))
    assert first.passage.doc_id == "volcano"


def test_k_zero_finds_nothing(searcher: Searcher) -> None:
    assert searcher.search(_request(searcher, "tea", 0)) == []


def test_concurrent_searches_agree_with_sequential_ones(searcher: Searcher) -> None:
    queries = ["tea", "coffee espresso", "the moon", "river Danube", "volcano"] * 4
    expected = [searcher.search(_request(searcher, q, 3)) for q in queries]
    with ThreadPoolExecutor(4) as pool:
        found = list(pool.map(lambda q: searcher.search(_request(searcher, q, 3)), queries))
    assert found == expected


def test_a_mode_that_needs_the_vector_refuses_to_search_without_it(searcher: Searcher) -> None:
    if not searcher.needs_vector:
        pytest.skip(f"{searcher.mode} needs no vector")
    with pytest.raises(RetrievalError):
        searcher.search(SearchRequest("tea", None, 3))
