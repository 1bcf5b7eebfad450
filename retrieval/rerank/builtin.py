"""The builtin passage reranker: the sentence reader's kind of model, reading whole passages.

No cross-encoder can be downloaded everywhere, so the one the service ships is the embedder's
own packaged MiniLM encoder with low-rank adapters, its layer norms and a one-logit head over
the mean of the (query, passage) pair's token states: `reranker.npz` beside this module, about
a megabyte, in the sentence reader's adapter format (retrieval/sentences/reader_adapter.py).
It is learned by `answer-service reranker train --builtin` (rerank/builtin_training.py) on
SQuAD train questions and SciFact's training claims, with hard negatives from the hybrid
retriever. At load the adapters are merged into the encoder, which runs as the reader does:
ONNX Runtime int8 on a CPU, torch (bf16 where native) on a GPU, so a request costs one plain
encoder pass per candidate. A candidate's score is the model's logit less `rank_prior` x
ln(1 + its retrieval rank): a model trained on a few thousand questions on two cores ranks
worse than hybrid retrieval alone, and better joined with it; the weight is chosen by the
trainer on its development queries and kept in the adapter's metadata.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from importlib import resources
from pathlib import Path

import numpy as np
import numpy.typing as npt

from retrieval.embedder import DEFAULT_EMBEDDER, passage_embedding_text
from retrieval.errors import RetrievalError
from retrieval.passage import ScoredPassage
from retrieval.rerank.base import RerankerConfig, RerankRequest
from retrieval.sentences.reader import ReaderConfig, SentenceReader

logger = logging.getLogger(__name__)

BUILTIN = "builtin"
ADAPTER_FILE = "reranker.npz"


def shipped_adapter() -> Path:
    """The package's adapter file."""
    return Path(str(resources.files("retrieval.rerank").joinpath(ADAPTER_FILE)))


def with_rank_prior(logits: npt.NDArray[np.float64], rank_prior: float) -> npt.NDArray[np.float64]:
    """Scores of candidates in retrieval order: logit - rank_prior x ln(1 + rank)."""
    out: npt.NDArray[np.float64] = logits - rank_prior * np.log1p(np.arange(len(logits)))
    return out


class BuiltinReranker:
    """Cheap to build; `warm_up()` merges the adapter and loads the encoder."""

    def __init__(
        self,
        config: RerankerConfig,
        adapter: Path | None = None,
        embedder_model: str = DEFAULT_EMBEDDER,
    ) -> None:
        self._adapter = adapter or config.adapter or shipped_adapter()
        self._pairs = SentenceReader(
            ReaderConfig(
                adapter=self._adapter,
                device=config.device,
                dtype=config.dtype,
                batch_size=config.batch_size,
                cache_dir=config.cache_dir,
            ),
            embedder_model,
            what="builtin reranker",
            learn_with="answer-service reranker train --builtin",
        )

    @property
    def name(self) -> str:
        return BUILTIN

    @property
    def rank_prior(self) -> float:
        meta = self._pairs.meta
        return meta.rank_prior if meta is not None else 0.0

    def warm_up(self) -> None:
        if not self._adapter.is_file():
            raise RetrievalError(f"the builtin reranker's adapter {self._adapter} is not there")
        self._pairs.warm_up()

    def logits(self, query: str, candidates: Sequence[ScoredPassage]) -> npt.NDArray[np.float64]:
        """The model's score of each candidate alone (blocking)."""
        texts = [(passage_embedding_text(c.passage), "") for c in candidates]
        return self._pairs.scores(query, texts)

    def rerank(self, request: RerankRequest) -> list[ScoredPassage]:
        """The `top_n` candidates (given in retrieval order) by the model's score of (query,
        heading and passage text), less the rank prior."""
        candidates = request.candidates
        if not candidates:
            return []
        scores = with_rank_prior(self.logits(request.query, candidates), self.rank_prior)
        order = sorted(range(len(candidates)), key=lambda i: (-float(scores[i]), i))
        return [
            ScoredPassage(candidates[i].passage, float(scores[i])) for i in order[: request.top_n]
        ]
