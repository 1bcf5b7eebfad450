"""Builds the reranker a `RerankerConfig` names (base.py holds the protocol; the
implementations import it, so the choice among them lives here)."""

from __future__ import annotations

import logging

from retrieval.errors import RetrievalError
from retrieval.index.loaded import LoadedIndex
from retrieval.rerank.base import Reranker, RerankerConfig
from retrieval.rerank.builtin import BUILTIN, BuiltinReranker
from retrieval.rerank.cross_encoder import CrossEncoderReranker
from retrieval.rerank.sentence import PassageMix, SentenceReranker
from retrieval.sentences.scorer import ScorerWeights

logger = logging.getLogger(__name__)


def build_reranker(config: RerankerConfig, index: LoadedIndex | None = None) -> Reranker:
    """The reranker `config` names, not yet warmed up (the sentence reranker reads `index`'s
    sentences)."""
    if config.kind == "sentence":
        if index is None:
            raise RetrievalError("the sentence reranker needs the index it reranks")
        return SentenceReranker(index, ScorerWeights.read(config.scorer_file), PassageMix.read())
    if config.kind == "cross_encoder" and config.model == BUILTIN:
        return BuiltinReranker(config)
    if config.kind == "cross_encoder":
        if config.model is None:
            raise RetrievalError("a cross-encoder reranker needs a model")
        return CrossEncoderReranker(config.model, config)
    raise RetrievalError(f"unknown reranker kind {config.kind!r}")


def load_reranker(config: RerankerConfig, index: LoadedIndex | None = None) -> Reranker | None:
    """A warmed-up reranker, or None (said once, with the reason) when none can be loaded."""
    if config.model is None and config.kind == "cross_encoder":
        logger.info("reranker disabled by configuration")
        return None
    try:
        reranker = build_reranker(config, index)
        reranker.warm_up()
    except RetrievalError as exc:
        logger.warning("reranker unavailable, answering without the rerank stage: %s", exc)
        return None
    return reranker
