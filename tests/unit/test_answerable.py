"""The answerable model abstention reads: its features from a question's ranked sentences, a
fit that separates what it is shown, and the weights file it ships in."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from retrieval.errors import RetrievalError
from retrieval.passage import Passage
from retrieval.sentences.answerable import (
    ANSWERABLE_FEATURES,
    AnswerableModel,
    answerable_features,
    fit_answerable,
)
from retrieval.sentences.scorer import FEATURES, Candidate, ScoredSentence
from retrieval.sentences.store import SentenceRef


def _sentence(probability: float, whole: bool = True, cover: float = 0.5) -> ScoredSentence:
    passage = Passage("d#0", "d", 0, "T", "Mount Etna is in Sicily.", 0, 24)
    ref = SentenceRef(0, row=0, start=0, end=24, position=0, whole=whole, kind="prose")
    features = np.zeros(len(FEATURES))
    features[0] = 1.0
    features[FEATURES.index("cover")] = cover
    return ScoredSentence(Candidate(ref, passage, 0), probability, features)


def test_the_features_read_the_best_quotable_sentences() -> None:
    ranked = [_sentence(0.9, whole=False), _sentence(0.6, cover=0.75), _sentence(0.2)]
    row = answerable_features(ranked)
    named = dict(zip(ANSWERABLE_FEATURES, row, strict=True))
    assert named["bias"] == 1.0
    assert named["best"] == pytest.approx(0.6)  # the fragment is skipped
    assert named["margin"] == pytest.approx(0.4)
    assert named["second"] == pytest.approx(0.2)
    assert named["third"] == 0.0
    assert named["best_cover"] == pytest.approx(0.75)
    empty = answerable_features([])
    assert empty[0] == 1.0
    assert empty[2] == 0.0


def test_a_fit_separates_what_it_is_shown() -> None:
    rng = np.random.default_rng(0)
    rows = np.zeros((400, len(ANSWERABLE_FEATURES)))
    rows[:, 0] = 1.0
    rows[:, 2] = rng.uniform(0, 1, 400)  # "best": the signal
    rows[:, 3] = rng.uniform(0, 1, 400)  # noise
    labels = (rows[:, 2] > 0.5).astype(float)
    weights, mean, scale = fit_answerable(rows, labels, l2=0.1)
    model = AnswerableModel(weights, mean, scale, threshold=0.5)
    weak, strong = [_sentence(0.1)], [_sentence(0.95)]
    assert model.probability(weak) < 0.2 < 0.8 < model.probability(strong)
    predicted = model.probabilities(rows) >= 0.5
    assert (predicted == labels.astype(bool)).mean() > 0.95


def test_the_shipped_model_is_read_and_a_file_without_one_falls_back(tmp_path: Path) -> None:
    shipped = AnswerableModel.read()
    assert shipped is not None
    assert 0.0 < shipped.threshold < 1.0
    older = tmp_path / "scorer.json"
    older.write_text(json.dumps({"features": [], "quote": {}}))
    assert AnswerableModel.read(older) is None
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"answerable": {**shipped.to_json(), "features": ["bias"]}}))
    with pytest.raises(RetrievalError, match="features"):
        AnswerableModel.read(other)
