"""Whether the retrieved sentences answer the question at all: the chance that a quote of them
holds the answer, from what the first pass saw (the best sentences' probabilities, the gap
between them, and the best sentence's features).

The sentence scorer ranks a question's sentences against each other; its probability says how
likely the best one is to answer among those retrieved, and on a question the corpus cannot
answer the rest of the same article still looks much like an answer. This model is trained for
that decision: on questions asked as they are and again with their own gold document left out
of the index (`python -m eval.calibrate.sentence_scorer`), its target whether the quote holds a
gold answer. The service says "I do not know" below its calibrated threshold.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from retrieval.errors import RetrievalError
from retrieval.sentences.scorer import (
    FEATURES,
    ScoredSentence,
    best_probabilities,
    weights_file_text,
)

ANSWERABLE_FEATURES = (
    "bias",
    "log_best",
    "best",
    "margin",
    "second",
    "third",
    *(f"best_{name}" for name in FEATURES[1:]),
)


def answerable_features(sentences: Sequence[ScoredSentence]) -> npt.NDArray[np.float64]:
    """One row of `ANSWERABLE_FEATURES` for a question's ranked sentences (best first); all
    zeros past the bias when none can be quoted."""
    best = next((s for s in sentences if s.candidate.ref.whole), None)
    row = np.zeros(len(ANSWERABLE_FEATURES))
    row[0] = 1.0
    if best is None or best.features is None:
        row[1] = math.log(1e-6)
        return row
    first, second, third = best_probabilities(sentences, 3)
    row[1:6] = (math.log(first + 1e-6), first, first - second, second, third)
    row[6:] = best.features[1:]
    return row


@dataclass(frozen=True, slots=True)
class AnswerableModel:
    """A logistic model over standardised `ANSWERABLE_FEATURES` (the bias is not scaled)."""

    weights: tuple[float, ...]
    mean: tuple[float, ...]
    scale: tuple[float, ...]
    # Below this probability the service abstains (chosen with the weights).
    threshold: float

    def __post_init__(self) -> None:
        if not len(self.weights) == len(self.mean) == len(self.scale) == len(ANSWERABLE_FEATURES):
            raise ValueError(f"one weight, mean and scale for each of {ANSWERABLE_FEATURES}")

    def probability(self, sentences: Sequence[ScoredSentence]) -> float:
        return float(self.probabilities(answerable_features(sentences)[None, :])[0])

    def probabilities(self, rows: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        z = ((rows - np.asarray(self.mean)) / np.asarray(self.scale)) @ np.asarray(self.weights)
        return np.asarray(1.0 / (1.0 + np.exp(-np.clip(z, -30.0, 30.0))), dtype=np.float64)

    def to_json(self) -> dict[str, object]:
        return {
            "features": list(ANSWERABLE_FEATURES),
            "weights": list(self.weights),
            "mean": list(self.mean),
            "scale": list(self.scale),
            "threshold": self.threshold,
        }

    @classmethod
    def read(cls, path: Path | None = None) -> AnswerableModel | None:
        """The `answerable` object of a scorer weights file (the package's by default); None
        when the file has none (weights learned before it: abstention then reads the best
        sentence's probability)."""
        try:
            text = weights_file_text(path)
            raw = json.loads(text).get("answerable")
            if raw is None:
                return None
            if tuple(raw["features"]) != ANSWERABLE_FEATURES:
                raise ValueError(f"features {raw['features']}, the model has {ANSWERABLE_FEATURES}")
            return cls(
                tuple(float(w) for w in raw["weights"]),
                tuple(float(m) for m in raw["mean"]),
                tuple(float(s) for s in raw["scale"]),
                float(raw["threshold"]),
            )
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise RetrievalError(f"cannot read the answerable model: {exc}") from exc


def fit_answerable(
    rows: npt.NDArray[np.float64], labels: npt.NDArray[np.float64], l2: float = 1.0
) -> tuple[tuple[float, ...], tuple[float, ...], tuple[float, ...]]:
    """Weights, mean and scale of an L2-regularised logistic regression (Newton's method)."""
    mean, scale = rows.mean(axis=0), rows.std(axis=0)
    mean[0], scale[0] = 0.0, 1.0
    scale[scale == 0] = 1.0
    z = (rows - mean) / scale
    w = np.zeros(z.shape[1])
    penalty = l2 * np.eye(z.shape[1])
    penalty[0, 0] = 0.0
    for _ in range(100):
        p = 1.0 / (1.0 + np.exp(-np.clip(z @ w, -30, 30)))
        gradient = z.T @ (p - labels) + penalty @ w
        hessian = (z * (p * (1 - p))[:, None]).T @ z + penalty + 1e-9 * np.eye(len(w))
        step = np.linalg.solve(hessian, gradient)
        w -= step
        if np.abs(step).max() < 1e-9:
            break
    return tuple(map(float, w)), tuple(map(float, mean)), tuple(map(float, scale))
