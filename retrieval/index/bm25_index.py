"""A BM25 index (bm25s) over the same passages as the faiss index: row i is passage i.

Directory layout: `<index dir>/bm25/` holds `bm25_manifest.json` (the `BM25Config` that built
it, the document count, the format version) beside bm25s's own files (the sparse matrix of
precomputed term scores, the vocabulary, bm25s's params). Loading rebuilds the same analyzer
from the manifest, so queries are tokenized exactly as the documents were, and refuses an
index whose document count differs from the passages in use.

Analysis: lowercase, split on `TOKEN_PATTERN` (words of two or more word characters), drop
stopwords, stem. The same for documents and queries.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import bm25s  # type: ignore[import-untyped]
import numpy as np
import numpy.typing as npt
import Stemmer  # type: ignore[import-not-found]

from retrieval.errors import IndexMismatchError, IndexNotFoundError

logger = logging.getLogger(__name__)

FORMAT_VERSION = 1
BM25_DIR = "bm25"
MANIFEST_FILE = "bm25_manifest.json"
TOKEN_PATTERN = r"(?u)\b\w\w+\b"
_IDF_CACHE_WORDS = 50_000

Stopwords = Literal["en"]


@dataclass(frozen=True, slots=True)
class BM25Config:
    """How documents are scored and tokenized.

    k1 = 0.9, b = 0.4 are Anserini's BEIR settings (on SciFact's train claims bm25s's own
    1.5, 0.75 score the same within 0.002 nDCG@10). English stemming is worth having there:
    nDCG@10 0.695 against 0.663 without. `stemmer_language` is a Snowball algorithm name
    (PyStemmer's `Stemmer.algorithms()`), or None for no stemming.
    """

    k1: float = 0.9
    b: float = 0.4
    stemmer_language: str | None = "english"
    stopwords: Stopwords | None = "en"

    def __post_init__(self) -> None:
        if not self.k1 >= 0.0:
            raise ValueError("k1 must be non-negative")
        if not 0.0 <= self.b <= 1.0:
            raise ValueError("b must be in [0, 1]")
        if self.stopwords not in ("en", None):
            raise ValueError(f"unknown stopwords {self.stopwords!r}; use 'en' or None")
        known = Stemmer.algorithms()
        if self.stemmer_language is not None and self.stemmer_language not in known:
            raise ValueError(f"unknown stemmer language {self.stemmer_language!r}")


@dataclass(frozen=True, slots=True)
class BM25Manifest:
    config: BM25Config
    document_count: int
    format_version: int = FORMAT_VERSION

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> BM25Manifest:
        raw: dict[str, Any] = json.loads(text)
        return cls(
            config=BM25Config(**raw["config"]),
            document_count=int(raw["document_count"]),
            format_version=int(raw["format_version"]),
        )


class _Analyzer:
    """Text to terms, the same way for documents and queries."""

    def __init__(self, config: BM25Config) -> None:
        self._stopwords = config.stopwords
        language = config.stemmer_language
        self._stemmer = None if language is None else Stemmer.Stemmer(language)
        # A PyStemmer instance has internal state and must not be called concurrently.
        self._lock = threading.Lock()

    def _tokenize(self, texts: list[str], *, return_ids: bool) -> Any:
        with self._lock:
            return bm25s.tokenize(
                texts,
                token_pattern=TOKEN_PATTERN,
                stopwords=self._stopwords,
                stemmer=self._stemmer,
                return_ids=return_ids,
                show_progress=False,
            )

    def corpus(self, texts: Sequence[str]) -> Any:
        """bm25s's `Tokenized` (term ids per document and the vocabulary), for indexing."""
        return self._tokenize(list(texts), return_ids=True)

    def query(self, text: str) -> list[str]:
        terms: list[str] = self._tokenize([text], return_ids=False)[0]
        return terms


def _top_k(scores: npt.NDArray[np.float32], k: int) -> list[tuple[int, float]]:
    """Rows with a positive score, best first, equal scores in row order."""
    rows = np.flatnonzero(scores > 0.0)
    if rows.size > k:
        threshold = np.partition(scores[rows], rows.size - k)[rows.size - k]
        rows = rows[scores[rows] >= threshold]
    order = np.lexsort((rows, -scores[rows]))[:k]
    return [(int(rows[i]), float(scores[rows[i]])) for i in order]


class BM25Index:
    """Lexical search over passages; `search` is blocking and thread-safe for readers.

    Scoring reads the precomputed sparse matrix and writes only arrays of its own; the one
    shared mutable object, the stemmer, sits behind a lock held while a query is tokenized.
    """

    def __init__(self, retriever: Any, config: BM25Config, document_count: int) -> None:
        indexed = int(retriever.scores["num_docs"])
        if indexed != document_count:
            raise IndexMismatchError(
                f"BM25 matrix holds {indexed} documents, manifest says {document_count}"
            )
        self.config = config
        self._retriever = retriever
        self._analyzer = _Analyzer(config)
        self._document_count = document_count
        self._idf: dict[str, float | None] = {}

    def __len__(self) -> int:
        return self._document_count

    @classmethod
    def build(cls, texts: Sequence[str], config: BM25Config) -> BM25Index:
        """Index `texts` (one per passage, in row order: title, newline, text)."""
        if not texts:
            raise ValueError("a BM25 index needs at least one document")
        started_s = time.perf_counter()
        retriever = bm25s.BM25(k1=config.k1, b=config.b, method="lucene", backend="numpy")
        retriever.index(
            _Analyzer(config).corpus(texts), create_empty_token=False, show_progress=False
        )
        index = cls(retriever, config, len(texts))
        logger.info(
            "bm25 index built documents=%d terms=%d seconds=%.2f",
            len(texts),
            len(retriever.vocab_dict),
            time.perf_counter() - started_s,
        )
        return index

    def search(
        self, query: str, k: int, allowed: npt.NDArray[np.bool_] | None = None
    ) -> list[tuple[int, float]]:
        """Up to `k` (row, score) pairs, best first; rows sharing no term with the query are
        left out, so a query of only stopwords or unknown words gives an empty list.

        `allowed`: a mask over the rows; the others score 0 before the top `k` is taken, so a
        filtered search gives the best `k` of the allowed rows (bm25s scores every row of the
        matrix anyway: the mask costs one pass over the scores)."""
        if k <= 0:
            return []
        if allowed is not None and allowed.shape != (self._document_count,):
            raise ValueError(f"a mask of {allowed.shape} for {self._document_count} documents")
        term_ids = self._retriever.get_tokens_ids(self._analyzer.query(query))
        if not term_ids:
            return []
        scores = np.asarray(self._retriever.get_scores_from_ids(term_ids), dtype=np.float32)
        if allowed is not None:
            scores = np.where(allowed, scores, np.float32(0.0))
        return _top_k(scores, k)

    def idf(self, word: str) -> float | None:
        """The inverse document frequency of `word` as the index analyzes it (stemmed), summed
        over its terms; None for a stopword or a word no passage holds. Reads the matrix only."""
        if word in self._idf:
            return self._idf[word]
        term_ids = self._retriever.get_tokens_ids(self._analyzer.query(word))
        if not term_ids:
            return self._remember(word, None)
        indptr = self._retriever.scores["indptr"]
        total = 0.0
        for term in term_ids:
            frequency = int(indptr[term + 1] - indptr[term])
            # Lucene's BM25 idf, as the scores were computed with (method="lucene").
            total += math.log(1.0 + (self._document_count - frequency + 0.5) / (frequency + 0.5))
        return self._remember(word, total)

    def _remember(self, word: str, idf: float | None) -> float | None:
        """Words already weighed (tokenizing one costs ~50 us); bounded by starting over."""
        if len(self._idf) >= _IDF_CACHE_WORDS:
            self._idf.clear()
        self._idf[word] = idf
        return idf

    def save(self, directory: Path) -> None:
        """Write to `directory / "bm25"`, replacing what was there only once all is written."""
        target = directory / BM25_DIR
        staging = directory / f".{BM25_DIR}.building-{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        try:
            self._retriever.save(str(staging), show_progress=False)
            manifest = BM25Manifest(self.config, self._document_count)
            (staging / MANIFEST_FILE).write_text(manifest.to_json(), encoding="utf-8")
            _replace(staging, target)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        logger.info("bm25 index saved dir=%s documents=%d", target, self._document_count)

    @classmethod
    def load(cls, directory: Path, passage_count: int) -> BM25Index:
        """Load `directory / "bm25"`, refusing one built over a different number of passages."""
        path = directory / BM25_DIR
        manifest = read_bm25_manifest(path)
        problems = []
        if manifest.format_version != FORMAT_VERSION:
            problems.append(f"format version {manifest.format_version}, expected {FORMAT_VERSION}")
        if manifest.document_count != passage_count:
            problems.append(
                f"built over {manifest.document_count} documents, the index has "
                f"{passage_count} passages"
            )
        if problems:
            raise IndexMismatchError(
                f"BM25 index at {path} does not match: " + "; ".join(problems) + ". Rebuild it."
            )
        try:
            retriever = bm25s.BM25.load(str(path), mmap=False, show_progress=False)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise IndexMismatchError(f"cannot read the BM25 index at {path}: {exc}") from exc
        index = cls(retriever, manifest.config, manifest.document_count)
        logger.info("bm25 index loaded dir=%s documents=%d", path, len(index))
        return index


def read_bm25_manifest(path: Path) -> BM25Manifest:
    manifest_path = path / MANIFEST_FILE
    if not manifest_path.is_file():
        raise IndexNotFoundError(
            f"no BM25 index at {path} (missing {MANIFEST_FILE}); "
            "build one with `BM25Index.build(...).save(index_dir)`"
        )
    try:
        return BM25Manifest.from_json(manifest_path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise IndexMismatchError(f"unreadable BM25 manifest {manifest_path}: {exc}") from exc


def _replace(staging: Path, target: Path) -> None:
    if not target.exists():
        staging.rename(target)
        return
    previous = target.with_name(f".{target.name}.old-{os.getpid()}")
    shutil.rmtree(previous, ignore_errors=True)
    target.rename(previous)
    staging.rename(target)
    shutil.rmtree(previous, ignore_errors=True)
