"""The sentence scorer's mechanics on a real index of the builders' documents: one feature row
per sentence of the retrieved passages, probabilities in (0, 1) that follow the ranking score,
the answering sentence first for a plain question, and the shipped weights readable."""

from __future__ import annotations

import numpy as np
import pytest

from retrieval.index.loaded import LoadedIndex
from retrieval.sentences.scorer import (
    FEATURES,
    ScorerWeights,
    SentenceScorer,
    candidates,
    feature_matrix,
)
from tests.builders import make_index
from tests.fakes.hash_embedder import HashEmbedder


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> LoadedIndex:
    directory = make_index(tmp_path_factory.mktemp("scorer"))
    embedder = HashEmbedder()
    return LoadedIndex.open(directory, embedder=embedder.name, dimension=embedder.dimension)


def _rows(index: LoadedIndex) -> list[tuple[int, object]]:
    return [(row, index.passage(row)) for row in range(len(index))]


def test_one_row_of_features_per_sentence(index: LoadedIndex) -> None:
    found = candidates(index.sentences, _rows(index))  # type: ignore[arg-type]
    vector = HashEmbedder().encode(["Where is Mount Etna?"])
    matrix = feature_matrix("Where is Mount Etna?", vector, found, index.sentences)
    assert matrix.shape == (len(found), len(FEATURES))
    assert np.isfinite(matrix).all()
    assert (matrix[:, FEATURES.index("bias")] == 1.0).all()


def test_the_shipped_scorer_puts_the_answer_first(index: LoadedIndex) -> None:
    weights = ScorerWeights.read()
    scorer = SentenceScorer(index.sentences, weights)
    question = "Where is Mount Etna?"
    ranked = scorer.score(question, HashEmbedder().encode([question]), _rows(index))  # type: ignore[arg-type]
    assert "Mount Etna" in ranked[0].candidate.text
    probabilities = [s.probability for s in ranked]
    assert all(0.0 < p < 1.0 for p in probabilities)
    assert probabilities == sorted(probabilities, reverse=True)


def test_weights_for_other_features_are_refused() -> None:
    with pytest.raises(ValueError, match="features"):
        ScorerWeights(("bias",), (1.0,), (0.0,), (1.0,))
