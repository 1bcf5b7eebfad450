"""A cheap reranker from the sentence scorer: a passage ranks by its best sentences' scores and
its place in the retrieved order, mixed by weights measured on relevance judgments
(`python -m eval.calibrate.sentence_reranker`). Stored sentence vectors and term statistics: no
model call, a few milliseconds for tens of candidates, where no cross-encoder weights can be had.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np

from retrieval.errors import RetrievalError
from retrieval.index.loaded import LoadedIndex
from retrieval.passage import ScoredPassage
from retrieval.rerank.base import RerankRequest
from retrieval.sentences.scorer import (
    Candidate,
    ScorerWeights,
    SentenceModel,
    candidates,
    feature_matrix,
)


@dataclass(frozen=True, slots=True)
class PassageMix:
    """A passage's score: `best` x its best sentence's score + `second` x its second best +
    `rank` / (1 + its place in the retrieved order)."""

    best: float = 1.0
    second: float = 0.0
    rank: float = 0.0

    @classmethod
    def read(cls, path: Path | None = None) -> PassageMix:
        try:
            text = (
                path.read_text(encoding="utf-8")
                if path is not None
                else resources.files("retrieval.rerank").joinpath("sentence_mix.json").read_text()
            )
            raw = json.loads(text)["mix"]
            return cls(float(raw["best"]), float(raw["second"]), float(raw["rank"]))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise RetrievalError(f"cannot read the sentence reranker's mix: {exc}") from exc


class SentenceReranker:
    def __init__(self, index: LoadedIndex, weights: ScorerWeights, mix: PassageMix) -> None:
        self._index = index
        self._model = SentenceModel(weights)
        self._mix = mix

    @property
    def name(self) -> str:
        return "sentence-scorer"

    def warm_up(self) -> None:
        return None

    def rerank(self, request: RerankRequest) -> list[ScoredPassage]:
        if request.vector is None:
            raise RetrievalError("the sentence reranker needs the query's embedding")
        rows = [(self._index.row_of(c.passage.passage_id), c.passage) for c in request.candidates]
        store = self._index.sentences
        found = candidates(store, rows, self._index.passage)
        scores = (
            self._model.scores(feature_matrix(request.query, request.vector, found, store))
            if found
            else np.zeros(0)
        )
        mixed = passage_scores(found, scores, len(rows), self._mix)
        order = sorted(range(len(rows)), key=lambda i: (-mixed[i], i))
        return [ScoredPassage(rows[i][1], float(mixed[i])) for i in order[: request.top_n]]


def passage_scores(
    found: list[Candidate], scores: np.ndarray, passages: int, mix: PassageMix
) -> list[float]:
    """Each retrieved passage's mixed score (a passage without sentences: its rank part)."""
    by_rank: list[list[float]] = [[] for _ in range(passages)]
    for candidate, score in zip(found, scores, strict=True):
        by_rank[candidate.rank].append(float(score))
    mixed = []
    for rank, own in enumerate(by_rank):
        top = sorted(own, reverse=True)
        best = top[0] if top else 0.0
        second = top[1] if len(top) > 1 else best
        mixed.append(mix.best * best + mix.second * second + mix.rank / (1.0 + rank))
    return mixed
