"""Filtered search: the filter's semantics, the row masks, and faiss (flat, IVF, HNSW) and BM25
returning the best k of the allowed rows, never fewer hits than the allowed set holds."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

import faiss
import numpy as np
import pytest

from retrieval.index.ann import AnnConfig, SearchDepth, build_search_index
from retrieval.index.bm25_index import BM25Config, BM25Index
from retrieval.index.faiss_index import FaissIndex, IndexManifest, passage_to_json, read_passages
from retrieval.index.vector_search import RowSet, TorchExactSearch
from retrieval.ingest.file_source import FileSource
from retrieval.ingest.scan import scan
from retrieval.passage import Passage
from retrieval.search.filters import ALL_PASSAGES, FilterTable, PassageFilter, allowed_lookup

DIM = 16


def _passage(row: int, collection: str, path: str | None, tags: tuple[str, ...]) -> Passage:
    return Passage(
        passage_id=f"d{row}#0",
        doc_id=f"d{row}",
        position=0,
        title=f"doc {row}",
        text=f"text {row}",
        start_char=0,
        end_char=6,
        path=path,
        collection=collection,
        tags=tags,
    )


def _passages(count: int) -> list[Passage]:
    """Row r: collection a (even) or b (odd); path guide/ (r % 3 == 0) or api/; tag x every
    fourth row, tag y every fifth."""
    out = []
    for row in range(count):
        tags = tuple(t for t, every in (("x", 4), ("y", 5)) if row % every == 0)
        path = "guide/p.md" if row % 3 == 0 else "api/p.md"
        out.append(_passage(row, "a" if row % 2 == 0 else "b", path, tags))
    return out


def _expected(passages: list[Passage], passage_filter: PassageFilter) -> list[int]:
    return [row for row, p in enumerate(passages) if passage_filter.allows(p)]


FILTERS = [
    PassageFilter(collections=frozenset({"a"})),
    PassageFilter(collections=frozenset({"a", "b"})),
    PassageFilter(collections=frozenset({"nope"})),
    PassageFilter(path_prefix="guide/"),
    PassageFilter(tags=frozenset({"x"})),
    PassageFilter(tags=frozenset({"x", "y"})),
    PassageFilter(collections=frozenset({"b"}), path_prefix="api", tags=frozenset({"y"})),
]


@pytest.mark.parametrize("passage_filter", FILTERS, ids=lambda f: f.key)
def test_the_masks_allow_exactly_what_the_filter_allows(passage_filter: PassageFilter) -> None:
    passages = _passages(60)
    rows = FilterTable(passages).rows(passage_filter)
    assert rows is not None
    assert rows.rows.tolist() == _expected(passages, passage_filter)
    assert rows.mask.sum() == len(rows)
    assert rows.total == 60


def test_an_open_filter_is_no_filter_and_row_sets_are_reused() -> None:
    table = FilterTable(_passages(10))
    assert table.rows(None) is None
    assert table.rows(ALL_PASSAGES) is None
    assert table.rows(PassageFilter(tags=frozenset())) is None
    one = PassageFilter(collections=frozenset({"a", "b"}))
    assert table.rows(one) is table.rows(PassageFilter(collections=frozenset({"b", "a"})))
    assert table.collections == ("a", "b")


def test_within_intersects_the_collections_a_key_may_read() -> None:
    readable = frozenset({"a"})
    assert PassageFilter().within(readable).collections == readable
    asked = PassageFilter(collections=frozenset({"a", "b"}), path_prefix="g")
    assert asked.within(readable) == PassageFilter(frozenset({"a"}), "g")
    assert asked.within(None) is asked
    assert PassageFilter(collections=frozenset({"b"})).within(readable).collections == frozenset()


def test_a_path_prefix_never_matches_a_passage_without_a_path() -> None:
    assert not PassageFilter(path_prefix="x").allows(_passage(0, "a", None, ()))
    assert PassageFilter(path_prefix="").allows(_passage(0, "a", None, ()))


def test_lookup_by_id_hides_what_the_filter_does_not_allow() -> None:
    passages = {p.passage_id: p for p in _passages(4)}
    lookup = allowed_lookup(passages.get, PassageFilter(collections=frozenset({"b"})))
    assert lookup("d0#0") is None  # in a
    assert lookup("d1#0") is passages["d1#0"]
    assert lookup("missing") is None
    find = passages.get
    assert allowed_lookup(find, None) is find


def test_the_selector_bitmap_is_the_mask() -> None:
    mask = np.zeros(20, dtype=np.bool_)
    mask[[0, 7, 8, 19]] = True
    selector = RowSet(mask).selector()
    assert [row for row in range(20) if selector.is_member(row)] == [0, 7, 8, 19]


def _vectors(count: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    vectors = rng.standard_normal((count, DIM)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors


def _index(kind: str, vectors: np.ndarray, passages: list[Passage]) -> FaissIndex:
    flat = faiss.IndexFlatIP(DIM)
    flat.add(vectors)
    config = AnnConfig(kind=kind, nlist=16, hnsw_m=8)  # type: ignore[arg-type]
    search = build_search_index(flat, kind, config)  # type: ignore[arg-type]
    manifest = IndexManifest("hash", DIM, len(passages), "c", "n", 6, 2, index_type=kind)  # type: ignore[arg-type]
    return FaissIndex(manifest, search, passages)


def _exact(queries: np.ndarray, vectors: np.ndarray, rows: list[int], k: int) -> list[list[int]]:
    scores = queries @ vectors[rows].T
    return [[rows[i] for i in np.argsort(-s, kind="stable")[:k]] for s in scores]


@pytest.mark.parametrize("kind", ["flat", "ivf", "hnsw"])
@pytest.mark.parametrize("passage_filter", FILTERS[:1] + FILTERS[4:6], ids=lambda f: f.key)
def test_a_filtered_vector_search_is_full_and_only_allowed(
    kind: str, passage_filter: PassageFilter
) -> None:
    passages = _passages(2000)
    vectors = _vectors(2000)
    index = _index(kind, vectors, passages)
    allowed = FilterTable(passages).rows(passage_filter)
    assert allowed is not None
    queries = _vectors(5, seed=1)
    k = 10
    for hits in index.search_rows(queries, k, allowed=allowed):  # the index's default depth
        assert len(hits) == k
        assert all(allowed.mask[row] for row, _ in hits)
    # As deep as the whole index: every kind finds the exact best k of the allowed rows.
    deepest = SearchDepth(nprobe=16, ef_search=2000)
    got = index.search_rows(queries, k, deepest, allowed)
    assert [[row for row, _ in hits] for hits in got] == _exact(
        queries, vectors, allowed.rows.tolist(), k
    )


@pytest.mark.parametrize("kind", ["ivf", "hnsw"])
def test_a_narrow_filter_on_an_approximate_index_still_comes_back_full(kind: str) -> None:
    """A dozen allowed rows out of 2,000: IVF's probed lists or HNSW's walk miss most of them;
    the search falls back to all of them and finds the exact best."""
    passages = _passages(2000)
    vectors = _vectors(2000)
    index = _index(kind, vectors, passages)
    mask = np.zeros(2000, dtype=np.bool_)
    mask[np.arange(3, 2000, 167)] = True
    allowed = RowSet(mask)
    queries = _vectors(3, seed=2)
    got = index.search_rows(queries, 8, allowed=allowed)
    assert [[row for row, _ in hits] for hits in got] == _exact(
        queries, vectors, allowed.rows.tolist(), 8
    )


def test_k_above_the_allowed_rows_gives_them_all_and_an_empty_set_gives_nothing() -> None:
    passages = _passages(50)
    index = _index("flat", _vectors(50), passages)
    mask = np.zeros(50, dtype=np.bool_)
    mask[[4, 9]] = True
    hits = index.search_rows(_vectors(1, seed=3), 10, allowed=RowSet(mask))[0]
    assert sorted(row for row, _ in hits) == [4, 9]
    assert index.search_rows(_vectors(1), 10, allowed=RowSet(np.zeros(50, np.bool_))) == [[]]


def test_an_index_searched_elsewhere_filters_on_its_cpu_copy() -> None:
    passages = _passages(100)
    vectors = _vectors(100)
    cpu = faiss.IndexFlatIP(DIM)
    cpu.add(vectors)
    manifest = IndexManifest("hash", DIM, 100, "c", "n", 6, 2)
    torch_placed = FaissIndex(manifest, TorchExactSearch(vectors), passages, cpu_index=cpu)
    allowed = FilterTable(passages).rows(FILTERS[0])
    assert allowed is not None
    queries = _vectors(2, seed=4)
    got = [[row for row, _ in h] for h in torch_placed.search_rows(queries, 5, allowed=allowed)]
    assert got == _exact(queries, vectors, allowed.rows.tolist(), 5)
    bare = FaissIndex(manifest, TorchExactSearch(vectors), passages)
    with pytest.raises(Exception, match="CPU"):
        bare.search_rows(queries, 5, allowed=allowed)


def test_bm25_ranks_only_allowed_rows_and_fills_k_from_them() -> None:
    texts = [f"postgres vacuum {'tuning ' * (i % 5)}row {i}" for i in range(40)]
    bm25 = BM25Index.build(texts, BM25Config())
    unfiltered = [row for row, _ in bm25.search("vacuum tuning", 40)]
    mask = np.zeros(40, dtype=np.bool_)
    mask[1::2] = True
    filtered = [row for row, _ in bm25.search("vacuum tuning", 10, mask)]
    assert len(filtered) == 10
    assert filtered == [row for row in unfiltered if mask[row]][:10]
    with pytest.raises(ValueError, match="mask"):
        bm25.search("vacuum", 3, np.ones(7, dtype=np.bool_))


def test_documents_take_tags_from_front_matter_else_their_folders(tmp_path: Path) -> None:
    root = tmp_path / "docs"
    (root / "guide" / "admin").mkdir(parents=True)
    (root / "guide" / "admin" / "backup.md").write_text("# Backup\n\nCopy the data folder.\n")
    (root / "tagged.md").write_text(
        "---\ntags: [ops, backup]\ndate: 2024-03-01\n---\n# Tagged\n\nRestore it.\n"
    )
    (root / "alone.txt").write_text("Plain text.\n")
    documents = {d.path: d for d in FileSource(scan([root]), "manual").documents()}
    backup = documents["docs/guide/admin/backup.md"]
    assert backup.tags == ("guide", "admin")
    assert backup.modified is not None
    assert backup.modified.endswith("+00:00")
    assert documents["docs/tagged.md"].tags == ("ops", "backup")
    assert documents["docs/tagged.md"].modified == "2024-03-01"
    assert documents["docs/alone.txt"].tags == ()
    assert {d.collection for d in documents.values()} == {"manual"}


def _read_back(lines: Iterable[str], folder: Path) -> Iterator[Passage]:
    path = folder / "passages.jsonl"
    path.write_text("".join(line + "\n" for line in lines))
    return iter(list(read_passages(path)))


def test_metadata_survives_passages_jsonl(tmp_path: Path) -> None:
    passage = _passage(1, "b", "guide/p.md", ("x", "y"))
    read = next(_read_back([passage_to_json(passage)], tmp_path))
    assert read == passage
    assert "tags" not in passage_to_json(_passage(2, "default", None, ()))


def test_a_short_hnsw_search_over_many_allowed_rows_walks_wider_instead_of_copying(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from retrieval.index import faiss_index

    monkeypatch.setattr(faiss_index, "_EXACT_FALLBACK_ROWS", 5)
    passages = _passages(2000)
    vectors = _vectors(2000)
    index = _index("hnsw", vectors, passages)
    mask = np.zeros(2000, dtype=np.bool_)
    mask[np.arange(3, 2000, 167)] = True
    allowed = RowSet(mask)
    for hits in index.search_rows(_vectors(3, seed=2), 8, allowed=allowed):
        assert len(hits) == 8
        assert all(allowed.mask[row] for row, _ in hits)
