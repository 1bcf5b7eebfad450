"""A faiss inner-product index of passage vectors, saved to a directory with a manifest.

Directory layout: `manifest.json` (what built it), `index.faiss` (the vectors) and
`passages.jsonl` (row i of the index is line i). Loading checks the three agree with each
other and with the embedder in use, and refuses a mismatch with a clear error.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Sequence
from dataclasses import MISSING, asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import faiss
import numpy as np

from retrieval.embedder import Vectors
from retrieval.errors import IndexMismatchError, IndexNotFoundError, RetrievalError
from retrieval.index.ann import IndexKind, SearchDepth, search_parameters
from retrieval.index.generations import served_generation
from retrieval.index.placement import GpuBackends, IndexPlacement, place_index
from retrieval.index.vector_search import FaissSearch, RowSet, VectorSearch
from retrieval.passage import Passage, ScoredPassage

logger = logging.getLogger(__name__)

# 3: the passages' sentences and their vectors are stored with the index (sentences/).
# 4: a sentence's vector is pooled from its passage's pass (retrieval/sentences/store.py).
FORMAT_VERSION = 4
MANIFEST_FILE = "manifest.json"
INDEX_FILE = "index.faiss"
PASSAGES_FILE = "passages.jsonl"
# A filtered HNSW search that came back short scans the allowed rows' vectors exactly up to this
# many (50,000 x 384 float32: 77 MB copied out for the query); above it, efSearch this wide.
_EXACT_FALLBACK_ROWS = 50_000
_WIDE_EF_SEARCH = 1024


@dataclass(frozen=True, slots=True)
class IndexManifest:
    embedder: str
    dimension: int
    passage_count: int
    corpus_checksum: str
    corpus_name: str
    passage_tokens: int
    overlap_tokens: int
    index_type: IndexKind = "flat"
    nlist: int | None = None
    hnsw_m: int | None = None
    lexical_index: Literal["bm25"] | None = None
    format_version: int = FORMAT_VERSION

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> IndexManifest:
        raw: dict[str, Any] = json.loads(text)
        known = set(cls.__dataclass_fields__)
        return cls(**{key: value for key, value in raw.items() if key in known})


def read_manifest(directory: Path) -> IndexManifest:
    path = directory / MANIFEST_FILE
    if not path.is_file():
        raise IndexNotFoundError(
            f"no index at {directory} (missing {MANIFEST_FILE}); "
            "build one with `answer-service index build CORPUS --out DIR`"
        )
    try:
        return IndexManifest.from_json(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, TypeError) as exc:
        raise IndexMismatchError(f"unreadable manifest {path}: {exc}") from exc


class FaissIndex:
    """Passages and their vectors; `search` is blocking and thread-safe for readers (a search
    placed on a GPU takes its turn, see `vector_search.SerialSearch`)."""

    def __init__(
        self,
        manifest: IndexManifest,
        index: VectorSearch | Any,
        passages: Sequence[Passage],
        cpu_index: Any | None = None,
    ) -> None:
        """`index`: a `VectorSearch`, or a faiss CPU index (searched as it is). `cpu_index`:
        the faiss CPU index that filtered searches run on where `index` is placed elsewhere
        (a GPU: faiss-gpu and torch take no ID selector)."""
        search = index if isinstance(index, VectorSearch) else FaissSearch(index)
        if cpu_index is None and search.backend == "faiss-cpu" and isinstance(search, FaissSearch):
            cpu_index = search.index
        if search.ntotal != len(passages) or manifest.passage_count != len(passages):
            raise IndexMismatchError(
                f"index holds {search.ntotal} vectors and {len(passages)} passages, "
                f"manifest says {manifest.passage_count}"
            )
        self.manifest = manifest
        self._index = search
        self._passages = list(passages)
        self._cpu_index = cpu_index
        self._rows_by_id: dict[str, int] | None = None

    def __len__(self) -> int:
        return len(self._passages)

    @property
    def device(self) -> str:
        """Where searches run: "cpu" or "cuda:N"."""
        return self._index.device

    @property
    def search_backend(self) -> str:
        """What runs them: "faiss-cpu", "faiss-gpu" or "torch"."""
        return self._index.backend

    def passage(self, row: int) -> Passage:
        return self._passages[row]

    def row_of(self, passage_id: str) -> int:
        rows = self._rows()
        if passage_id not in rows:
            raise RetrievalError(f"the index holds no passage {passage_id!r}")
        return rows[passage_id]

    def _rows(self) -> dict[str, int]:
        rows = self._rows_by_id
        if rows is None:
            rows = {passage.passage_id: row for row, passage in enumerate(self._passages)}
            self._rows_by_id = rows
        return rows

    def passage_by_id(self, passage_id: str) -> Passage | None:
        """The passage with this id, if the index holds it (the id map is built on first use:
        only cache-aware adoption asks, see generation/prefix_order.py)."""
        row = self._rows().get(passage_id)
        return None if row is None else self._passages[row]

    def search_rows(
        self,
        queries: Vectors,
        k: int,
        depth: SearchDepth | None = None,
        allowed: RowSet | None = None,
    ) -> list[list[tuple[int, float]]]:
        """(row, score) pairs per query, best first; row i is `passage(i)`. With `allowed`,
        only its rows, filtered inside the search: the best `k` of the allowed set, not the
        allowed few of the best `k` (see `_search_among`)."""
        if queries.ndim != 2 or queries.shape[1] != self.manifest.dimension:
            raise RetrievalError(
                f"query vectors of shape {queries.shape} do not fit dimension "
                f"{self.manifest.dimension}"
            )
        queries = np.ascontiguousarray(queries, dtype=np.float32)
        k = min(k, len(self._passages) if allowed is None else len(allowed))
        if k <= 0:
            return [[] for _ in range(queries.shape[0])]
        if allowed is not None:
            if allowed.total != len(self._passages):
                raise RetrievalError(
                    f"a row filter over {allowed.total} rows for an index of {len(self)}"
                )
            scores, rows = self._search_among(queries, k, depth, allowed)
        else:
            params = search_parameters(self.manifest.index_type, depth)
            scores, rows = self._index.search(queries, k, params)
        return [
            [(int(row), float(score)) for score, row in zip(s_row, r_row, strict=True) if row >= 0]
            for s_row, r_row in zip(scores, rows, strict=True)
        ]

    def _search_among(
        self, queries: Vectors, k: int, depth: SearchDepth | None, allowed: RowSet
    ) -> tuple[Any, Any]:
        """A filtered search on the CPU index with faiss's ID selector (a bitmap: O(1) a
        candidate). Flat: exact. IVF and HNSW skip disallowed rows as they go, so a narrow
        filter can leave fewer than `k` hits in the lists probed or the graph walked; then the
        allowed rows are searched exhaustively (IVF: every list; HNSW: their vectors, exactly,
        up to `_EXACT_FALLBACK_ROWS` of them; more: the graph walked with a wide efSearch), so
        a filtered search comes back full."""
        index = self._cpu_index
        if index is None:
            raise RetrievalError(
                f"filtered search needs a faiss CPU index; this one is searched by "
                f"{self.search_backend} and was given no CPU copy"
            )
        kind = self.manifest.index_type
        params = search_parameters(kind, depth, allowed.selector())
        scores, rows = index.search(queries, k, params=params)
        if kind == "flat" or bool((rows[:, k - 1] >= 0).all()):
            return scores, rows
        if kind == "ivf":
            full = search_parameters(kind, SearchDepth(nprobe=int(index.nlist)), allowed.selector())
            exhaustive: tuple[Any, Any] = index.search(queries, k, params=full)
            return exhaustive
        if len(allowed) > _EXACT_FALLBACK_ROWS:  # too many to copy out: walk the graph wider
            wider = search_parameters(
                kind, SearchDepth(ef_search=_WIDE_EF_SEARCH), allowed.selector()
            )
            widened: tuple[Any, Any] = index.search(queries, k, params=wider)
            return widened
        vectors = index.reconstruct_batch(allowed.rows)
        products = queries @ vectors.T
        top = np.argsort(-products, axis=1, kind="stable")[:, :k]
        return np.take_along_axis(products, top, axis=1), allowed.rows[top]

    def search(
        self, queries: Vectors, k: int, depth: SearchDepth | None = None
    ) -> list[list[ScoredPassage]]:
        return [
            [ScoredPassage(self._passages[row], score) for row, score in hits]
            for hits in self.search_rows(queries, k, depth)
        ]

    @classmethod
    def load(
        cls,
        directory: Path,
        *,
        embedder: str,
        dimension: int,
        corpus_checksum: str | None = None,
        device: str = "auto",
        max_gpu_bytes: int | None = None,
        gpus: GpuBackends | None = None,
    ) -> FaissIndex:
        """Load and check against the embedder in use (and the corpus, when given), then place
        it (`device`: auto, cpu, cuda or cuda:N; `max_gpu_bytes`: its share of that GPU)."""
        directory = served_generation(directory)
        manifest = read_manifest(directory)
        check_manifest(
            manifest,
            embedder=embedder,
            dimension=dimension,
            corpus_checksum=corpus_checksum,
            directory=directory,
        )
        try:
            index = faiss.read_index(str(directory / INDEX_FILE))
        except RuntimeError as exc:
            raise IndexMismatchError(f"cannot read {directory / INDEX_FILE}: {exc}") from exc
        passages = list(read_passages(directory / PASSAGES_FILE))
        placed = place_index(
            index, manifest.index_type, IndexPlacement(device, max_gpu_bytes), gpus
        )
        # Filtered searches run on the CPU index (faiss-gpu and torch take no ID selector): it is
        # kept beside a GPU copy, at the cost of its size in host memory.
        cpu_copy = index if placed.search.backend != "faiss-cpu" else None
        loaded = cls(manifest, placed.search, passages, cpu_copy)
        log = logger.warning if placed.reason and device not in ("auto", "cpu") else logger.info
        log(
            "index loaded dir=%s passages=%d kind=%s device=%s backend=%s asked=%s why=%s",
            directory,
            len(loaded),
            manifest.index_type,
            loaded.device,
            loaded.search_backend,
            device,
            placed.reason or "as asked",
        )
        return loaded


def check_manifest(
    manifest: IndexManifest,
    *,
    embedder: str,
    dimension: int,
    corpus_checksum: str | None,
    directory: Path,
) -> None:
    problems = []
    if manifest.format_version < FORMAT_VERSION:
        problems.append(
            f"format version {manifest.format_version} is older than this service's "
            f"{FORMAT_VERSION}: rebuild it (`answer-service index build --force`; its sentences "
            "and their vectors are not what this service's quotes are scored on)"
        )
    elif manifest.format_version > FORMAT_VERSION:
        problems.append(
            f"format version {manifest.format_version} is newer than this service's "
            f"{FORMAT_VERSION}"
        )
    if manifest.embedder != embedder:
        problems.append(f"built with embedder {manifest.embedder!r}, service uses {embedder!r}")
    if manifest.dimension != dimension:
        problems.append(f"dimension {manifest.dimension}, embedder gives {dimension}")
    if corpus_checksum is not None and manifest.corpus_checksum != corpus_checksum:
        problems.append(
            f"built from corpus {manifest.corpus_checksum}, this corpus is {corpus_checksum}"
        )
    if problems:
        raise IndexMismatchError(
            f"index at {directory} does not match: "
            + "; ".join(problems)
            + f". Rebuild it: `answer-service index build CORPUS.jsonl --out {directory}`."
        )


_PASSAGE_DEFAULTS = {
    name: field.default
    for name, field in Passage.__dataclass_fields__.items()
    if field.default is not MISSING
}


def passage_to_json(passage: Passage) -> str:
    """One line of `passages.jsonl`; optional fields at their default are left out, so a JSONL
    corpus's passages are written as they were before sections existed."""
    record = {
        key: value
        for key, value in asdict(passage).items()
        if key not in _PASSAGE_DEFAULTS or value != _PASSAGE_DEFAULTS[key]
    }
    return json.dumps(record, ensure_ascii=False)


def read_passages(path: Path) -> Iterable[Passage]:
    """Passages of an index of any format version (fields added later are optional)."""
    with path.open("r", encoding="utf-8") as lines:
        for line in lines:
            record = json.loads(line)
            for key in ("heading_path", "tags"):
                if key in record:
                    record[key] = tuple(record[key])
            yield Passage(**record)
