"""A span finder honouring `ShortFinder` (retrieval/sentences/span.py): the first of its
phrases that the sentence holds is the short answer. Deterministic and instant, for tests of
what the pipeline and the API do with a short answer."""

from __future__ import annotations

from collections.abc import Sequence

from retrieval.sentences.span import ShortSpan


class PhraseFinder:
    def __init__(self, phrases: Sequence[str]) -> None:
        self.phrases = tuple(phrases)
        self.asked: list[tuple[str, str]] = []

    def find(self, question: str, sentence: str) -> ShortSpan | None:
        self.asked.append((question, sentence))
        for phrase in self.phrases:
            at = sentence.find(phrase)
            if at >= 0:
                return ShortSpan(phrase, at, at + len(phrase), 0.9)
        return None
