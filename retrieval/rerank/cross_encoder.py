"""Cross-encoder reranking: scores (query, passage) pairs jointly, the costliest retrieval knob.

Any sentence-transformers `CrossEncoder` loads by hub id or local folder. Where none can be
loaded (no hub, no local model), `load_reranker` (rerank/factory.py) says so once and returns None,
and the service plans without the stage.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from retrieval.embedder import passage_embedding_text, pick_device, pick_dtype
from retrieval.errors import RetrievalError
from retrieval.passage import ScoredPassage
from retrieval.rerank.base import RerankerConfig, RerankRequest

logger = logging.getLogger(__name__)


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

    def rerank(self, request: RerankRequest) -> list[ScoredPassage]:
        """The `top_n` candidates by cross-encoder score (passages truncated to max_tokens)."""
        query, candidates, top_n = request.query, request.candidates, request.top_n
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
