"""A deterministic bag-of-words embedder honouring the `Embedder` protocol (no model weights)."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence

import numpy as np

from retrieval.embedder import Vectors


class HashEmbedder:
    def __init__(self, dimension: int = 64, name: str = "test/hash-embedder") -> None:
        self._dimension = dimension
        self._name = name

    @property
    def name(self) -> str:
        return self._name

    @property
    def dimension(self) -> int:
        return self._dimension

    def warm_up(self) -> None:
        pass

    def token_spans(self, text: str) -> Sequence[tuple[int, int]]:
        # Words and each punctuation mark, as a real tokenizer's offsets cover them: a
        # passage's text ends with its sentence's mark.
        return [match.span() for match in re.finditer(r"\w+|[^\w\s]", text)]

    def encode(self, texts: Sequence[str], *, batch_size: int = 32) -> Vectors:
        return self._bags(texts)

    def encode_with_spans(
        self,
        texts: Sequence[str],
        spans: Sequence[Sequence[tuple[int, int]]],
        *,
        batch_size: int = 32,
    ) -> tuple[Vectors, list[Vectors]]:
        # A bag of words has no context: a span's vector is its own text's.
        pooled = [
            self._bags([text[start:end] for start, end in found])
            for text, found in zip(texts, spans, strict=True)
        ]
        return self.encode(texts, batch_size=batch_size), pooled

    def _bags(self, texts: Sequence[str]) -> Vectors:
        vectors = np.zeros((len(texts), self._dimension), dtype=np.float32)
        for row, text in enumerate(texts):
            for word in re.findall(r"\w+", text.lower()):
                bucket = int(hashlib.md5(word.encode()).hexdigest(), 16) % self._dimension
                vectors[row, bucket] += 1.0
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        return vectors / np.maximum(norms, 1e-9)
