"""Content terms: lower-cased words minus English stopwords, Snowball-stemmed. The lexical
measure the sentence scorer, the citations and the evidence check share, with document
frequencies counted over an index's passages for IDF weights."""

from __future__ import annotations

import functools
import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping

import Stemmer  # type: ignore[import-not-found]
from bm25s.stopwords import STOPWORDS_EN_PLUS  # type: ignore[import-untyped]

_WORD = re.compile(r"[a-z0-9]+")
_MARKER = re.compile(r"\[\d{1,3}\]")
_STOPWORDS = frozenset(STOPWORDS_EN_PLUS) | {"also", "answer", "passage", "source"}
_STEMMER = Stemmer.Stemmer("english")


# Sentences recur (a popular passage's, on every request that retrieves it; each request
# scores every sentence of its passages): their terms are kept, not found again.
_CACHED_TEXTS = 65_536


@functools.lru_cache(maxsize=_CACHED_TEXTS)
def content_terms(text: str) -> frozenset[str]:
    return frozenset(term_list(text))


@functools.lru_cache(maxsize=_CACHED_TEXTS)
def term_list(text: str) -> tuple[str, ...]:
    """The content terms of `text` in order, repeats kept."""
    words = [w for w in _WORD.findall(_MARKER.sub(" ", text).lower()) if w not in _STOPWORDS]
    return tuple(_STEMMER.stemWords(words))


def coverage(terms: frozenset[str], other: frozenset[str]) -> float:
    """Share of `terms` that `other` holds; 0 for no terms."""
    return len(terms & other) / len(terms) if terms else 0.0


class Idf:
    """Inverse document frequencies of content terms over a collection of texts; a term never
    seen weighs as a term seen once."""

    def __init__(self, documents: int, frequencies: Mapping[str, int]) -> None:
        self.documents = documents
        self.frequencies = dict(frequencies)

    @classmethod
    def count(cls, texts: Iterable[str]) -> Idf:
        frequencies: Counter[str] = Counter()
        documents = 0
        for text in texts:
            documents += 1
            frequencies.update(content_terms(text))
        return cls(documents, frequencies)

    def weight(self, term: str) -> float:
        seen = self.frequencies.get(term, 1)
        return math.log(1.0 + (self.documents - seen + 0.5) / (seen + 0.5))

    def weighted_coverage(self, terms: frozenset[str], other: frozenset[str]) -> float:
        """Share of `terms`' total weight that `other` holds."""
        total = sum(self.weight(t) for t in terms)
        return sum(self.weight(t) for t in terms & other) / total if total else 0.0
