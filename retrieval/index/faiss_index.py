"""A faiss inner-product index of passage vectors, saved to a directory with a manifest.

Directory layout: `manifest.json` (what built it), `index.faiss` (the vectors) and
`passages.jsonl` (row i of the index is line i). Loading checks the three agree with each
other and with the embedder in use, and refuses a mismatch with a clear error.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import faiss
import numpy as np

from retrieval.embedder import Vectors
from retrieval.errors import IndexMismatchError, IndexNotFoundError, RetrievalError
from retrieval.index.ann import (
    IndexKind,
    SearchDepth,
    maybe_to_gpu,
    search_parameters,
)
from retrieval.passage import Passage, ScoredPassage

logger = logging.getLogger(__name__)

FORMAT_VERSION = 2
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
    """Passages and their vectors; `search` is blocking and thread-safe for readers."""

    def __init__(
        self,
        manifest: IndexManifest,
        index: Any,
        passages: Sequence[Passage],
        device: str = "cpu",
    ) -> None:
        if index.ntotal != len(passages) or manifest.passage_count != len(passages):
            raise IndexMismatchError(
                f"index holds {index.ntotal} vectors and {len(passages)} passages, "
                f"manifest says {manifest.passage_count}"
            )
        self.manifest = manifest
        self.device = device
        self._index = index
        self._passages = list(passages)
        self._rows_by_id: dict[str, int] | None = None

    def __len__(self) -> int:
        return len(self._passages)

    def passage(self, row: int) -> Passage:
        return self._passages[row]

    def passage_by_id(self, passage_id: str) -> Passage | None:
        """The passage with this id, if the index holds it (the id map is built on first use:
        only cache-aware adoption asks, see generation/prefix_order.py)."""
        rows = self._rows_by_id
        if rows is None:
            rows = {passage.passage_id: row for row, passage in enumerate(self._passages)}
            self._rows_by_id = rows
        row = rows.get(passage_id)
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
            np.ascontiguousarray(queries, dtype=np.float32), k, params=params
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
        device: Literal["auto", "cpu", "cuda"] = "auto",
    ) -> FaissIndex:
        """Load and check against the embedder in use (and the corpus, when given)."""
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
        index, placed_on = maybe_to_gpu(index, device)
        loaded = cls(manifest, index, passages, placed_on)
        logger.info(
            "index loaded dir=%s passages=%d kind=%s device=%s",
            directory,
            len(loaded),
            manifest.index_type,
            placed_on,
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
    if manifest.format_version != FORMAT_VERSION:
        problems.append(f"format version {manifest.format_version}, expected {FORMAT_VERSION}")
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
            + ". Rebuild it with `answer-service index build`."
        )


def passage_to_json(passage: Passage) -> str:
    return json.dumps(asdict(passage), ensure_ascii=False)


def read_passages(path: Path) -> Iterable[Passage]:
    with path.open("r", encoding="utf-8") as lines:
        for line in lines:
            yield Passage(**json.loads(line))
