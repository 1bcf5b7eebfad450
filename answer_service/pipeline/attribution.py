"""Citations the service attributes itself, not trusted from the model, and the evidence check
that decides whether to answer at all.

Both rest on one lexical measure: the share of a text's content terms (lower-cased words, minus
English stopwords, Snowball-stemmed) that a passage contains.

- A finished answer sentence cites the prompt passages that cover at least `support_threshold`
  of its terms (best first, at most `max_sources`); a sentence that none covers is unsupported.
- A question whose best retrieved passage covers less than `abstain_below` of the question's
  terms is answered "I do not know" without asking the model.

Both thresholds were measured on SQuAD, not guessed: `answer-eval calibrate-citations` (see
eval/calibrate/citations.py and eval/results/citation-thresholds.json).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import Stemmer  # type: ignore[import-not-found]
from bm25s.stopwords import STOPWORDS_EN_PLUS  # type: ignore[import-untyped]

# Measured by `answer-eval calibrate-citations` on SQuAD v1.1 dev (eval/results/
# citation-thresholds.json); the settings ANSWER_CITATION_THRESHOLD / ANSWER_ABSTAIN_BELOW.
SUPPORT_THRESHOLD = 0.63
ABSTAIN_BELOW = 0.5
ABSTENTION = (
    "I do not know: none of the retrieved passages covers this question well enough to answer "
    "it. The closest sources are listed."
)

_WORD = re.compile(r"[a-z0-9]+")
_MARKER = re.compile(r"\[\d{1,3}\]")
_STOPWORDS = frozenset(STOPWORDS_EN_PLUS) | {"also", "answer", "passage", "source"}
_STEMMER = Stemmer.Stemmer("english")
# A sentence ends at . ! or ? (after any closing quotes or brackets) followed by white space,
# or at a line break; not after common abbreviations or a lone initial ("U.S.", "e.g.").
_BOUNDARY = re.compile(r"[.!?][\"')\]]*(?=\s)|\n")
_ABBREVIATION = re.compile(
    r"(?:\b(?:e\.g|i\.e|etc|vs|mr|mrs|dr|st|no|fig|approx)|\b[a-z])\.$", re.I
)


def content_terms(text: str) -> frozenset[str]:
    words = [w for w in _WORD.findall(_MARKER.sub(" ", text).lower()) if w not in _STOPWORDS]
    return frozenset(_STEMMER.stemWords(words))


def coverage(terms: frozenset[str], passage_terms: frozenset[str]) -> float:
    """Share of `terms` the passage holds; 0 for no terms."""
    return len(terms & passage_terms) / len(terms) if terms else 0.0


def evidence(query: str, passages: Sequence[str]) -> float:
    """How well the best passage covers the question's terms (0..1)."""
    terms = content_terms(query)
    return max((coverage(terms, content_terms(p)) for p in passages), default=0.0)


@dataclass(frozen=True, slots=True)
class SentenceSpan:
    index: int
    start: int
    end: int
    text: str


class SentenceSplitter:
    """Splits streamed text into sentences as they finish; offsets index the whole answer."""

    def __init__(self) -> None:
        self._text = ""
        self._start = 0
        self._count = 0

    def feed(self, delta: str) -> list[SentenceSpan]:
        self._text += delta
        done: list[SentenceSpan] = []
        for match in _BOUNDARY.finditer(self._text, self._start):
            end = match.end()
            # A boundary needs the character after it, which may not have streamed yet.
            if end >= len(self._text) and match.group() != "\n":
                break
            if match.group() == "." and _ABBREVIATION.search(self._text[self._start : end]):
                continue
            if sentence := self._take(end):
                done.append(sentence)
        return done

    def finish(self) -> list[SentenceSpan]:
        sentence = self._take(len(self._text))
        return [sentence] if sentence else []

    def _take(self, end: int) -> SentenceSpan | None:
        raw = self._text[self._start : end]
        start = self._start + (len(raw) - len(raw.lstrip()))
        self._start = end
        text = self._text[start:end].rstrip()
        if not text:
            return None
        sentence = SentenceSpan(self._count, start, start + len(text), text)
        self._count += 1
        return sentence


@dataclass(frozen=True, slots=True)
class Citation:
    """Sentence `sentence` (answer[start:end]) and the source numbers that support it."""

    sentence: int
    start: int
    end: int
    sources: tuple[int, ...]
    score: float
    supported: bool


class Attributor:
    def __init__(
        self,
        passages: Sequence[tuple[int, str]],
        *,
        threshold: float = SUPPORT_THRESHOLD,
        max_sources: int = 2,
    ) -> None:
        """`passages`: (source number, text) of each passage the prompt held."""
        self._passages = [(number, content_terms(text)) for number, text in passages]
        self.threshold = threshold
        self.max_sources = max_sources

    def cite(self, sentence: SentenceSpan) -> Citation:
        terms = content_terms(sentence.text)
        scored = sorted(
            ((coverage(terms, p_terms), number) for number, p_terms in self._passages),
            key=lambda pair: (-pair[0], pair[1]),
        )
        best = scored[0][0] if scored else 0.0
        sources = tuple(n for score, n in scored if score >= self.threshold)[: self.max_sources]
        return Citation(
            sentence.index, sentence.start, sentence.end, sources, round(best, 4), bool(sources)
        )


def with_markers(answer: str, citations: Sequence[Citation]) -> str:
    """The answer with ` [n]` after each supported sentence; the model's own markers are
    dropped, since they were not checked."""
    parts, at = [], 0
    for citation in sorted(citations, key=lambda c: c.start):
        parts.append(_MARKER.sub("", answer[at : citation.end]).rstrip())
        parts.append("".join(f" [{n}]" for n in citation.sources))
        at = citation.end
    parts.append(_MARKER.sub("", answer[at:]))
    return "".join(parts)
