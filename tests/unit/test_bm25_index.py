from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from retrieval.errors import IndexMismatchError, IndexNotFoundError
from retrieval.index.bm25_index import BM25Config, BM25Index

TEXTS = [
    "Cats\nCats purr and sleep most of the day in the sun.",
    "Rust\nRust has ownership, borrowing and lifetimes.",
    "Tea\nGreen tea is steeped briefly in water below boiling.",
    "Dogs\nDogs bark at the mail carrier and sleep at night.",
    "Coffee\nCoffee beans are roasted, ground and brewed with hot water.",
]


@pytest.fixture(scope="module")
def index() -> BM25Index:
    return BM25Index.build(TEXTS, BM25Config())


def test_search_ranks_the_matching_passage_first(index: BM25Index) -> None:
    hits = index.search("how long is green tea steeped", 3)
    assert hits[0][0] == 2
    assert all(isinstance(row, int) and isinstance(score, float) for row, score in hits)
    assert [score for _, score in hits] == sorted((score for _, score in hits), reverse=True)


def test_only_passages_sharing_a_term_come_back(index: BM25Index) -> None:
    hits = index.search("water", 10)
    assert sorted(row for row, _ in hits) == [2, 4]
    assert all(score > 0 for _, score in hits)


def test_k_bounds_the_hits(index: BM25Index) -> None:
    assert len(index.search("sleep water rust", 2)) == 2
    assert index.search("sleep", 0) == []


@pytest.mark.parametrize("query", ["", "   ", "the of and to", "zebra quokka", "!!! ?"])
def test_queries_without_known_terms_give_nothing(index: BM25Index, query: str) -> None:
    assert index.search(query, 5) == []


def test_stemming_matches_word_forms() -> None:
    stemmed = BM25Index.build(TEXTS, BM25Config(stemmer_language="english"))
    plain = BM25Index.build(TEXTS, BM25Config(stemmer_language=None))
    assert {row for row, _ in stemmed.search("sleeping cat", 5)} == {0, 3}
    assert plain.search("sleeping cat", 5) == []


def test_stopwords_can_be_kept() -> None:
    kept = BM25Index.build(TEXTS, BM25Config(stopwords=None))
    assert kept.search("the", 5)
    assert BM25Index.build(TEXTS, BM25Config(stopwords="en")).search("the", 5) == []


def test_equal_scores_come_in_row_order() -> None:
    same = BM25Index.build(["alpha beta", "gamma", "alpha beta", "alpha beta"], BM25Config())
    hits = same.search("alpha", 3)
    assert [row for row, _ in hits] == [0, 2, 3]
    assert len({score for _, score in hits}) == 1
    assert [row for row, _ in same.search("alpha", 2)] == [0, 2]


def test_empty_documents_are_rows_that_never_match() -> None:
    index = BM25Index.build(["", "tea leaves", ""], BM25Config())
    assert len(index) == 3
    assert [row for row, _ in index.search("tea", 5)] == [1]


def test_no_documents_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one document"):
        BM25Index.build([], BM25Config())


def test_save_load_round_trip_keeps_scores_and_tokenization(tmp_path: Path) -> None:
    config = BM25Config(k1=1.2, b=0.75, stemmer_language=None, stopwords=None)
    built = BM25Index.build(TEXTS, config)
    built.save(tmp_path)
    loaded = BM25Index.load(tmp_path, passage_count=len(TEXTS))
    assert loaded.config == config
    assert len(loaded) == len(TEXTS)
    for query in ("green tea water", "the sleep", "sleeping", "rust lifetimes"):
        assert loaded.search(query, 5) == built.search(query, 5)
    assert loaded.search("sleeping", 5) == [], "no stemming after load either"


def test_save_replaces_a_previous_index_and_leaves_no_staging(tmp_path: Path) -> None:
    BM25Index.build(TEXTS[:2], BM25Config()).save(tmp_path)
    BM25Index.build(TEXTS, BM25Config()).save(tmp_path)
    assert len(BM25Index.load(tmp_path, passage_count=len(TEXTS))) == len(TEXTS)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["bm25"]


def test_load_refuses_a_different_passage_count(tmp_path: Path) -> None:
    BM25Index.build(TEXTS, BM25Config()).save(tmp_path)
    with pytest.raises(IndexMismatchError, match="built over 5 documents, the index has 6"):
        BM25Index.load(tmp_path, passage_count=6)


def test_load_refuses_a_missing_index(tmp_path: Path) -> None:
    with pytest.raises(IndexNotFoundError, match="no BM25 index"):
        BM25Index.load(tmp_path, passage_count=5)


def test_load_refuses_a_manifest_that_disagrees_with_the_matrix(tmp_path: Path) -> None:
    BM25Index.build(TEXTS, BM25Config()).save(tmp_path)
    manifest_path = tmp_path / "bm25" / "bm25_manifest.json"
    raw = json.loads(manifest_path.read_text())
    raw["document_count"] = 6
    manifest_path.write_text(json.dumps(raw))
    with pytest.raises(IndexMismatchError, match="matrix holds 5 documents, manifest says 6"):
        BM25Index.load(tmp_path, passage_count=6)


def test_load_refuses_an_unreadable_manifest_or_matrix(tmp_path: Path) -> None:
    BM25Index.build(TEXTS, BM25Config()).save(tmp_path)
    (tmp_path / "bm25" / "data.csc.index.npy").unlink()
    with pytest.raises(IndexMismatchError, match="cannot read the BM25 index"):
        BM25Index.load(tmp_path, passage_count=5)
    (tmp_path / "bm25" / "bm25_manifest.json").write_text("{broken")
    with pytest.raises(IndexMismatchError, match="unreadable BM25 manifest"):
        BM25Index.load(tmp_path, passage_count=5)


def test_concurrent_readers_see_what_a_single_reader_sees(index: BM25Index) -> None:
    queries = ["sleeping cats", "green tea", "roasted coffee beans", "rust ownership", "dogs"] * 40
    expected = [index.search(query, 3) for query in queries]
    with ThreadPoolExecutor(max_workers=8) as pool:
        assert list(pool.map(lambda query: index.search(query, 3), queries)) == expected


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"k1": -0.1}, "k1"),
        ({"b": 1.5}, "b must be"),
        ({"stemmer_language": "klingon"}, "unknown stemmer language"),
        ({"stopwords": "xx"}, "unknown stopwords"),
    ],
)
def test_config_refuses_bad_values(fields: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        BM25Config(**fields)  # type: ignore[arg-type]
