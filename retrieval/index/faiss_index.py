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
from retrieval.index.vector_search import FaissSearch, VectorSearch
from retrieval.passage import Passage, ScoredPassage

logger = logging.getLogger(__name__)

# 3: the passages' sentences and their vectors are stored with the index (sentences/).
FORMAT_VERSION = 3
MANIFEST_FILE = "manifest.json"
INDEX_FILE = "index.faiss"
PASSAGES_FILE = "passages.jsonl"


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
    ) -> None:
        """`index`: a `VectorSearch`, or a faiss CPU index (searched as it is)."""
        search = index if isinstance(index, VectorSearch) else FaissSearch(index)
        if search.ntotal != len(passages) or manifest.passage_count != len(passages):
            raise IndexMismatchError(
                f"index holds {search.ntotal} vectors and {len(passages)} passages, "
                f"manifest says {manifest.passage_count}"
            )
        self.manifest = manifest
        self._index = search
        self._passages = list(passages)
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
        self, queries: Vectors, k: int, depth: SearchDepth | None = None
    ) -> list[list[tuple[int, float]]]:
        """(row, score) pairs per query, best first; row i is `passage(i)`."""
        if queries.ndim != 2 or queries.shape[1] != self.manifest.dimension:
            raise RetrievalError(
                f"query vectors of shape {queries.shape} do not fit dimension "
                f"{self.manifest.dimension}"
            )
        k = min(k, len(self._passages))
        if k <= 0:
            return [[] for _ in range(queries.shape[0])]
        params = search_parameters(self.manifest.index_type, depth)
        scores, rows = self._index.search(
            np.ascontiguousarray(queries, dtype=np.float32), k, params
        )
        return [
            [(int(row), float(score)) for score, row in zip(s_row, r_row, strict=True) if row >= 0]
            for s_row, r_row in zip(scores, rows, strict=True)
        ]

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
        loaded = cls(manifest, placed.search, passages)
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
            f"{FORMAT_VERSION} (it lacks the sentences and their vectors that quoted answers "
            "need)"
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
            if "heading_path" in record:
                record["heading_path"] = tuple(record["heading_path"])
            yield Passage(**record)
