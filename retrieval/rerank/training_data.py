"""What reranker training is given and mines (training.py runs it, builtin_training.py trains
the builtin reranker on it; both import this, so neither imports the other)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from retrieval.embedder import DEFAULT_EMBEDDER
from retrieval.passage import ScoredPassage

Candidates = Mapping[str, Sequence[ScoredPassage]]
"""Query id to its retrieved passages, best first."""


@dataclass(frozen=True, slots=True)
class Judgment:
    query_id: str
    query: str
    relevant_doc_ids: frozenset[str]
    # Strings that answer it, where known: a passage holding one is never a negative.
    answers: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Source:
    """Judgments over the index their documents are in."""

    index_dir: Path
    judgments: tuple[Judgment, ...]


@dataclass(frozen=True, slots=True)
class TrainingConfig:
    # Sized for under 10 minutes on two quiet CPU cores over SciFact's 647 training claims.
    # A training step costs about twice as much at 256 tokens as at 192; the reranker is
    # measured (and served) at RerankerConfig's max_tokens all the same.
    epochs: int = 1
    batch_size: int = 16
    learning_rate: float = 5e-5
    warmup_fraction: float = 0.1
    negatives_per_query: int = 5
    max_tokens: int = 192
    candidates: int = 20
    held_out_fraction: float = 0.2
    dev_fraction: float = 0.1
    seed: int = 12
    # Caps per source: training (and dev) queries, in a hashed order spread over the file;
    # held-out queries measured.
    max_train_queries: int | None = None
    max_held_out_queries: int | None = None
    base_model: str = DEFAULT_EMBEDDER
    # auto: bf16 autocast on CUDA and CPUs with native bf16, like the service's reranker.
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    # The builtin reranker's adapter (builtin_training.py) instead of full fine-tuning: its
    # rank, scale, the first layer that carries adapters and its learning rate.
    builtin: bool = False
    rank: int = 16
    alpha: float = 32.0
    first_layer: int = 2
    adapter_learning_rate: float = 5e-4
    # An adapter file to start from (None: a fresh one).
    start_from: Path | None = None

    def __post_init__(self) -> None:
        if not 0.0 <= self.held_out_fraction < 1.0 or not 0.0 <= self.dev_fraction < 1.0:
            raise ValueError("held_out_fraction and dev_fraction must be in [0, 1)")
        if self.epochs < 1 or self.batch_size < 1 or self.candidates < 1:
            raise ValueError("epochs, batch_size and candidates must be positive")


@dataclass(frozen=True, slots=True)
class MinedExample:
    """One training query's passages (as the text the reranker scores)."""

    query: str
    positives: tuple[str, ...]
    negatives: tuple[str, ...]
