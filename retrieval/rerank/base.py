"""Reranking: reorders a search's candidates for a query. One protocol; the implementation is
chosen by `RerankerConfig.kind` in `build_reranker` (rerank/factory.py) and handed to the retriever whole.

    builtin         the packaged MiniLM with the shipped adapters, a cross-encoder learned
                    here (rerank/builtin.py): the model `builtin` names it
    cross_encoder   a sentence-transformers CrossEncoder by hub id or folder (scores each
                    (query, passage) pair jointly: the costliest retrieval knob)
    sentence        the sentence scorer's best sentences per passage, mixed with the retrieved
                    order (stored vectors, no model: milliseconds; rerank/sentence.py)
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

from retrieval.embedder import Vectors
from retrieval.passage import ScoredPassage

logger = logging.getLogger(__name__)

# The builtin reranker (rerank/builtin.py); a hub id or folder names a CrossEncoder instead.
DEFAULT_RERANKER = "builtin"
RerankerKind = Literal["cross_encoder", "sentence"]


@dataclass(frozen=True, slots=True)
class RerankRequest:
    query: str
    candidates: Sequence[ScoredPassage]
    top_n: int
    # The query's embedding where the search had one (a reranker may use it).
    vector: Vectors | None = None


class Reranker(Protocol):
    """Blocking; `warm_up()` loads what it needs (cheap to construct)."""

    @property
    def name(self) -> str: ...

    def warm_up(self) -> None: ...

    def rerank(self, request: RerankRequest) -> list[ScoredPassage]: ...


@dataclass(frozen=True, slots=True)
class RerankerConfig:
    kind: RerankerKind = "cross_encoder"
    model: str | None = DEFAULT_RERANKER
    device: str = "auto"  # auto, cpu, cuda or cuda:N
    # bf16 ranked like fp32 (rank correlation 0.9998) and 2.6x faster on CPUs with native bf16.
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    max_tokens: int = 256
    batch_size: int = 32
    # The sentence reranker's scorer weights (default: the package's).
    scorer_file: Path | None = None
    # The builtin reranker's adapter file (default: the package's) and where ONNX Runtime's
    # export of it is kept.
    adapter: Path | None = None
    cache_dir: Path = Path.home() / ".cache" / "answer-service"
